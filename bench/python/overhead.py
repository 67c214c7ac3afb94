"""The Python layer's cost per call at tiny shapes, where the kernels take well under a
microsecond: each public call on torch tensors (under torch.inference_mode) and on numpy arrays,
beside the same C++ call made through the raw binding on numpy arrays (the C++ call plus
nanobind's argument conversion, ~0.3 us). 7 repetitions of 20000 calls, the three ways of a
call taking turns; the overhead is each repetition's time less the C++ call's in the same turn,
and the tables show medians over the repetitions.

    PYTHONPATH=build/release/python build/venv/bin/python bench/python/overhead.py \
        [--calls 20000] [--repetitions 7] [--json FILE]

--json FILE writes the overheads as Google Benchmark JSON (bench_json.py): a row per call and
input kind, its time the overhead in us over the C++ call.
"""

import argparse
import statistics

import numpy as np
import torch

import bench_json
import ditops
from ditops import _ditops


def per_call_us(functions, calls, repetitions):
    """Each function's us per call in each repetition of `calls` calls, the functions taking
    turns (bench_json.interleaved; its warm-up is a repetition's calls)."""

    def repeated(function):
        def run():
            for _ in range(calls):
                function()

        return run

    seconds = bench_json.interleaved([repeated(f) for f in functions], repetitions)
    return [[s / calls * 1e6 for s in spent] for spent in seconds]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=20000, help="calls per repetition")
    parser.add_argument("--repetitions", type=int, default=7)
    parser.add_argument("--json", help="write the overheads to this file (bench_json.py)")
    args = parser.parse_args()
    ditops.set_num_threads(1)
    x = torch.randn(1, 8, 2, 16)
    w = torch.ones(16)
    angles = torch.rand(8, 16)
    cos, sin = angles.cos(), angles.sin()
    xn, wn, cn, sn = x.numpy(), w.numpy(), cos.numpy(), sin.numpy()
    out = np.empty_like(xn)
    lse = np.empty((1, 2, 8), np.float32)
    cases = [
        ("rms_norm", "rms_norm [1,8,2,16]", lambda a, b: ditops.rms_norm(a, b), (x, w), (xn, wn),
         lambda: _ditops.rms_norm(xn, wn, 1e-6, out)),
        ("add_rms_norm", "add_rms_norm", lambda a, b: ditops.add_rms_norm(a, a, b), (x, w),
         (xn, wn), lambda: _ditops.add_rms_norm(xn, xn, wn, 1e-6, out, out.copy())),
        ("rope", "rotary_position_embedding",
         lambda a, c, s: ditops.rotary_position_embedding(a, c, s), (x, cos, sin), (xn, cn, sn),
         lambda: _ditops.rotary_position_embedding(xn, cn, sn, out, "rotated_half", False)),
        ("cfg_combine", "cfg_combine", lambda a: ditops.cfg_combine(a, a, 2.0), (x,), (xn,),
         lambda: _ditops.cfg_combine(xn, xn, 2.0, out)),
        ("attention", "attention_forward S=8 N=2 D=16",
         lambda a: ditops.attention_forward(a, a, a), (x,), (xn,),
         lambda: _ditops.attention_forward(xn, xn, xn, out, None, None, None, False, False,
                                           "automatic", 2)),
        ("attention_lse", "attention_forward + lse",
         lambda a: ditops.attention_forward(a, a, a, return_lse=True), (x,), (xn,),
         lambda: _ditops.attention_forward(xn, xn, xn, out, None, lse, None, False, False,
                                           "automatic", 2)),
    ]
    print(f"ditops {ditops.__version__}, isa {ditops.cpu_info()['isa']}, 1 thread, medians of "
          f"{args.repetitions} x {args.calls} calls")
    print("| call | torch tensors us | numpy us | C++ call (raw binding, numpy) us |"
          " overhead torch us | overhead numpy us |")
    print("|---|---:|---:|---:|---:|---:|")
    results = bench_json.Results("overhead.py", threads=1, calls=args.calls)
    with torch.inference_mode():
        for key, name, public, torch_args, numpy_args, raw in cases:
            times = dict(zip(("torch", "numpy", "native"), per_call_us(
                [lambda: public(*torch_args), lambda: public(*numpy_args), raw], args.calls,
                args.repetitions)))
            over = {kind: [t - n for t, n in zip(times[kind], times["native"])]
                    for kind in ("torch", "numpy")}
            print(f"| {name} | {statistics.median(times['torch']):.2f} | "
                  f"{statistics.median(times['numpy']):.2f} | "
                  f"{statistics.median(times['native']):.2f} | "
                  f"{statistics.median(over['torch']):.2f} | "
                  f"{statistics.median(over['numpy']):.2f} |")
            native = statistics.median(times["native"])
            for kind, tensors in (("torch", "torch tensors"), ("numpy", "numpy arrays")):
                results.add(f"overhead/{key}/input:{kind}", [us * 1e-6 for us in over[kind]],
                            unit="us", label=f"{name}, {tensors}: over the C++ call "
                                             f"({native:.2f} us)")
    results.write(args.json)


if __name__ == "__main__":
    main()
