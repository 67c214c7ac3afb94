"""ditops' FLOAT linear layer (what ditops.diffusers.optimize puts in place of nn.Linear)
beside torch's nn.Linear, fp32 and bf16, on DiT shapes: the median of 5 runs after a warm-up,
the two libraries taking turns in the same process on the same inputs, and the relative L2
between them.

    PYTHONPATH=build/release/python build/venv/bin/python bench/python/linear_speed.py \
        [--threads 2] [--runs 5] [--tokens 4608] [--json FILE]

--tokens N: the image stream's rows (FLUX's 4608 by default; fewer for a quick run); the text
stream's 512 stay. --json FILE writes the times as Google Benchmark JSON (bench_json.py): rows
linear_speed/dtype:D/shape:I/lib:L, lib 0 torch and 1 ditops, with GFLOP/s.
"""

import argparse
import statistics

import torch

import bench_json
import ditops
from ditops import _ditops
from ditops.quant import QuantLinear

# in_features x out_features on the image stream's tokens: FLUX's attention projection and MLP;
# and the same projection on a 512-token text stream.
IMAGE_SHAPES = ((3072, 3072), (3072, 12288))
TEXT_SHAPE = (512, 3072, 3072)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=4608, help="the image stream's rows")
    parser.add_argument("--json", help="write the times to this file (bench_json.py)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    ditops.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, threads {args.threads}, ditops isa "
          f"{ditops.cpu_info()['isa']}")
    print("| dtype | tokens x in x out | torch ms | ditops ms | torch / ditops | rel-L2 |")
    print("|---|---|---:|---:|---:|---:|")
    shapes = [(args.tokens, k, n) for k, n in IMAGE_SHAPES] + [TEXT_SHAPE]
    results = bench_json.Results("linear_speed.py", threads=args.threads, runs=args.runs)
    torch.manual_seed(0)
    for dtype in (torch.float32, torch.bfloat16):
        for index, (tokens, k, n) in enumerate(shapes):
            linear = torch.nn.Linear(k, n).to(dtype)
            x = torch.randn(tokens, k).to(dtype)
            layer = QuantLinear(_ditops.QuantLinear.float_linear(
                linear.weight.detach().contiguous(), linear.bias.detach().float().contiguous()))
            with torch.inference_mode():
                times = bench_json.interleaved([lambda: linear(x), lambda: layer(x)], args.runs)
                want, got = linear(x).double(), layer(x).double()
            on_torch, on_ditops = (statistics.median(t) for t in times)
            error = ((got - want).norm() / want.norm()).item()
            name = "f32" if dtype == torch.float32 else "bf16"
            print(f"| {name} | {tokens} x {k} x {n} | "
                  f"{on_torch * 1e3:.1f} | {on_ditops * 1e3:.1f} | {on_torch / on_ditops:.2f}x | "
                  f"{error:.1e} |")
            flops = 2.0 * tokens * k * n
            for lib, (what, spent) in enumerate((("torch nn.Linear", times[0]),
                                                 ("ditops FLOAT", times[1]))):
                label = f"{what}, {name}, {tokens} x {k} -> {n}"
                if lib:
                    label += f", rel-L2 to torch {error:.1e}"
                results.add(f"linear_speed/dtype:{name}/shape:{index}/lib:{lib}", spent,
                            unit="ms", label=label,
                            counters={"GFLOP/s": flops / statistics.median(spent) / 1e9})
    results.write(args.json)


if __name__ == "__main__":
    main()
