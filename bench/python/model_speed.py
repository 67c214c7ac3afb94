"""Whole diffusers transformers on the CPU: diffusers' default attention against ditops, one
forward at a time, the configurations interleaved (A, B, C, A, B, C, ...) so that drift on a
shared machine hits them alike; medians. Random weights (fp32, or bf16 with --dtype bf16),
torch.inference_mode().

  flux: a FLUX-shaped transformer (hidden 3072, 24 heads x 128, 4096 image + 512 text tokens
        (--size small: 64 + 32), one double- and one single-stream block): default /
        ditops.diffusers.enable (attention, q/k RMSNorm, RoPE) / ditops.diffusers.optimize
        (also every linear on ditops, FLOAT) / optimize(quantize="w8a8_dynamic") / (fp32)
        enable + ditops.quantize (W8A8_DYNAMIC linears from an export tools/ditops-quantize
        made of the model's own weights).
  wan:  a Wan-shaped video transformer (hidden 1536, 12 heads x 128, one block, 8 x 30 x 52
        latent tokens after patching + 512 text tokens (--size small: 1 x 8 x 16 + 32)):
        default / enable (dense) / enable with RainFusion at sparsity 0.75, with and without
        the first frame kept whole / optimize (dense) / optimize(quantize="w8a8_dynamic",
        attention="rainfusion") (and each output's rel-L2 to the default's).

For each configuration, the share of the forward spent inside ditops' calls; the rest is
torch's (its linears, elementwise ops, convolutions). --size small keeps the real widths and
takes few tokens (cache_loop.py's), so that a run takes a minute or two on 2 cores: attention is
then a small share of the forward.

    PYTHONPATH=build/release/python build/venv/bin/python bench/python/model_speed.py \
        [--model flux|wan|all] [--dtype f32|bf16] [--size full|small] [--runs 3] [--threads 2]
        [--tools build/release/tools] [--json FILE]

--json FILE writes the times as Google Benchmark JSON (bench_json.py): rows
model_speed/model:M/dtype:D/config:C, config 0 diffusers' default, the configuration, ditops'
share and the rel-L2 to the default in their labels.
"""

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

import bench_json
import ditops
import ditops.diffusers
import ditops.ops

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "python" / "tests"))
import models  # noqa: E402  (the test suite's model builders)

_ditops_seconds = [0.0]


def _time_ditops_calls():
    """Every ditops call the diffusers integration makes accumulates its wall time into
    _ditops_seconds (attention through ops._attention, torch's mask meaning): each function is
    replaced wherever a loaded ditops module holds it (the package's modules import them from
    one another)."""
    from ditops import rainfusion_v2

    modules = [module for name, module in sys.modules.items()
               if module is not None and (name == "ditops" or name.startswith("ditops."))]
    for original in (ditops.ops._attention, ditops.ops.rms_norm,
                     ditops.ops.rotary_position_embedding, rainfusion_v2.rainfusion_v2_attention):

        def timed(*args, _original=original, **kwargs):
            start = time.perf_counter()
            try:
                return _original(*args, **kwargs)
            finally:
                _ditops_seconds[0] += time.perf_counter() - start

        for module in modules:
            for name, value in list(vars(module).items()):
                if value is original:
                    setattr(module, name, timed)
    from ditops import quant

    original_forward = quant.QuantLinear.forward

    def timed_forward(self, x):
        start = time.perf_counter()
        try:
            return original_forward(self, x)
        finally:
            _ditops_seconds[0] += time.perf_counter() - start

    quant.QuantLinear.forward = timed_forward


# Token counts per --size: FLUX's image height x width and text; Wan's frames x height x width
# before patching (2 x 2) and text.
SIZES = {"full": dict(flux=(64, 64, 512), wan=(8, 60, 104, 512)),
         "small": dict(flux=(8, 8, 32), wan=(1, 16, 32, 32))}


def flux_shaped(dtype=torch.float32, size="full"):
    height, width, text = SIZES[size]["flux"]
    return models.flux(dtype, height=height, width=width, text=text, heads=24, head_dim=128,
                       layers=1, in_channels=64, text_dim=4096, pooled_dim=768)


def wan_shaped(dtype=torch.float32, size="full"):
    frames, height, width, text = SIZES[size]["wan"]
    return models.wan(dtype, frames=frames, height=height, width=width, heads=12, head_dim=128,
                      layers=1, dim_in=16, ffn=8960, text=text, text_dim=4096)


def flux_title(size, dtype):
    height, width, text = SIZES[size]["flux"]
    return (f"FLUX-shaped: hidden 3072, 24 x 128 heads, {height * width} + {text} tokens, "
            f"1 double + 1 single block, {dtype}")


def wan_title(size, dtype):
    frames, height, width, text = SIZES[size]["wan"]
    return (f"Wan-shaped: hidden 1536, 12 x 128 heads, 1 block, {frames} x {height // 2} x "
            f"{width // 2} latent + {text} text tokens, {dtype}")


def export_quantized(model, tools, directory):
    from safetensors.torch import save_file

    weights = Path(directory) / "model.safetensors"
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(weights))
    subprocess.run([str(Path(tools) / "ditops-quantize"), "--weights", str(weights), "--out",
                    str(directory), "--algo", "W8A8_DYNAMIC"], check=True, capture_output=True)
    weights.unlink()
    return Path(directory) / "quant_model_description_w8a8_dynamic.json"


def run(configs, inputs, runs):
    """configs: [(name, model, setup)]; median seconds and ditops share per configuration,
    each configuration's last output, and its seconds per run."""
    seconds = {name: [] for name, _, _ in configs}
    shares = {name: [] for name, _, _ in configs}
    outputs = {}
    for repetition in range(runs + 1):
        for index, (name, model, setup) in enumerate(configs):
            # The first round warms ditops' configurations up (tuning, allocations); the
            # baseline, diffusers' own, tunes nothing, and in bf16 one of its runs takes
            # minutes: its first run is timed.
            if index == 0 and repetition == runs:
                continue
            setup()
            _ditops_seconds[0] = 0.0
            start = time.perf_counter()
            out = model(**inputs)[0]
            elapsed = time.perf_counter() - start
            if repetition or index == 0:
                seconds[name].append(elapsed)
                shares[name].append(_ditops_seconds[0] / elapsed)
            outputs[name] = out
    return ({name: statistics.median(v) for name, v in seconds.items()},
            {name: statistics.median(v) for name, v in shares.items()}, outputs, seconds)


def rel_l2(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def compare(title, configs, inputs, runs, results=None, row=""):
    """Runs the configurations (the first is the baseline) and prints their table: median
    time, speedup, ditops' share and each output's rel-L2 to the baseline's; and adds them to
    `results` (bench_json.Results) as rows `row`config:N, N their index."""
    seconds, shares, outputs, times = run(configs, inputs, runs)
    baseline = configs[0][0]
    print(f"\n{title}")
    print("| configuration | median s | speedup vs default | ditops share | torch share |"
          " rel-L2 to default |")
    print("|---|---:|---:|---:|---:|---:|")
    for index, (name, value) in enumerate(seconds.items()):
        error = None if name == baseline else rel_l2(outputs[name], outputs[baseline])
        print(f"| {name} | {value:.2f} | {seconds[baseline] / value:.2f}x | "
              f"{shares[name]:.0%} | {1 - shares[name]:.0%} | "
              f"{'-' if error is None else f'{error:.1e}'} |")
        if results is not None:
            label = f"{name}; ditops {shares[name]:.0%} of the time"
            if error is not None:
                label += f"; rel-L2 to the default {error:.1e}"
            results.add(f"{row}config:{index}", times[name], unit="s", label=label,
                        counters={"ditops_share": shares[name], "rel_l2": error})


def optimized(build, dtype, size, **options):
    """A model of its own (its packed layers are built once), optimized."""
    model, _ = build(dtype, size)
    ditops.diffusers.optimize(model, **options)
    return model


def bench_flux(args, results):
    dtype = DTYPES[args.dtype]
    model, inputs = flux_shaped(dtype, args.size)
    configs = [("diffusers default", model, lambda: ditops.diffusers.disable(model))]
    if args.dtype == "f32":  # in bf16 enable's time is torch's bf16 linears, as the default's
        configs.append(("ditops.diffusers.enable", model, lambda: ditops.diffusers.enable(model)))
    configs += [
        ("optimize (attention, norms, RoPE, float linears)",
         optimized(flux_shaped, dtype, args.size), lambda: None),
        ("optimize(quantize=\"w8a8_dynamic\")",
         optimized(flux_shaped, dtype, args.size, quantize="w8a8_dynamic"), lambda: None),
    ]
    if args.dtype == "f32":  # the export path (tools/ditops-quantize reads fp32 weights)
        quantized, _ = flux_shaped(size=args.size)
        with tempfile.TemporaryDirectory(dir=args.scratch) as directory:
            description = export_quantized(quantized, args.tools, directory)
            ditops.quantize(quantized, description)
        ditops.diffusers.enable(quantized)
        configs.append(("enable + quantize (W8A8_DYNAMIC export)", quantized, lambda: None))
    compare(flux_title(args.size, args.dtype), configs, inputs, args.runs, results,
            f"model_speed/model:flux/dtype:{args.dtype}/")


def bench_wan(args, results):
    dtype = DTYPES[args.dtype]
    model, inputs = wan_shaped(dtype, args.size)
    configs = [("diffusers default", model, lambda: ditops.diffusers.disable(model))]
    if args.dtype == "f32":  # in bf16 enable's time is torch's bf16 linears, as the default's
        configs += [
            ("enable (dense)", model, lambda: ditops.diffusers.enable(model)),
            ("enable (RainFusion 0.75)", model,
             lambda: ditops.diffusers.enable(model, backend="rainfusion", sparsity=0.75)),
            ("enable (RainFusion 0.75, first frame not kept whole)", model,
             lambda: ditops.diffusers.enable(model, backend="rainfusion", sparsity=0.75,
                                             keep_sink=False)),
        ]
    configs += [
        ("optimize (dense, float linears)", optimized(wan_shaped, dtype, args.size),
         lambda: None),
        ("optimize(quantize=\"w8a8_dynamic\", attention=\"rainfusion\")",
         optimized(wan_shaped, dtype, args.size, quantize="w8a8_dynamic",
                   attention="rainfusion", sparsity=0.75), lambda: None),
    ]
    compare(wan_title(args.size, args.dtype), configs, inputs, args.runs, results,
            f"model_speed/model:wan/dtype:{args.dtype}/")


DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=["flux", "wan", "all"], default="all")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="f32",
                        help="the models' weights and activations")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--tools", default=str(Path(__file__).resolve().parents[2] / "build" /
                                               "release" / "tools"))
    parser.add_argument("--scratch", default=None, help="directory for the W8A8 export")
    parser.add_argument("--size", choices=sorted(SIZES), default="full",
                        help="the token counts (small: a quick run at the real widths)")
    parser.add_argument("--json", help="write the times to this file (bench_json.py)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    ditops.set_num_threads(args.threads)
    _time_ditops_calls()
    info = ditops.cpu_info()
    print(f"torch {torch.__version__}, threads {args.threads}, ditops isa {info['isa']} "
          f"(avx512_vnni {info['avx512_vnni']}, avx512_bf16 {info['avx512_bf16']})")
    results = bench_json.Results("model_speed.py", threads=args.threads, runs=args.runs,
                                 size=args.size)
    with torch.inference_mode():
        if args.model in ("flux", "all"):
            bench_flux(args, results)
        if args.model in ("wan", "all"):
            bench_wan(args, results)
    results.write(args.json)


if __name__ == "__main__":
    main()
