"""MindIE-SD's step caching (ditops.mindiesd.CacheAgent) in a 20-step denoising loop on the CPU:
the transformer called 20 times, the timestep going from 1 down, the latent moved by each output
(a flow-matching Euler step). Per model: the loop without the cache, with attention_cache and
with dit_block_cache at a typical schedule (MindIE-SD's published 50-step settings scaled to 20
steps), run in turn (A, B, C, A, B, C, ...) so that drift on a shared machine hits them alike;
median seconds per loop, the speedup, and the final latent's rel-L2 to the uncached loop's.
Random fp32 weights, torch.inference_mode(), ditops.diffusers.enable(model) on every side
(--no-ditops: diffusers' own attention on every side).

  flux: FLUX-shaped blocks at real width (hidden 3072, 24 heads x 128): one double-stream and
        two single-stream blocks (the second a copy of the first), 8 x 8 image + 32 text tokens
        (the real model's 4096 + 512 shrunk so that a run takes minutes on 2 cores).
  wan:  Wan-shaped blocks at real width (hidden 1536, 12 heads x 128, FFN 8960): three
        blocks, 1 x 8 x 16 latent tokens after patching + 32 text tokens (the real 480p video
        has 12 480 + 512).
At these token counts attention itself is a small share of a block: attention_cache saves the
attention modules' projections (q, k, v, out) mostly, not the softmax(QK^T)V it saves at full
size.

Schedules (steps counted from 0; a "reuse" step takes the cached value):
  attention_cache: step_start=5, step_interval=4, step_end=15 (MindIE-SD's Wan defaults
        12 / 4 / 37 of 50): steps 6-8, 10-12, 14-15 reuse every block's attention (FLUX's
        joint attention, Wan's self-attention).
  dit_block_cache: step_start=4, step_interval=3, blocks [1, 3) (Qwen-Image's 10 / 3 and
        blocks 10-50 of 60): steps 5, 6, 8, 9, ..., 17, 18 skip blocks 1 and 2.

    PYTHONPATH=build/release/python build/venv/bin/python bench/python/cache_loop.py \\
        [--model flux|wan|all] [--runs 3] [--threads 2] [--no-ditops] [--json FILE]

--json FILE writes the times as Google Benchmark JSON (bench_json.py): rows
cache_loop/model:M/method:C, method 0 the loop without the cache, 1 attention_cache and 2
dit_block_cache, the final latent's rel-L2 in their labels.
"""

import argparse
import copy
import statistics
import sys
import time
from pathlib import Path

import torch

import bench_json
import ditops
import ditops.diffusers

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "python" / "tests"))
import models  # noqa: E402  (the test suite's model builders)
from test_mindiesd_cache import (  # noqa: E402  (the test suite's cache harness)
    TIMESTEP_SCALE, agent_attention_route, agent_block_route, denoise, direct, wrap_attentions,
    wrap_blocks)

from ditops.mindiesd import CacheAgent, CacheConfig  # noqa: E402

STEPS = 20
SCHEDULES = {
    "attention_cache": dict(step_start=5, step_interval=4, step_end=15),
    "dit_block_cache": dict(step_start=4, step_interval=3, block_start=1, block_end=3),
}


def flux_shaped():
    model, inputs = models.flux(height=8, width=8, text=32, heads=24, head_dim=128, layers=1,
                                in_channels=64, text_dim=4096, pooled_dim=768)
    model.single_transformer_blocks.append(copy.deepcopy(model.single_transformer_blocks[0]))
    return model, inputs


def wan_shaped():
    return models.wan(frames=1, height=16, width=32, heads=12, head_dim=128, layers=3,
                      dim_in=16, ffn=8960, text=32, text_dim=4096)


def rel_l2(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def bench(name, model, inputs, args, results):
    # enable before wrapping: a wrapped attention (CachedCall) hides its processor from
    # model.attn_processors, which enable swaps.
    if args.ditops:
        ditops.diffusers.enable(model)
    # The attentions before the blocks: a wrapped block hides its attributes.
    attentions, blocks = wrap_attentions(model), wrap_blocks(model)

    def loop(method):
        for site in attentions + blocks:
            site.route = direct
        if method:
            sites = attentions if method == "attention_cache" else blocks
            agent = CacheAgent(CacheConfig(method=method, steps_count=STEPS,
                                           blocks_count=len(sites), **SCHEDULES[method]))
            route = (agent_attention_route(agent) if method == "attention_cache"
                     else agent_block_route(agent))
            for site in sites:
                site.route = route
        start = time.perf_counter()
        latent = denoise(model, inputs, STEPS, TIMESTEP_SCALE[name])
        return time.perf_counter() - start, latent

    model(**inputs)  # warm-up (allocations, kernel tuning)
    methods = [None, *SCHEDULES]
    seconds = {method: [] for method in methods}
    latents = {}
    for _ in range(args.runs):
        for method in methods:
            elapsed, latents[method] = loop(method)
            seconds[method].append(elapsed)
    medians = {method: statistics.median(values) for method, values in seconds.items()}
    print("| configuration | median s per loop | speedup | final latent rel-L2 to uncached |")
    print("|---|---:|---:|---:|")
    for index, method in enumerate(methods):
        error = None if method is None else rel_l2(latents[method], latents[None])
        print(f"| {method or 'no cache'} | {medians[method]:.2f} | "
              f"{medians[None] / medians[method]:.2f}x | "
              f"{'-' if error is None else f'{error:.1e}'} |")
        label = f"{method or 'no cache'}, {STEPS} steps"
        if error is not None:
            label += f"; final latent rel-L2 to uncached {error:.1e}"
        results.add(f"cache_loop/model:{name}/method:{index}", seconds[method], unit="s",
                    label=label, counters={"rel_l2": error})
    for method, values in seconds.items():
        print(f"  {method or 'no cache'}: " + " / ".join(f"{value:.2f}" for value in values))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=["flux", "wan", "all"], default="all")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--no-ditops", dest="ditops", action="store_false",
                        help="diffusers' own attention instead of ditops.diffusers.enable")
    parser.add_argument("--json", help="write the times to this file (bench_json.py)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    ditops.set_num_threads(args.threads)
    info = ditops.cpu_info()
    print(f"torch {torch.__version__}, threads {args.threads}, ditops isa {info['isa']}, "
          f"attention: {'ditops.diffusers.enable' if args.ditops else 'diffusers default'}, "
          f"{STEPS} steps, fp32")
    builders = {"flux": (flux_shaped, "FLUX-shaped: hidden 3072, 1 double + 2 single blocks, "
                                      "64 image + 32 text tokens"),
                "wan": (wan_shaped, "Wan-shaped: hidden 1536, FFN 8960, 3 blocks, 128 latent + "
                                    "32 text tokens")}
    results = bench_json.Results("cache_loop.py", threads=args.threads, runs=args.runs,
                                 steps=STEPS, ditops=args.ditops)
    with torch.inference_mode():
        for name in (["flux", "wan"] if args.model == "all" else [args.model]):
            build, title = builders[name]
            print(f"\n{title}")
            model, inputs = build()
            bench(name, model, inputs, args, results)
    results.write(args.json)


if __name__ == "__main__":
    main()
