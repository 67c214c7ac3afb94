#!/usr/bin/env python3
"""ditops attention beside PyTorch SDPA and ONNX Runtime MultiHeadAttention, in one run.

Each measurement is a fresh process (`peers.py worker ...` for the Python libraries, the
ditops-attention-peer binary for ditops) that makes N(0, 1) fp32 inputs, runs one untimed call
and then one timed call. Libraries take turns (A B C, A B C, ...) for `--rounds` rounds at the
same thread count, so a slow phase of a shared machine hits all of them alike; the table gives
the median of the rounds. Run through tools/bench-peers.sh, which makes the virtual environment.

    peers.py run --ditops BIN --out DIR [--rounds 3] [--quick] [--peak-gflops X]
    peers.py worker --lib torch|ort --seq S --heads N --dim D --causal 0|1 --threads T
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

# (sequence, causal, threads): the FLUX shape (B=1, N=24, D=128) at the lengths of a 1024^2 and
# a 1536^2 image, as a user choosing a library would try them.
SHAPES = [
    (2048, False, 2),
    (2048, False, 1),
    (2048, True, 2),
    (2048, True, 1),
    (4608, False, 2),
    (4608, False, 1),
    (4608, True, 2),
    (4608, True, 1),
]
QUICK_SHAPES = [(2048, False, 2), (2048, True, 2)]
HEADS, DIM, BATCH = 24, 128, 1
LIBRARIES = ["ditops", "torch", "ort"]
TITLES = {"ditops": "ditops", "torch": "PyTorch SDPA", "ort": "ONNX Runtime MHA"}


def flops(seq, causal):
    total = 4.0 * BATCH * HEADS * seq * seq * DIM
    return total / 2 if causal else total


def worker(args):
    """Times one call of the library named by --lib; prints {"ms": [...], "version": ...}."""
    import numpy as np

    rng = np.random.default_rng(1)
    shape = (BATCH, args.seq, HEADS, DIM)
    q, k, v = (rng.standard_normal(shape, dtype=np.float32) for _ in range(3))
    if args.lib == "torch":
        import torch
        import torch.nn.functional as F

        torch.set_num_threads(args.threads)
        # BNSD contiguous: the layout PyTorch's CPU flash kernel reads fastest.
        tq, tk, tv = (torch.from_numpy(x).transpose(1, 2).contiguous() for x in (q, k, v))

        def call():
            with torch.inference_mode():
                F.scaled_dot_product_attention(tq, tk, tv, is_causal=bool(args.causal))

        version = torch.__version__
    else:
        import onnx
        import onnxruntime as ort
        from onnx import TensorProto, helper

        hidden = HEADS * DIM
        inputs = [
            helper.make_tensor_value_info(name, TensorProto.FLOAT, [BATCH, args.seq, hidden])
            for name in ("query", "key", "value")
        ]
        node = helper.make_node(
            "MultiHeadAttention",
            ["query", "key", "value"],
            ["output"],
            domain="com.microsoft",
            num_heads=HEADS,
            unidirectional=int(args.causal),
        )
        output = helper.make_tensor_value_info("output", TensorProto.FLOAT, [BATCH, args.seq, hidden])
        graph = helper.make_graph([node], "mha", inputs, [output])
        model = helper.make_model(
            graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
        )
        options = ort.SessionOptions()
        options.intra_op_num_threads = args.threads
        options.inter_op_num_threads = 1
        session = ort.InferenceSession(
            model.SerializeToString(), options, providers=["CPUExecutionProvider"]
        )
        feeds = {name: x.reshape(BATCH, args.seq, hidden) for name, x in zip(("query", "key", "value"), (q, k, v))}

        def call():
            session.run(None, feeds)

        version = ort.__version__
    call()
    times = []
    for _ in range(args.reps):
        start = time.perf_counter()
        call()
        times.append((time.perf_counter() - start) * 1e3)
    print(json.dumps({"library": args.lib, "version": version, "ms": times}))


def measure(library, ditops_bin, seq, causal, threads, tune_cache=None):
    if library == "ditops":
        command = [ditops_bin, "--seq", seq, "--heads", HEADS, "--dim", DIM, "--causal", int(causal),
                   "--threads", threads]
    else:
        command = [sys.executable, os.path.abspath(__file__), "worker", "--lib", library, "--seq", seq,
                   "--causal", int(causal), "--threads", threads]
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    if library == "ditops" and tune_cache:
        # The first call of a shape tunes (several full runs): once per shape, not per round.
        env["DITOPS_TUNE_CACHE"] = tune_cache
    result = subprocess.run([str(c) for c in command], capture_output=True, text=True, env=env)
    if result.returncode != 0:
        raise RuntimeError(f"{library} failed: {result.stderr.strip()[-400:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def svg_chart(rows, path):
    """Grouped bars of GFLOP/s per shape, one colour per library."""
    colours = {"ditops": "#1f77b4", "torch": "#ff7f0e", "ort": "#2ca02c"}
    width_bar, gap, left, top, height = 18, 22, 60, 30, 220
    best = max(r["gflops"][lib] for r in rows for lib in LIBRARIES if lib in r["gflops"])
    group = width_bar * len(LIBRARIES) + gap
    width = left + group * len(rows) + 20
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{top + height + 90}"'
             ' font-family="sans-serif" font-size="11">',
             f'<text x="{left}" y="18">GFLOP/s, FLUX attention (B=1, N=24, D=128, fp32), '
             'median of interleaved rounds</text>']
    for i, lib in enumerate(LIBRARIES):
        parts.append(f'<rect x="{left + 330 + i * 120}" y="8" width="10" height="10" fill="{colours[lib]}"/>'
                     f'<text x="{left + 344 + i * 120}" y="18">{TITLES[lib]}</text>')
    for i, row in enumerate(rows):
        x0 = left + i * group
        for j, lib in enumerate(LIBRARIES):
            value = row["gflops"].get(lib)
            if value is None:
                continue
            h = height * value / best
            parts.append(f'<rect x="{x0 + j * width_bar}" y="{top + height - h:.1f}" width="{width_bar - 2}"'
                         f' height="{h:.1f}" fill="{colours[lib]}"><title>{TITLES[lib]}: {value:.1f}'
                         '</title></rect>')
        label = f'S={row["seq"]} {"causal" if row["causal"] else "full"} {row["threads"]}t'
        parts.append(f'<text transform="translate({x0 + 4},{top + height + 8}) rotate(60)">{label}</text>')
    parts.append(f'<line x1="{left - 4}" y1="{top + height}" x2="{width - 10}" y2="{top + height}" stroke="black"/>')
    parts.append(f'<text x="4" y="{top + 10}">{best:.0f}</text><text x="4" y="{top + height}">0</text>')
    parts.append("</svg>")
    with open(path, "w") as f:
        f.write("\n".join(parts) + "\n")


def run(args):
    shapes = QUICK_SHAPES if args.quick else SHAPES
    rows = []
    versions = {}
    os.makedirs(args.out, exist_ok=True)
    for seq, causal, threads in shapes:
        samples = {lib: [] for lib in LIBRARIES}
        failures = {}
        for _ in range(args.rounds):
            for lib in LIBRARIES:
                if lib in failures:
                    continue
                try:
                    result = measure(lib, args.ditops, seq, causal, threads,
                                     os.path.join(args.out, "peers-tune-cache.json"))
                except RuntimeError as error:
                    failures[lib] = str(error)
                    continue
                samples[lib].extend(result["ms"])
                versions[lib] = result.get("version") or result.get("isa", "")
                if lib == "ditops":
                    versions["ditops"] = f'backend {result["backend"]} ({result["detail"]}), ISA {result["isa"]}'
        medians = {lib: statistics.median(v) for lib, v in samples.items() if v}
        row = {"seq": seq, "causal": causal, "threads": threads, "ms": medians,
               "gflops": {lib: flops(seq, causal) / ms / 1e6 for lib, ms in medians.items()},
               "failures": failures}
        rows.append(row)
        print(f"S={seq} causal={int(causal)} threads={threads}: " +
              ", ".join(f"{lib} {ms:.0f} ms" for lib, ms in medians.items()), flush=True)
        for lib, error in failures.items():
            print(f"  {lib}: {error}", file=sys.stderr)
    os.makedirs(args.out, exist_ok=True)
    lines = ["# ditops attention beside its peers", "",
             f"FLUX self-attention, B=1, N={HEADS}, D={DIM}, fp32, BSND inputs (PyTorch: BNSD). "
             f"Median of {args.rounds} interleaved rounds (one timed call each, after one untimed call), "
             "same thread count for every library.", ""]
    for lib in LIBRARIES:
        if lib in versions:
            lines.append(f"- {TITLES[lib]}: {versions[lib]}")
    if args.peak_gflops:
        lines.append(f"- FP32 FMA peak measured by ditops_bench: {args.peak_gflops[0]:.1f} GFLOP/s at 1 thread, "
                     f"{args.peak_gflops[1]:.1f} at 2")
    lines += ["", "| S | mode | threads | ditops ms | PyTorch ms | ORT ms | ditops GFLOP/s | ditops fraction of peak "
              "| best peer / ditops |", "|---:|---|---:|---:|---:|---:|---:|---:|---:|"]
    for row in rows:
        ms = row["ms"]

        def cell(lib):
            return f"{ms[lib]:.0f}" if lib in ms else "failed"

        ours = ms.get("ditops")
        peers = [ms[lib] for lib in ("torch", "ort") if lib in ms]
        ratio = f"{min(peers) / ours:.2f}x" if ours and peers else ""
        fraction = ""
        if ours and args.peak_gflops:
            fraction = f'{row["gflops"]["ditops"] / args.peak_gflops[row["threads"] - 1]:.0%}'
        gflops = f'{row["gflops"]["ditops"]:.1f}' if ours else ""
        lines.append(f'| {row["seq"]} | {"causal" if row["causal"] else "non-causal"} | {row["threads"]} | '
                     f"{cell('ditops')} | {cell('torch')} | {cell('ort')} | {gflops} | {fraction} | {ratio} |")
    lines += ["", "best peer / ditops > 1 means ditops is faster. Chart: peers.svg."]
    with open(os.path.join(args.out, "peers.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    with open(os.path.join(args.out, "peers.json"), "w") as f:
        json.dump({"rows": rows, "versions": versions}, f, indent=1)
    svg_chart(rows, os.path.join(args.out, "peers.svg"))
    print(f"peers: wrote {args.out}/peers.md, peers.json, peers.svg")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    w = sub.add_parser("worker")
    w.add_argument("--lib", choices=["torch", "ort"], required=True)
    w.add_argument("--seq", type=int, required=True)
    w.add_argument("--causal", type=int, default=0)
    w.add_argument("--threads", type=int, default=1)
    w.add_argument("--reps", type=int, default=1)
    r = sub.add_parser("run")
    r.add_argument("--ditops", required=True, help="path of the ditops-attention-peer binary")
    r.add_argument("--out", default="out")
    r.add_argument("--rounds", type=int, default=3)
    r.add_argument("--quick", action="store_true", help="S=2048 at 2 threads only")
    r.add_argument("--peak-gflops", type=float, nargs=2, help="FP32 FMA peak at 1 and 2 threads")
    args = parser.parse_args()
    worker(args) if args.command == "worker" else run(args)


if __name__ == "__main__":
    main()
