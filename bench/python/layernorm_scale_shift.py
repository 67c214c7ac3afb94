"""AdaLN on DiT shapes: ditops.mindiesd.layernorm_scale_shift (one fused pass) beside torch's two
ops (F.layer_norm, then · (1 + scale) + shift), and fast_layernorm beside F.layer_norm, under
torch.inference_mode(). scale and shift are [B, H] (one row per batch element, as DiT blocks
make them); the LayerNorm's weight and bias are in x's dtype. The candidates run interleaved
(A, B, A, B, ...) so that drift on a shared machine hits them alike; medians, and the ratio of
the medians. GB/s counts the least traffic an AdaLN needs (x read once, out written once);
with --triad-gbs (ditops_bench's BM_memory_triad at 1 and 2 threads) also its fraction of that.

Every call allocates its output, as in a model. glibc gives blocks above its mmap threshold
(at most 32 MiB) back to the OS when they are freed, so such outputs fault their pages in
again on every call, for torch's ops and ditops' alike ("fresh" rows); the "reused" rows run
after mallopt(M_MMAP_MAX, 0) and a trim threshold beyond any output, which keep freed memory
in the heap: the kernels' own time.

    PYTHONPATH=build/release/python build/venv/bin/python bench/python/layernorm_scale_shift.py \
        [--runs 11] [--triad-gbs X Y] [--shape flux|wan|all] [--memory fresh|reused|all]
        [--threads 1 2] [--json FILE]

--json FILE writes the times as Google Benchmark JSON (bench_json.py): rows
layernorm_scale_shift/memory:M/shape:S/dtype:D/threads:T/call:C/lib:L, lib 0 torch and 1
ditops, with GB/s (and frac_bw, the fraction of the triad, with --triad-gbs).
"""

import argparse
import ctypes
import ctypes.util
import statistics

import torch
import torch.nn.functional as F

import bench_json
import ditops
from ditops.mindiesd import fast_layernorm, layernorm_scale_shift

SHAPES = {"flux": ("FLUX image stream", (1, 4608, 3072)),
          "wan": ("Wan 2.1 1.3B 480p latent", (1, 32760, 1536))}
DTYPE_NAMES = {torch.float32: "f32", torch.bfloat16: "bf16"}


def torch_adaln(norm, x, scale, shift):
    y = F.layer_norm(x, norm.normalized_shape, norm.weight, norm.bias, norm.eps)
    return y * (1 + scale[:, None]) + shift[:, None]


def keep_freed_memory():
    """Makes glibc's malloc serve every block from the heap and never trim it."""
    libc = ctypes.CDLL(ctypes.util.find_library("c"))
    m_trim_threshold, m_mmap_max = -1, -4
    if not (libc.mallopt(m_mmap_max, 0) and libc.mallopt(m_trim_threshold, 2**31 - 1)):
        raise RuntimeError("mallopt refused")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=11)
    parser.add_argument("--triad-gbs", type=float, nargs=2, help="memory triad GB/s at 1 and 2 "
                        "threads (ditops_bench --benchmark_filter=BM_memory_triad)")
    parser.add_argument("--shape", choices=[*SHAPES, "all"], default="all")
    parser.add_argument("--memory", choices=["fresh", "reused", "all"], default="all")
    parser.add_argument("--threads", type=int, nargs="+", choices=[1, 2], default=[1, 2])
    parser.add_argument("--json", help="write the times to this file (bench_json.py)")
    args = parser.parse_args()
    print(f"ditops {ditops.__version__}, torch {torch.__version__}, isa "
          f"{ditops.cpu_info()['isa']}, medians of {args.runs} interleaved runs")
    print("| output memory | shape | dtype | threads | call | ditops ms | torch ms | "
          "torch / ditops | ditops GB/s | torch GB/s |" +
          (" ditops frac triad |" if args.triad_gbs else ""))
    print("|---|---|---|---:|---|---:|---:|---:|---:|---:|" + ("---:|" if args.triad_gbs else ""))
    torch.manual_seed(0)
    results = bench_json.Results("layernorm_scale_shift.py", runs=args.runs)
    for memory in ("fresh", "reused"):
        if args.memory not in (memory, "all"):
            continue
        if memory == "reused":
            keep_freed_memory()
        with torch.inference_mode():
            for key, (name, shape) in SHAPES.items():
                if args.shape not in (key, "all"):
                    continue
                for dtype in (torch.float32, torch.bfloat16):
                    run_shape(args, results, memory, key, name, shape, dtype)
    results.write(args.json)


def run_shape(args, results, memory, key, name, shape, dtype):
    hidden = shape[-1]
    x = torch.randn(shape).to(dtype)
    scale = (0.5 * torch.randn(shape[0], hidden)).to(dtype)
    shift = torch.randn(shape[0], hidden).to(dtype)
    norm = torch.nn.LayerNorm(hidden, eps=1e-6).to(dtype)
    bytes_moved = 2 * x.numel() * x.element_size()
    for threads in args.threads:
        ditops.set_num_threads(threads)
        torch.set_num_threads(threads)
        pairs = [
            ("layernorm_scale_shift", lambda: layernorm_scale_shift(norm, x, scale, shift),
             lambda: torch_adaln(norm, x, scale, shift)),
            ("fast_layernorm", lambda: fast_layernorm(norm, x),
             lambda: F.layer_norm(x, (hidden,), norm.weight, norm.bias, norm.eps)),
        ]
        for call, ours, theirs in pairs:
            seconds = dict(zip(("ditops", "torch"),
                               bench_json.interleaved([ours, theirs], args.runs)))
            median = {lib: statistics.median(values) for lib, values in seconds.items()}
            row = (f"| {memory} | {name} {list(shape)} | {str(dtype)[6:]} | {threads} | {call} | "
                   f"{median['ditops'] * 1e3:.2f} | {median['torch'] * 1e3:.2f} | "
                   f"{median['torch'] / median['ditops']:.2f} | "
                   f"{bytes_moved / median['ditops'] / 1e9:.1f} | "
                   f"{bytes_moved / median['torch'] / 1e9:.1f} |")
            if args.triad_gbs:
                triad = args.triad_gbs[threads - 1]
                row += f" {bytes_moved / median['ditops'] / 1e9 / triad:.0%} |"
            print(row, flush=True)
            short, baseline = (("adaln", "F.layer_norm, * (1 + scale) + shift")
                               if call == "layernorm_scale_shift" else
                               ("layernorm", "F.layer_norm"))
            for lib, (who, what) in enumerate((("torch", f"torch {baseline}"),
                                               ("ditops", call))):
                counters = {"GB/s": bytes_moved / median[who] / 1e9}
                if args.triad_gbs:
                    counters["frac_bw"] = counters["GB/s"] / args.triad_gbs[threads - 1]
                results.add(f"layernorm_scale_shift/memory:{memory}/shape:{key}/"
                            f"dtype:{DTYPE_NAMES[dtype]}/threads:{threads}/call:{short}/lib:{lib}",
                            seconds[who], unit="ms", counters=counters,
                            label=f"{what}, {name} {list(shape)}, {memory} output memory")

if __name__ == "__main__":
    main()
