"""MindIE-SD's sparse_attention (rf_v2) beside dense ditops attention on a Wan-shaped
self-attention (BSND [1, frames * 30 * 52, 12, 128]), the calls interleaved, medians: each
call's time as a share of dense, the share of blocks kept, and what the call spends outside the
block-sparse kernel (the block choice, the token reordering).

    PYTHONPATH=build/release/python build/venv/bin/python bench/python/sparse_speed.py \\
        [--frames 3] [--runs 5] [--dtype float32|bfloat16] [--json FILE]

--json FILE writes the times as Google Benchmark JSON (bench_json.py): rows
sparse_speed/dtype:D/frames:F/sparsity:P, P 0 the dense call and 50 / 75 the rf_v2 calls, the
kept share and the time outside the kernel in their labels.
"""

import argparse
import statistics
import time

import torch

import bench_json
import ditops
from ditops import rainfusion_v2 as rf_v2
from ditops.mindiesd import sparse_attention

HEIGHT, WIDTH, HEADS, HEAD_DIM, BLOCK = 30, 52, 12, 128, 128
SPARSITIES = (0.5, 0.75)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--frames", type=int, default=3)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--json", help="write the times to this file (bench_json.py)")
    args = parser.parse_args()
    dtype = getattr(torch, args.dtype)
    tokens = args.frames * HEIGHT * WIDTH
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, tokens, HEADS, HEAD_DIM).to(dtype) for _ in range(3))
    scale = HEAD_DIM ** -0.5
    plan = rf_v2.layout_plan(tokens, (args.frames, HEIGHT, WIDTH), 0, True, BLOCK, True)
    qp, kp, vp = (x.index_select(1, plan.order) for x in (q, k, v))
    masks = {s: rf_v2.choose_blocks(qp, kp, BLOCK, s, scale, plan.forced, False)
             for s in SPARSITIES}
    calls = {"dense": lambda: ditops.attention_forward(q, k, v)}
    for s in SPARSITIES:
        calls[f"rf_v2 {s}"] = lambda s=s: sparse_attention(
            q, k, v, input_layout="BSND", sparse_type="rf_v2",
            latent_shape_q=[args.frames, HEIGHT, WIDTH], sparsity=s)
        calls[f"kernel {s}"] = lambda s=s: ditops.block_sparse_attention(
            qp, kp, vp, masks[s], BLOCK, False, scale)
        calls[f"choice {s}"] = lambda s=s: rf_v2.choose_blocks(qp, kp, BLOCK, s, scale,
                                                               plan.forced, False)
    with torch.inference_mode():
        for call in calls.values():  # warm: the tuner, the layout plan
            call()
        seconds = {name: [] for name in calls}
        for _ in range(args.runs):
            for name, call in calls.items():
                start = time.perf_counter()
                call()
                seconds[name].append(time.perf_counter() - start)
    median = {name: statistics.median(times) for name, times in seconds.items()}
    print(f"{args.dtype}, S = {tokens} ({args.frames} x {HEIGHT} x {WIDTH}), {HEADS} heads x "
          f"{HEAD_DIM}, {ditops.num_threads()} threads, {args.runs} runs, {ditops.cpu_info()}")
    print(f"dense: {median['dense'] * 1e3:.1f} ms")
    results = bench_json.Results("sparse_speed.py", threads=ditops.num_threads(), runs=args.runs)
    row = f"sparse_speed/dtype:{args.dtype}/frames:{args.frames}/sparsity:"
    shape = f"{args.frames} x {HEIGHT} x {WIDTH} latent, {HEADS} heads, {args.dtype}"
    results.add(f"{row}0", seconds["dense"], unit="ms",
                label=f"dense attention_forward, {shape}")
    for s in SPARSITIES:
        total = median[f"rf_v2 {s}"]
        kept = masks[s].float().mean().item()
        outside = (total - median[f"kernel {s}"]) / total * 100
        choice = median[f"choice {s}"] / total * 100
        print(f"rf_v2 sparsity {s}: kept {kept:.3f} of the blocks, "
              f"time {total / median['dense']:.3f} of dense, outside the kernel "
              f"{outside:.1f} %, block choice {choice:.1f} %")
        results.add(f"{row}{round(s * 100)}", seconds[f"rf_v2 {s}"], unit="ms",
                    label=f"sparse_attention rf_v2 {s}: kept {kept:.3f} of the blocks, "
                          f"{outside:.0f} % outside the kernel ({choice:.0f} % block choice)",
                    counters={"kept": kept})
    results.write(args.json)


if __name__ == "__main__":
    main()
