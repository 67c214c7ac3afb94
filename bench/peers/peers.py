#!/usr/bin/env python3
"""ditops beside the libraries a user would pick instead, in one run: attention beside PyTorch
SDPA, ONNX Runtime MultiHeadAttention and OpenVINO's scaled_dot_product_attention (fp32, and bf16
beside ditops on bf16 inputs); RMSNorm, add_rms_norm and RoPE beside ONNX Runtime's
SimplifiedLayerNormalization, SkipSimplifiedLayerNormalization and RotaryEmbedding.

Each measurement is a fresh process (`peers.py worker ...` / `peers.py rowwise-worker ...` for the
Python libraries, the ditops-attention-peer / ditops-rowwise-peer binaries for ditops) that makes
N(0, 1) inputs, runs one untimed call and then timed calls. Libraries take turns (A B C, A B C,
...) for `--rounds` rounds at the same thread count, so a slow phase of a shared machine hits all
of them alike; the table gives the median of all timed calls of the rounds. Every case runs
twice: on line-aligned buffers (as PyTorch's and ONNX Runtime's allocators place tensors) and
as allocated (16 bytes past a line, where glibc's malloc and numpy put large arrays). Run
through tools/bench-peers.sh, which makes the virtual environment.

    peers.py run [--ditops BIN] [--ditops-rowwise BIN] --out DIR [--rounds 3] [--quick]
                 [--peak-gflops X Y] [--bf16-peak-gflops X Y] [--triad-gbs X Y]
    peers.py worker --lib torch|ort|ov|ov-bf16 --seq S --causal 0|1 --threads T [--offset B]
    peers.py rowwise-worker --op OP --dtype f32|bf16|f16 --rows R --dim D [--heads N] --threads T
                            [--offset B]
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
LIBRARIES = ["ditops", "torch", "ort", "ov"]
# bf16 attention: ditops on bf16 inputs (its automatic choice), OpenVINO on the fp32 inputs with
# its bf16 inference precision hint (it converts inside, as a user of the hint would run it).
BF16_LIBRARIES = ["ditops-bf16", "ov-bf16"]
PEERS = ["torch", "ort", "ov"]
TITLES = {"ditops": "ditops", "torch": "PyTorch SDPA", "ort": "ONNX Runtime MHA",
          "ov": "OpenVINO SDPA", "ditops-bf16": "ditops bf16", "ov-bf16": "OpenVINO SDPA bf16 hint"}
# Bytes past a cache line where every tensor starts: aligned, and as glibc's malloc and numpy
# allocate large arrays.
PLACEMENTS = {0: "aligned", 16: "as allocated (16 B past a line)"}


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
        tq, tk, tv = (torch.from_numpy(placed(np, np.ascontiguousarray(x.transpose(0, 2, 1, 3)), args.offset))
                      for x in (q, k, v))

        def call():
            with torch.inference_mode():
                F.scaled_dot_product_attention(tq, tk, tv, is_causal=bool(args.causal))

        version = torch.__version__
    elif args.lib in ("ov", "ov-bf16"):
        import openvino as ov
        import openvino.opset13 as ops

        # BNSD, as for PyTorch: the layout OpenVINO's SDPA reads without a transpose.
        shape_bnsd = (BATCH, HEADS, args.seq, DIM)
        params = [ops.parameter(list(shape_bnsd), ov.Type.f32, name=name) for name in ("q", "k", "v")]
        sdpa = ops.scaled_dot_product_attention(*params, causal=bool(args.causal))
        precision = "bf16" if args.lib == "ov-bf16" else "f32"
        compiled = ov.Core().compile_model(
            ov.Model([sdpa], params), "CPU",
            {"INFERENCE_NUM_THREADS": args.threads, "INFERENCE_PRECISION_HINT": precision})
        request = compiled.create_infer_request()
        # Inputs bound once and shared with numpy (no copy per call), placed as asked; the arrays
        # must outlive the request (the tensors do not own them).
        inputs = [placed(np, np.ascontiguousarray(x.transpose(0, 2, 1, 3)), args.offset) for x in (q, k, v)]
        for i, x in enumerate(inputs):
            request.set_input_tensor(i, ov.Tensor(x, shared_memory=True))

        def call():
            request.infer()

        version = ov.__version__.split("-")[0]
    else:
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
        feeds = {name: placed(np, x.reshape(BATCH, args.seq, hidden), args.offset)
                 for name, x in zip(("query", "key", "value"), (q, k, v))}

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


# Row-wise operators on FLUX-like shapes: 4096 tokens of hidden 3072 (the block's norms), the
# per-head QK-norm over 24 heads of 128, and RoPE on [1, 4096, 24, 128] (BSND).
# (op, rows, heads, dim): x is [rows * heads, dim] for the norms, [1, rows, heads, dim] for RoPE.
ROWWISE_SHAPES = [
    ("rms_norm", 4096, 1, 3072),
    ("rms_norm", 4096, 24, 128),
    ("add_rms_norm", 4096, 1, 3072),
    ("add_rms_norm", 4096, 24, 128),
    ("rope_half", 4096, 24, 128),
    ("rope_interleaved", 4096, 24, 128),
]
ROWWISE_DTYPES = ["f32", "bf16", "f16"]
ROWWISE_THREADS = [2, 1]
ROWWISE_QUICK_DTYPES = ["f32", "bf16"]
ROWWISE_QUICK_THREADS = [2]
ROWWISE_LIBRARIES = ["ditops", "ort"]
ROWWISE_REPS = 5  # timed calls per process: a call moves 50-200 MB, a few ms
ORT_OPS = {"rms_norm": "SimplifiedLayerNormalization", "add_rms_norm": "SkipSimplifiedLayerNormalization",
           "rope_half": "RotaryEmbedding", "rope_interleaved": "RotaryEmbedding"}
ELEMENT_BYTES = {"f32": 4, "bf16": 2, "f16": 2}


def rowwise_bytes(op, rows, heads, dim, dtype):
    """Bytes the operator must move: x read and out written; add_rms_norm also reads the residual
    and writes the sum. Weights and RoPE tables (reused across rows) are not counted."""
    tensors = 4 if op == "add_rms_norm" else 2
    return tensors * rows * heads * dim * ELEMENT_BYTES[dtype]


def placed(np, array, offset):
    """A copy of `array` starting `offset` bytes past a 64-byte boundary (numpy itself puts large
    arrays 16 bytes past one; PyTorch aligns its tensors): every library is timed on the same
    layout."""
    raw = np.empty(array.nbytes + 128, dtype=np.uint8)
    start = -raw.ctypes.data % 64 + offset
    copy = raw[start:start + array.nbytes].view(array.dtype).reshape(array.shape)
    copy[...] = array
    return copy


def ort_value(np, ort, array, dtype, offset):
    """An OrtValue of the fp32 numpy `array` in `dtype`, `offset` bytes past a line (bf16 rounded
    to nearest even: numpy has no bf16, so its bits travel as uint16)."""
    from onnx import TensorProto

    if dtype == "f32":
        return ort.OrtValue.ortvalue_from_numpy(placed(np, np.asarray(array, dtype=np.float32), offset))
    if dtype == "f16":
        return ort.OrtValue.ortvalue_from_numpy(placed(np, np.asarray(array, dtype=np.float16), offset))
    bits = np.ascontiguousarray(array, dtype=np.float32).view(np.uint32)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
    return ort.OrtValue.ortvalue_from_numpy_with_onnx_type(placed(np, rounded, offset), TensorProto.BFLOAT16)


def rowwise_worker(args):
    """Times ONNX Runtime's counterpart of --op; prints {"ms": [...], "version": ...}."""
    import numpy as np
    import onnxruntime as ort
    from onnx import TensorProto, helper

    onnx_type = {"f32": TensorProto.FLOAT, "bf16": TensorProto.BFLOAT16, "f16": TensorProto.FLOAT16}[args.dtype]
    rng = np.random.default_rng(1)
    tokens = args.rows * args.heads
    feeds, outputs = {}, {}
    if args.op in ("rms_norm", "add_rms_norm"):
        shape = [1, tokens, args.dim]
        feeds["x"] = rng.standard_normal(shape, dtype=np.float32)
        feeds["weight"] = np.ones(args.dim, dtype=np.float32)
        if args.op == "rms_norm":
            node = helper.make_node(ORT_OPS[args.op], ["x", "weight"], ["out"], axis=-1, epsilon=1e-6)
            outputs = {"out": shape}
        else:
            feeds["residual"] = rng.standard_normal(shape, dtype=np.float32)
            # Outputs: normalized, mean, inv_std_var, input + skip (+ bias): ask for the first
            # and the last, as add_rms_norm writes out and sum_out.
            node = helper.make_node(ORT_OPS[args.op], ["x", "residual", "weight"], ["out", "", "", "sum"],
                                    domain="com.microsoft", epsilon=1e-6)
            outputs = {"out": shape, "sum": shape}
    else:
        shape = [1, args.rows, args.heads * args.dim]
        half = args.dim // 2
        angle = np.arange(args.rows)[:, None] * 10000.0 ** (-2.0 * np.arange(half)[None, :] / args.dim)
        feeds["x"] = rng.standard_normal(shape, dtype=np.float32)
        feeds["cos"] = np.cos(angle).astype(np.float32)
        feeds["sin"] = np.sin(angle).astype(np.float32)
        node = helper.make_node(ORT_OPS[args.op], ["x", "position", "cos", "sin"], ["out"], domain="com.microsoft",
                                num_heads=args.heads, interleaved=int(args.op == "rope_interleaved"))
        outputs = {"out": shape}
    inputs = [helper.make_tensor_value_info(name, onnx_type, list(value.shape)) for name, value in feeds.items()]
    if args.op.startswith("rope"):
        inputs.append(helper.make_tensor_value_info("position", TensorProto.INT64, [1]))
    graph = helper.make_graph([node], args.op, inputs,
                              [helper.make_tensor_value_info(name, onnx_type, s) for name, s in outputs.items()])
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
    options = ort.SessionOptions()
    options.intra_op_num_threads = args.threads
    options.inter_op_num_threads = 1
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    # Inputs and outputs bound once, as ditops gets them: the timed call is the operator alone,
    # without copying its result into a new numpy array.
    binding = session.io_binding()
    for name, value in feeds.items():
        binding.bind_ortvalue_input(name, ort_value(np, ort, value, args.dtype, args.offset))
    if args.op.startswith("rope"):
        binding.bind_ortvalue_input("position", ort.OrtValue.ortvalue_from_numpy(np.zeros(1, dtype=np.int64)))
    for name, s in outputs.items():
        empty = np.zeros(s, dtype=np.float32)
        binding.bind_ortvalue_output(name, ort_value(np, ort, empty, args.dtype, args.offset))

    session.run_with_iobinding(binding)
    times = []
    for _ in range(args.reps):
        start = time.perf_counter()
        session.run_with_iobinding(binding)
        times.append((time.perf_counter() - start) * 1e3)
    print(json.dumps({"library": "ort", "version": ort.__version__, "ms": times}))


def measure_rowwise(library, ditops_bin, op, rows, heads, dim, dtype, threads, offset):
    flags = ["--op", op, "--dtype", dtype, "--rows", rows, "--heads", heads, "--dim", dim, "--threads", threads,
             "--reps", ROWWISE_REPS, "--offset", offset]
    if library == "ditops":
        command = [ditops_bin] + flags
    else:
        command = [sys.executable, os.path.abspath(__file__), "rowwise-worker"] + flags
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    result = subprocess.run([str(c) for c in command], capture_output=True, text=True, env=env)
    if result.returncode != 0:
        message = result.stderr.strip().splitlines()
        raise RuntimeError(message[-1][-300:] if message else f"exit {result.returncode}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def run_rowwise(args):
    """Interleaved rounds of ditops and ONNX Runtime on every row-wise case; returns the table."""
    dtypes = args.rowwise_dtypes or (ROWWISE_QUICK_DTYPES if args.quick else ROWWISE_DTYPES)
    thread_counts = args.rowwise_threads or (ROWWISE_QUICK_THREADS if args.quick else ROWWISE_THREADS)
    rows, versions = [], {}
    cases = [(op, tokens, heads, dim, dtype, threads, offset)
             for op, tokens, heads, dim in ROWWISE_SHAPES if not args.rowwise_ops or op in args.rowwise_ops
             for dtype in dtypes for threads in thread_counts for offset in PLACEMENTS]
    for op, tokens, heads, dim, dtype, threads, offset in cases:
        samples = {lib: [] for lib in ROWWISE_LIBRARIES}
        failures = {}
        for _ in range(args.rounds):
            for lib in ROWWISE_LIBRARIES:
                if lib in failures:
                    continue
                try:
                    result = measure_rowwise(lib, args.ditops_rowwise, op, tokens, heads, dim, dtype, threads,
                                             offset)
                except RuntimeError as error:
                    failures[lib] = str(error)
                    continue
                samples[lib].extend(result["ms"])
                versions[lib] = f'ISA {result["isa"]}' if lib == "ditops" else result["version"]
        medians = {lib: statistics.median(v) for lib, v in samples.items() if v}
        moved = rowwise_bytes(op, tokens, heads, dim, dtype)
        row = {"op": op, "tokens": tokens, "heads": heads, "dim": dim, "dtype": dtype, "threads": threads,
               "offset": offset, "ms": medians, "gbs": {lib: moved / ms / 1e6 for lib, ms in medians.items()},
               "failures": failures}
        rows.append(row)
        print(f"{op} {dtype} [{tokens}x{heads}, {dim}] threads={threads} offset={offset}: " +
              ", ".join(f"{lib} {ms:.2f} ms" for lib, ms in medians.items()), flush=True)
        for lib, error in failures.items():
            print(f"  {lib}: {error}", file=sys.stderr)
    return rows, versions


def rowwise_table(rows, versions, args):
    lines = ["", "# RMSNorm, add_rms_norm and RoPE beside ONNX Runtime", "",
             "ditops rms_norm / add_rms_norm / rotary_position_embedding against ONNX Runtime's "
             "SimplifiedLayerNormalization / SkipSimplifiedLayerNormalization (com.microsoft, asked for its "
             "output and its input + skip sum, as add_rms_norm writes both) / RotaryEmbedding (com.microsoft; "
             "cos/sin caches [S, D/2], position_ids [1]; ditops: [S, D] tables in the dtype of x). Weights "
             "in the dtype of x, eps 1e-6, inputs and outputs bound before timing (ONNX Runtime: IO binding). "
             f"Median of {args.rounds} interleaved rounds of {ROWWISE_REPS} timed calls each (after one "
             "untimed call), same thread count for both libraries; every tensor on a cache line (aligned) or "
             "16 bytes past one (as allocated by malloc and numpy), for both libraries alike. GB/s counts x read and out written "
             "(add_rms_norm: x and residual read, out and sum written); tables and weights are not counted.",
             ""]
    for lib in ROWWISE_LIBRARIES:
        if lib in versions:
            lines.append(f'- {"ditops" if lib == "ditops" else "ONNX Runtime"}: {versions[lib]}')
    if args.triad_gbs:
        lines.append(f"- memory triad measured by ditops_bench (best of ordinary and streaming stores): "
                     f"{args.triad_gbs[0]:.1f} GB/s at 1 thread, {args.triad_gbs[1]:.1f} at 2")
    lines += ["", "| operator | x shape | dtype | threads | buffers | ditops ms | ORT ms | ditops GB/s | ORT GB/s "
              "| ditops fraction of triad | ORT fraction of triad | ORT / ditops |",
              "|---|---|---|---:|---|---:|---:|---:|---:|---:|---:|---:|"]
    for row in rows:
        ms, gbs = row["ms"], row["gbs"]
        shape = (f'[1, {row["tokens"]}, {row["heads"]}, {row["dim"]}]' if row["op"].startswith("rope")
                 else f'[{row["tokens"] * row["heads"]}, {row["dim"]}]')

        def cell(lib, values, fmt):
            if lib in values:
                return format(values[lib], fmt)
            return "not supported" if "NOT_IMPLEMENTED" in row["failures"].get(lib, "") else "failed"

        def fraction(lib):
            if lib not in gbs or not args.triad_gbs:
                return ""
            return f'{gbs[lib] / args.triad_gbs[row["threads"] - 1]:.0%}'

        ratio = f'{ms["ort"] / ms["ditops"]:.2f}x' if "ort" in ms and "ditops" in ms else ""
        lines.append(f'| {row["op"]} | {shape} | {row["dtype"]} | {row["threads"]} | {PLACEMENTS[row["offset"]]} | '
                     f'{cell("ditops", ms, ".2f")} | '
                     f'{cell("ort", ms, ".2f")} | {cell("ditops", gbs, ".1f")} | {cell("ort", gbs, ".1f")} | '
                     f'{fraction("ditops")} | {fraction("ort")} | {ratio} |')
    lines += ["", "ORT / ditops > 1 means ditops is faster."]
    return lines


def measure(library, ditops_bin, seq, causal, threads, offset, tune_cache=None):
    if library.startswith("ditops"):
        command = [ditops_bin, "--seq", seq, "--heads", HEADS, "--dim", DIM, "--causal", int(causal),
                   "--threads", threads, "--dtype", "bf16" if library == "ditops-bf16" else "f32",
                   "--offset", offset]
    else:
        command = [sys.executable, os.path.abspath(__file__), "worker", "--lib", library, "--seq", seq,
                   "--causal", int(causal), "--threads", threads, "--offset", offset]
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    if library.startswith("ditops") and tune_cache:
        # The first call of a shape tunes (several full runs): once per shape, not per round.
        env["DITOPS_TUNE_CACHE"] = tune_cache
    result = subprocess.run([str(c) for c in command], capture_output=True, text=True, env=env)
    if result.returncode != 0:
        raise RuntimeError(f"{library} failed: {result.stderr.strip()[-400:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def svg_chart(rows, path):
    """Grouped bars of GFLOP/s per shape, one colour per library."""
    colours = {"ditops": "#1f77b4", "torch": "#ff7f0e", "ort": "#2ca02c", "ov": "#9467bd"}
    width_bar, gap, left, top, height = 18, 22, 60, 30, 220
    best = max((r["gflops"][lib] for r in rows for lib in LIBRARIES if lib in r["gflops"]), default=1.0)
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
        label = f'S={row["seq"]} {"causal" if row["causal"] else "full"} {row["threads"]}t' + \
            (f' +{row["offset"]}B' if row["offset"] else "")
        parts.append(f'<text transform="translate({x0 + 4},{top + height + 8}) rotate(60)">{label}</text>')
    parts.append(f'<line x1="{left - 4}" y1="{top + height}" x2="{width - 10}" y2="{top + height}" stroke="black"/>')
    parts.append(f'<text x="4" y="{top + 10}">{best:.0f}</text><text x="4" y="{top + height}">0</text>')
    parts.append("</svg>")
    with open(path, "w") as f:
        f.write("\n".join(parts) + "\n")


def run(args):
    os.makedirs(args.out, exist_ok=True)
    lines, report = [], {}
    if args.ditops:
        lines, report["attention"] = run_attention(args)
    if args.ditops_rowwise:
        rowwise_rows, rowwise_versions = run_rowwise(args)
        lines += rowwise_table(rowwise_rows, rowwise_versions, args)
        report["rowwise"] = {"rows": rowwise_rows, "versions": rowwise_versions}
    with open(os.path.join(args.out, "peers.md"), "w") as f:
        f.write("\n".join(lines).lstrip("\n") + "\n")
    with open(os.path.join(args.out, "peers.json"), "w") as f:
        json.dump(report, f, indent=1)
    written = "peers.md, peers.json" + (", peers.svg" if args.ditops else "")
    print(f"peers: wrote {args.out}/{written}")


def run_attention(args):
    """Interleaved rounds of ditops, PyTorch, ONNX Runtime and OpenVINO attention (fp32), and of
    ditops and OpenVINO in bf16; returns the report lines and the measurements, and draws
    peers.svg."""
    shapes = QUICK_SHAPES if args.quick else SHAPES
    libraries = [lib for lib in LIBRARIES + BF16_LIBRARIES if not args.libs or lib in args.libs]
    rows = []
    versions = {}
    for seq, causal, threads, offset in [shape + (offset,) for shape in shapes for offset in PLACEMENTS]:
        samples = {lib: [] for lib in libraries}
        failures = {}
        for _ in range(args.rounds):
            for lib in libraries:
                if lib in failures:
                    continue
                try:
                    result = measure(lib, args.ditops, seq, causal, threads, offset,
                                     os.path.join(args.out, "peers-tune-cache.json"))
                except RuntimeError as error:
                    failures[lib] = str(error)
                    continue
                samples[lib].extend(result["ms"])
                versions[lib] = result.get("version") or result.get("isa", "")
                if lib.startswith("ditops"):
                    versions[lib] = f'backend {result["backend"]} ({result["detail"]}), ISA {result["isa"]}'
        medians = {lib: statistics.median(v) for lib, v in samples.items() if v}
        row = {"seq": seq, "causal": causal, "threads": threads, "offset": offset, "ms": medians,
               "gflops": {lib: flops(seq, causal) / ms / 1e6 for lib, ms in medians.items()},
               "failures": failures}
        rows.append(row)
        print(f"S={seq} causal={int(causal)} threads={threads} offset={offset}: " +
              ", ".join(f"{lib} {ms:.0f} ms" for lib, ms in medians.items()), flush=True)
        for lib, error in failures.items():
            print(f"  {lib}: {error}", file=sys.stderr)
    lines = ["# ditops attention beside its peers", "",
             f"FLUX self-attention, B=1, N={HEADS}, D={DIM}, BSND inputs (PyTorch and OpenVINO: BNSD). "
             f"Median of {args.rounds} interleaved rounds (one timed call each, after one untimed call), "
             "same thread count for every library; q, k, v and out on a cache line (aligned) or 16 bytes past "
             "one (as allocated by malloc and numpy), for every library alike. fp32 table: fp32 inputs "
             "everywhere; bf16 table: ditops on bf16 inputs (its automatic choice), OpenVINO on the fp32 "
             "inputs with INFERENCE_PRECISION_HINT bf16 (it converts inside).", ""]
    for lib in LIBRARIES + BF16_LIBRARIES:
        if lib in versions:
            lines.append(f"- {TITLES[lib]}: {versions[lib]}")
    if args.peak_gflops:
        lines.append(f"- FP32 FMA peak measured by ditops_bench: {args.peak_gflops[0]:.1f} GFLOP/s at 1 thread, "
                     f"{args.peak_gflops[1]:.1f} at 2")
    if args.bf16_peak_gflops:
        lines.append(f"- bf16 dot (vdpbf16ps) peak measured by ditops_bench: {args.bf16_peak_gflops[0]:.1f} "
                     f"GFLOP/s at 1 thread, {args.bf16_peak_gflops[1]:.1f} at 2")

    def table(ours_lib, peers, peak):
        out = ["", f"| S | mode | threads | buffers | {TITLES[ours_lib]} ms | " +
               " | ".join(f"{TITLES[lib]} ms" for lib in peers) +
               " | ditops GFLOP/s | ditops fraction of peak | best peer / ditops |",
               "|---:|---|---:|---|---:|" + "---:|" * len(peers) + "---:|---:|---:|"]
        for row in rows:
            ms = row["ms"]
            if ours_lib not in ms and not any(lib in ms for lib in peers):
                continue
            ours = ms.get(ours_lib)
            present = [ms[lib] for lib in peers if lib in ms]
            ratio = f"{min(present) / ours:.2f}x" if ours and present else ""
            fraction = ""
            if ours and peak:
                fraction = f'{row["gflops"][ours_lib] / peak[row["threads"] - 1]:.0%}'
            gflops = f'{row["gflops"][ours_lib]:.1f}' if ours else ""
            cells = " | ".join(f"{ms[lib]:.0f}" if lib in ms else "failed" if lib in row["failures"] else ""
                               for lib in [ours_lib] + peers)
            out.append(f'| {row["seq"]} | {"causal" if row["causal"] else "non-causal"} | {row["threads"]} | '
                       f'{PLACEMENTS[row["offset"]]} | {cells} | {gflops} | {fraction} | {ratio} |')
        return out

    if any(lib in libraries for lib in LIBRARIES):
        lines += ["", "## fp32"] + table("ditops", [lib for lib in PEERS if lib in libraries], args.peak_gflops)
    if any(lib in libraries for lib in BF16_LIBRARIES):
        lines += ["", "## bf16 (fraction of the bf16 dot peak)"] + table("ditops-bf16", ["ov-bf16"],
                                                                          args.bf16_peak_gflops)
    lines += ["", "best peer / ditops > 1 means ditops is faster. Chart (fp32): peers.svg."]
    svg_chart(rows, os.path.join(args.out, "peers.svg"))
    return lines, {"rows": rows, "versions": versions}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    w = sub.add_parser("worker")
    w.add_argument("--lib", choices=["torch", "ort", "ov", "ov-bf16"], required=True)
    w.add_argument("--seq", type=int, required=True)
    w.add_argument("--causal", type=int, default=0)
    w.add_argument("--threads", type=int, default=1)
    w.add_argument("--reps", type=int, default=1)
    w.add_argument("--offset", type=int, default=0, help="bytes past a cache line where tensors start")
    rw = sub.add_parser("rowwise-worker")
    rw.add_argument("--op", choices=sorted(ORT_OPS), required=True)
    rw.add_argument("--dtype", choices=ROWWISE_DTYPES, default="f32")
    rw.add_argument("--rows", type=int, required=True)
    rw.add_argument("--heads", type=int, default=1)
    rw.add_argument("--dim", type=int, required=True)
    rw.add_argument("--threads", type=int, default=1)
    rw.add_argument("--reps", type=int, default=1)
    rw.add_argument("--offset", type=int, default=0, help="bytes past a cache line where tensors start")
    r = sub.add_parser("run")
    r.add_argument("--ditops", help="path of the ditops-attention-peer binary (attention table)")
    r.add_argument("--ditops-rowwise", help="path of the ditops-rowwise-peer binary (RMSNorm/RoPE table)")
    r.add_argument("--out", default="out")
    r.add_argument("--rounds", type=int, default=3)
    r.add_argument("--quick", action="store_true",
                   help="attention: S=2048 at 2 threads only; row-wise: f32 and bf16 at 2 threads only")
    r.add_argument("--peak-gflops", type=float, nargs=2, help="FP32 FMA peak at 1 and 2 threads")
    r.add_argument("--bf16-peak-gflops", type=float, nargs=2, help="bf16 dot peak at 1 and 2 threads")
    r.add_argument("--libs", nargs="+", choices=LIBRARIES + BF16_LIBRARIES,
                   help="attention: only these libraries (default: all)")
    r.add_argument("--triad-gbs", type=float, nargs=2, help="memory triad GB/s at 1 and 2 threads")
    r.add_argument("--rowwise-ops", nargs="+", choices=sorted(ORT_OPS), help="row-wise operators (default: all)")
    r.add_argument("--rowwise-dtypes", nargs="+", choices=ROWWISE_DTYPES, help="row-wise dtypes (default: all)")
    r.add_argument("--rowwise-threads", nargs="+", type=int, help="row-wise thread counts (default: 2 1)")
    args = parser.parse_args()
    {"worker": worker, "rowwise-worker": rowwise_worker, "run": run}[args.command](args)


if __name__ == "__main__":
    main()
