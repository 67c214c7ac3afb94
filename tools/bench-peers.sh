#!/usr/bin/env bash
# ditops attention beside the libraries a user would pick instead (PyTorch SDPA, ONNX Runtime's
# MultiHeadAttention), measured in one run, interleaved, at the same thread counts. Writes
# out/peers.md (ms, GFLOP/s, fraction of the FP32 FMA peak, ratio), out/peers.json and
# out/peers.svg. Not part of tools/test.sh: it needs PyPI.
#
# Usage: tools/bench-peers.sh [--quick] [--rounds N]
#   --quick     S = 2048 at 2 threads only (about a minute; the default grid takes ~10 minutes)
# The virtual environment lives in build/peers-venv (DITOPS_PEERS_VENV overrides); it is created
# and filled (torch for the CPU, onnxruntime, onnx, numpy) on the first run.
set -euo pipefail
cd "$(dirname "$0")/.."
source tools/setup.sh
ditops_packages+=(python3 python3-venv)
ditops_ensure_packages

venv=${DITOPS_PEERS_VENV:-build/peers-venv}
if ! "$venv/bin/python" -c 'import torch, onnxruntime, onnx, numpy' 2>/dev/null; then
  python3 -m venv "$venv"
  # The CPU-only torch wheel is a tenth of the default one; fall back to PyPI's when its index
  # is not reachable.
  "$venv/bin/pip" install -q --index-url https://download.pytorch.org/whl/cpu torch ||
    "$venv/bin/pip" install -q torch
  "$venv/bin/pip" install -q onnxruntime onnx numpy
fi

cmake --preset release >/dev/null
cmake --build --preset release --target ditops-attention-peer ditops_bench
mkdir -p out
# The FP32 FMA peak at 1 and 2 threads, for the fraction-of-peak column.
peak=$(build/release/bench/ditops_bench --benchmark_filter='peak_fp32' --benchmark_format=json |
  "$venv/bin/python" -c 'import json, sys
rows = json.load(sys.stdin)["benchmarks"]
print(" ".join(str(r["GFLOP/s"]) for r in rows if "GFLOP/s" in r))')
peak_flag=()
[ "$(wc -w <<<"$peak")" -eq 2 ] && peak_flag=(--peak-gflops $peak)
"$venv/bin/python" bench/peers/peers.py run --ditops build/release/bench/ditops-attention-peer \
  --out out "${peak_flag[@]}" "$@"
