"""Ring attention on N processes of one core each against one process on one core, at FLUX's
heads (24 x 128) and a sequence of S tokens, fp32, non-causal: each process pinned to its own
core; the single-process attention (rank 0, the others idle at a barrier) and the ring (every
rank) timed alternately, medians of `--runs`. Also the share of the ring's time each rank spent
waiting for a key/value shard (the communication the attention did not hide).

    PYTHONPATH=build/release/python build/venv/bin/python bench/python/ring_speed.py \\
        --seq 8192 --processes 2 [--runs 3] [--json FILE]

--json FILE writes the times as Google Benchmark JSON (bench_json.py): rows
ring_speed/seq:S/processes:P, P 1 the single process, with GFLOP/s.
"""

import argparse
import os
import statistics
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import bench_json

def worker(rank, world, store, args, results):
    os.sched_setaffinity(0, {rank % os.cpu_count()})
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
    import ditops
    import ditops.distributed as dd

    ditops.set_num_threads(1)
    waiting = [0.0]
    wait = dd._wait

    def timed_wait(*a):
        start = time.perf_counter()
        try:
            return wait(*a)
        finally:
            waiting[0] += time.perf_counter() - start

    dd._wait = timed_wait
    generator = torch.Generator().manual_seed(0)
    shape = (1, args.seq, args.heads, args.dim)
    q, k, v = (torch.randn(shape, generator=generator) for _ in range(3))
    shard = args.seq // world
    local = [x[:, rank * shard:(rank + 1) * shard].contiguous() for x in (q, k, v)]
    dd.ring_attention(*local)  # warm: connections, the tuner's choice, pages
    if rank == 0:
        ditops.attention_forward(q, k, v)
    dist.barrier()
    single, ring, waited = [], [], []
    for _ in range(args.runs):
        dist.barrier()
        if rank == 0:
            start = time.perf_counter()
            ditops.attention_forward(q, k, v)
            single.append(time.perf_counter() - start)
        dist.barrier()
        waiting[0] = 0.0
        start = time.perf_counter()
        dd.ring_attention(*local)
        elapsed = time.perf_counter() - start
        # The ring's time is its slowest rank's.
        slowest = torch.tensor([elapsed, waiting[0] / elapsed])
        everyone = [torch.empty(2) for _ in range(world)]
        dist.all_gather(everyone, slowest)
        ring.append(max(t[0].item() for t in everyone))
        waited.append(max(t[1].item() for t in everyone))
    if rank == 0:
        results.put((single, ring, statistics.median(waited), ditops.cpu_info()["isa"]))
    dist.destroy_process_group()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seq", type=int, default=8192)
    parser.add_argument("--heads", type=int, default=24)
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--json", help="write the times to this file (bench_json.py)")
    args = parser.parse_args()
    context = mp.get_context("spawn")
    results = context.Queue()
    with tempfile.TemporaryDirectory() as scratch:
        mp.spawn(worker, args=(args.processes, os.path.join(scratch, "store"), args, results),
                 nprocs=args.processes)
    singles, rings, waited, isa = results.get()
    single, ring = statistics.median(singles), statistics.median(rings)
    flops = 4.0 * args.seq * args.seq * args.heads * args.dim
    print(f"isa {isa}; S {args.seq}, {args.heads} heads x {args.dim}, fp32, non-causal; "
          f"medians of {args.runs}")
    print("| run | median s | GFLOP/s | speedup | waiting share |")
    print("|---|---:|---:|---:|---:|")
    print(f"| 1 process, 1 core | {single:.2f} | {flops / single / 1e9:.0f} | 1.00x | |")
    print(f"| ring, {args.processes} processes x 1 core | {ring:.2f} | {flops / ring / 1e9:.0f} | "
          f"{single / ring:.2f}x | {waited:.1%} |")
    results = bench_json.Results("ring_speed.py", runs=args.runs)
    shape = f"S {args.seq}, {args.heads} heads x {args.dim}, fp32"
    results.add(f"ring_speed/seq:{args.seq}/processes:1", singles, unit="s",
                label=f"attention_forward, 1 process on 1 core, {shape}",
                counters={"GFLOP/s": flops / single / 1e9})
    results.add(f"ring_speed/seq:{args.seq}/processes:{args.processes}", rings, unit="s",
                label=f"ring_attention, {args.processes} processes x 1 core (gloo), {shape}, "
                      f"waiting {waited * 100:.1f} %",
                counters={"GFLOP/s": flops / ring / 1e9, "waiting": waited})
    results.write(args.json)


if __name__ == "__main__":
    main()
