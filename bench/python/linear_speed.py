"""ditops' FLOAT linear layer (what ditops.diffusers.optimize puts in place of nn.Linear)
beside torch's nn.Linear, fp32 and bf16, on DiT shapes: the fastest of 5 runs after a warm-up,
the two libraries in the same process on the same inputs, and the relative L2 between them.

    PYTHONPATH=build/release/python build/venv/bin/python bench/python/linear_speed.py \
        [--threads 2]
"""

import argparse
import time

import torch

import ditops
from ditops import _ditops
from ditops.quant import QuantLinear

# tokens x in_features x out_features: FLUX's attention projection and MLP on 4608 tokens, and
# a 512-token text stream.
SHAPES = ((4608, 3072, 3072), (4608, 3072, 12288), (512, 3072, 3072))


def fastest(call, runs=5):
    call()
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return min(times)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    ditops.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, threads {args.threads}, ditops isa "
          f"{ditops.cpu_info()['isa']}")
    print("| dtype | tokens x in x out | torch ms | ditops ms | torch / ditops | rel-L2 |")
    print("|---|---|---:|---:|---:|---:|")
    torch.manual_seed(0)
    for dtype in (torch.float32, torch.bfloat16):
        for tokens, k, n in SHAPES:
            linear = torch.nn.Linear(k, n).to(dtype)
            x = torch.randn(tokens, k).to(dtype)
            layer = QuantLinear(_ditops.QuantLinear.float_linear(
                linear.weight.detach().contiguous(), linear.bias.detach().float().contiguous()))
            with torch.inference_mode():
                on_torch = fastest(lambda: linear(x))
                on_ditops = fastest(lambda: layer(x))
                want, got = linear(x).double(), layer(x).double()
            error = ((got - want).norm() / want.norm()).item()
            print(f"| {str(dtype).removeprefix('torch.')} | {tokens} x {k} x {n} | "
                  f"{on_torch * 1e3:.1f} | {on_ditops * 1e3:.1f} | {on_torch / on_ditops:.2f}x | "
                  f"{error:.1e} |")


if __name__ == "__main__":
    main()
