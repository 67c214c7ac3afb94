"""Online W8A8 on whole diffusers transformers: MindIE-SD's
`quantize(model, online_config=OnlineQuantConfig())` (every nn.Linear a W8A8_DYNAMIC layer of
its own weights, in memory, no export) against the fp32 model, on the FLUX- and Wan-shaped
transformers of model_speed.py (its builders and --size; random fp32 weights): torch default /
quantized / quantized + ditops.diffusers.enable, one forward at a time, interleaved (A, B, C, A,
B, C, ...), medians; each output's rel-L2 to the fp32 model's, and the time quantize() took.

    PYTHONPATH=build/release/python build/venv/bin/python bench/python/online_quant.py \
        [--model flux|wan|all] [--size full|small] [--runs 3] [--threads 2] [--json FILE]

--json FILE writes the times as Google Benchmark JSON (bench_json.py): rows
online_quant/model:M/config:C, config 0 the fp32 model.
"""

import argparse
import time

import torch

import bench_json
import ditops
import ditops.diffusers
import model_speed
from ditops.mindiesd import OnlineQuantConfig, quantize
from ditops.mindiesd.quantization.mode import QuantAlgorithm


def bench(name, build, title, config, args, results):
    model, inputs = build(size=args.size)
    quantized, _ = build(size=args.size)
    layers = sum(isinstance(m, torch.nn.Linear) for m in quantized.modules())
    start = time.perf_counter()
    quantize(quantized, online_config=config)
    kept = sum(isinstance(m, torch.nn.Linear) for m in quantized.modules())
    print(f"\nquantize(online_config=...): {layers - kept} of {layers} nn.Linear layers "
          f"quantized in {time.perf_counter() - start:.1f} s")
    configs = [
        # diffusers.enable patches diffusers' rotary embedding process-wide: off for the first two.
        ("torch default (fp32)", model, lambda: ditops.diffusers.disable(quantized)),
        ("quantize (online W8A8_DYNAMIC)", quantized,
         lambda: ditops.diffusers.disable(quantized)),
        ("quantize + ditops.diffusers.enable", quantized,
         lambda: ditops.diffusers.enable(quantized)),
    ]
    model_speed.compare(title, configs, inputs, args.runs, results,
                        f"online_quant/model:{name}/")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=["flux", "wan", "all"], default="all")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--size", choices=sorted(model_speed.SIZES), default="full",
                        help="the token counts (small: a quick run at the real widths)")
    parser.add_argument("--json", help="write the times to this file (bench_json.py)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    ditops.set_num_threads(args.threads)
    model_speed._time_ditops_calls()
    info = ditops.cpu_info()
    print(f"torch {torch.__version__}, threads {args.threads}, ditops isa {info['isa']} "
          f"(avx512_vnni {info['avx512_vnni']}, avx512_bf16 {info['avx512_bf16']})")
    results = bench_json.Results("online_quant.py", threads=args.threads, runs=args.runs,
                                 size=args.size)
    with torch.inference_mode():
        if args.model in ("flux", "all"):
            bench("flux", model_speed.flux_shaped, model_speed.flux_title(args.size, "fp32"),
                  OnlineQuantConfig(), args, results)
        if args.model in ("wan", "all"):
            # Wan's condition embedder reads its time embedder's parameters for their dtype,
            # which quantized layers do not have (MindIE-SD's neither): kept in fp32.
            config = OnlineQuantConfig(fallback_layers={"condition_embedder.time_embedder.*":
                                                        QuantAlgorithm.W16A16})
            bench("wan", model_speed.wan_shaped, model_speed.wan_title(args.size, "fp32"),
                  config, args, results)
    results.write(args.json)


if __name__ == "__main__":
    main()
