#!/usr/bin/env bash
# ditops attention beside the libraries a user would pick instead (PyTorch SDPA, ONNX Runtime's
# MultiHeadAttention), measured in one run, interleaved, at the same thread counts. Writes
# DIR/peers.md (ms, GFLOP/s, fraction of the FP32 FMA peak, ratio), DIR/peers.json and
# DIR/peers.svg. Not part of tools/test.sh: it needs PyPI.
#
# Usage: tools/bench-peers.sh [--quick] [--rounds N] [--out DIR] [--build-dir DIR]
#   --quick          S = 2048 at 2 threads only (about a minute; the full grid of S = 2048 and
#                    4608, causal and not, 1 and 2 threads takes about 10 minutes)
#   --rounds N       interleaved rounds per shape (default 3; the table gives their median)
#   --out DIR        where the report goes (default out/)
#   --build-dir DIR  a release build tree with bench/ditops-attention-peer and bench/ditops_bench
#                    already built (default: build/release, configured and built here)
# The virtual environment lives in build/peers-venv (DITOPS_PEERS_VENV overrides); it is created
# and filled (torch for the CPU, onnxruntime, onnx, numpy) on the first run.
set -euo pipefail

out=out
build=""
peers_args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --quick) peers_args+=(--quick) ;;
    --rounds | --out | --build-dir)
      [ $# -ge 2 ] || { echo "tools/bench-peers.sh: $1 needs a value" >&2; exit 2; }
      case "$1" in
        --rounds) peers_args+=(--rounds "$2") ;;
        --out) out=$(realpath -m -- "$2") ;;
        --build-dir) build=$(realpath -m -- "$2") ;;
      esac
      shift
      ;;
    *)
      echo "usage: tools/bench-peers.sh [--quick] [--rounds N] [--out DIR] [--build-dir DIR]" >&2
      exit 2
      ;;
  esac
  shift
done
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

if [ -z "$build" ]; then
  build=build/release
  cmake --preset release >/dev/null
  cmake --build --preset release --target ditops-attention-peer ditops_bench
fi
mkdir -p "$out"
# The FP32 FMA peak at 1 and 2 threads, for the fraction-of-peak column.
peak=$("$build/bench/ditops_bench" --benchmark_filter='peak_fp32' --benchmark_format=json |
  "$venv/bin/python" -c 'import json, sys
rows = json.load(sys.stdin)["benchmarks"]
print(" ".join(str(r["GFLOP/s"]) for r in rows if "GFLOP/s" in r))')
peak_flag=()
[ "$(wc -w <<<"$peak")" -eq 2 ] && peak_flag=(--peak-gflops $peak)
"$venv/bin/python" bench/peers/peers.py run --ditops "$build/bench/ditops-attention-peer" \
  --out "$out" "${peak_flag[@]}" "${peers_args[@]}"
