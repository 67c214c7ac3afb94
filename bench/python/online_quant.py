"""Online W8A8 on whole diffusers transformers: MindIE-SD's
`quantize(model, online_config=OnlineQuantConfig())` (every nn.Linear a W8A8_DYNAMIC layer of
its own weights, in memory, no export) against the fp32 model, on the FLUX- and Wan-shaped
transformers of model_speed.py (its builders; random fp32 weights): torch default / quantized /
quantized + ditops.diffusers.enable, one forward at a time, interleaved (A, B, C, A, B, C, ...),
medians; each output's rel-L2 to the fp32 model's, and the time quantize() took.

    PYTHONPATH=build/release/python build/venv/bin/python bench/python/online_quant.py \
        [--model flux|wan|all] [--runs 3] [--threads 2]
"""

import argparse
import time

import torch

import ditops
import ditops.diffusers
import model_speed
from ditops.mindiesd import OnlineQuantConfig, quantize
from ditops.mindiesd.quantization.mode import QuantAlgorithm


# The shapes model_speed.py times (its titles say them).
FLUX_TITLE = ("FLUX-shaped: hidden 3072, 24 x 128 heads, 4096 image + 512 text tokens, "
              "1 double + 1 single block, fp32")
WAN_TITLE = ("Wan-shaped: hidden 1536, 12 x 128 heads, 1 block, 8 x 30 x 52 latent + 512 text "
             "tokens, fp32")


def bench(build, title, config, args):
    model, inputs = build()
    quantized, _ = build()
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
    model_speed.compare(title, configs, inputs, args.runs)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=["flux", "wan", "all"], default="all")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    ditops.set_num_threads(args.threads)
    model_speed._time_ditops_calls()
    info = ditops.cpu_info()
    print(f"torch {torch.__version__}, threads {args.threads}, ditops isa {info['isa']} "
          f"(avx512_vnni {info['avx512_vnni']}, avx512_bf16 {info['avx512_bf16']})")
    with torch.inference_mode():
        if args.model in ("flux", "all"):
            bench(model_speed.flux_shaped, FLUX_TITLE, OnlineQuantConfig(), args)
        if args.model in ("wan", "all"):
            # Wan's condition embedder reads its time embedder's parameters for their dtype,
            # which quantized layers do not have (MindIE-SD's neither): kept in fp32.
            config = OnlineQuantConfig(fallback_layers={"condition_embedder.time_embedder.*":
                                                        QuantAlgorithm.W16A16})
            bench(model_speed.wan_shaped, WAN_TITLE, config, args)


if __name__ == "__main__":
    main()
