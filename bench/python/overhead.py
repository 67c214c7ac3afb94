"""The Python layer's cost per call at tiny shapes, where the kernels take well under a
microsecond: each public call on torch tensors (under torch.inference_mode) and on numpy arrays,
beside the same C++ call made through the raw binding on numpy arrays (the C++ call plus
nanobind's argument conversion, ~0.3 us). Best of 7 repetitions of 20000 calls.

    PYTHONPATH=build/release/python build/venv/bin/python bench/python/overhead.py
"""

import time

import numpy as np
import torch

import ditops
from ditops import _ditops


def best_us(function, calls=20000, repetitions=7):
    for _ in range(1000):
        function()
    best = float("inf")
    for _ in range(repetitions):
        start = time.perf_counter()
        for _ in range(calls):
            function()
        best = min(best, (time.perf_counter() - start) / calls * 1e6)
    return best


def main():
    ditops.set_num_threads(1)
    x = torch.randn(1, 8, 2, 16)
    w = torch.ones(16)
    angles = torch.rand(8, 16)
    cos, sin = angles.cos(), angles.sin()
    xn, wn, cn, sn = x.numpy(), w.numpy(), cos.numpy(), sin.numpy()
    out = np.empty_like(xn)
    lse = np.empty((1, 2, 8), np.float32)
    cases = [
        ("rms_norm [1,8,2,16]", lambda a, b: ditops.rms_norm(a, b), (x, w), (xn, wn),
         lambda: _ditops.rms_norm(xn, wn, 1e-6, out)),
        ("add_rms_norm", lambda a, b: ditops.add_rms_norm(a, a, b), (x, w), (xn, wn),
         lambda: _ditops.add_rms_norm(xn, xn, wn, 1e-6, out, out.copy())),
        ("rotary_position_embedding", lambda a, c, s: ditops.rotary_position_embedding(a, c, s),
         (x, cos, sin), (xn, cn, sn),
         lambda: _ditops.rotary_position_embedding(xn, cn, sn, out, "rotated_half", False)),
        ("cfg_combine", lambda a: ditops.cfg_combine(a, a, 2.0), (x,), (xn,),
         lambda: _ditops.cfg_combine(xn, xn, 2.0, out)),
        ("attention_forward S=8 N=2 D=16", lambda a: ditops.attention_forward(a, a, a), (x,),
         (xn,), lambda: _ditops.attention_forward(xn, xn, xn, out, None, None, None, False,
                                                  False, "automatic", 2)),
        ("attention_forward + lse", lambda a: ditops.attention_forward(a, a, a, return_lse=True),
         (x,), (xn,), lambda: _ditops.attention_forward(xn, xn, xn, out, None, lse, None, False,
                                                        False, "automatic", 2)),
    ]
    print(f"ditops {ditops.__version__}, isa {ditops.cpu_info()['isa']}, 1 thread")
    print("| call | torch tensors us | numpy us | C++ call (raw binding, numpy) us |"
          " overhead torch us | overhead numpy us |")
    print("|---|---:|---:|---:|---:|---:|")
    with torch.inference_mode():
        for name, public, torch_args, numpy_args, raw in cases:
            on_torch = best_us(lambda: public(*torch_args))
            on_numpy = best_us(lambda: public(*numpy_args))
            native = best_us(raw)
            print(f"| {name} | {on_torch:.2f} | {on_numpy:.2f} | {native:.2f} | "
                  f"{on_torch - native:.2f} | {on_numpy - native:.2f} |")


if __name__ == "__main__":
    main()
