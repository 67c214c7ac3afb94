#!/usr/bin/env bash
# ditops beside the libraries a user would pick instead, measured in one run, interleaved, at the
# same thread counts: attention beside PyTorch SDPA, ONNX Runtime's MultiHeadAttention and
# OpenVINO's scaled_dot_product_attention (fp32, and bf16 with its precision hint);
# RMSNorm, add_rms_norm and RoPE beside ONNX Runtime's SimplifiedLayerNormalization,
# SkipSimplifiedLayerNormalization and RotaryEmbedding. Writes DIR/peers.md (ms, GFLOP/s or GB/s,
# fraction of the FP32 FMA peak or of the memory triad, ratio), DIR/peers.json and DIR/peers.svg.
# Not part of tools/test.sh: it needs PyPI.
#
# Usage: tools/bench-peers.sh [--quick] [--rounds N] [--out DIR] [--build-dir DIR]
#                             [--only attention|rowwise] [--libs LIB...] [--rowwise-ops "OP ..."]
#                             [--rowwise-dtypes "DTYPE ..."] [--rowwise-threads "T ..."]
#   --quick          attention: S = 2048 at 2 threads only; row-wise: f32 and bf16 at 2 threads
#                    only (about two minutes in all; the full grids take about 10 minutes for
#                    attention and 5 for the row-wise operators)
#   --rounds N       interleaved rounds per shape (default 3; the table gives their median)
#   --out DIR        where the report goes (default out/)
#   --build-dir DIR  a release build tree with bench/ditops-attention-peer,
#                    bench/ditops-rowwise-peer and bench/ditops_bench already built (default:
#                    build/release, configured and built here)
#   --only PART      one table: attention (needs torch) or rowwise (needs onnxruntime only)
#   --libs LIB...    attention: only these of ditops torch ort ov ditops-bf16 ov-bf16 (while
#                    iterating on one kernel; the table keeps the others' columns empty)
#   --rowwise-ops, --rowwise-dtypes, --rowwise-threads
#                    row-wise cases to run (default: rms_norm add_rms_norm rope_half
#                    rope_interleaved, f32 bf16 f16, 2 1)
# Every case runs on line-aligned tensors and on tensors 16 bytes past a line (where glibc's
# malloc and numpy put large arrays); the tables show both.
# The virtual environment is the project's one, build/venv (DITOPS_PEERS_VENV or DITOPS_VENV
# override; tools/test.sh fills it with torch); what this script needs besides (onnxruntime,
# onnx, numpy, and torch and openvino for attention) is installed on the first run.
set -euo pipefail

out=out
build=""
only=""
peers_args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --quick) peers_args+=(--quick) ;;
    --libs)
      peers_args+=(--libs)
      while [ $# -ge 2 ] && [ "${2#--}" = "$2" ]; do
        peers_args+=("$2")
        shift
      done
      ;;
    --rounds | --out | --build-dir | --only | --rowwise-ops | --rowwise-dtypes | --rowwise-threads)
      [ $# -ge 2 ] || { echo "tools/bench-peers.sh: $1 needs a value" >&2; exit 2; }
      case "$1" in
        --rounds) peers_args+=(--rounds "$2") ;;
        --rowwise-*) read -ra values <<<"$2" && peers_args+=("$1" "${values[@]}") ;;
        --out) out=$(realpath -m -- "$2") ;;
        --build-dir) build=$(realpath -m -- "$2") ;;
        --only)
          case "$2" in
            attention | rowwise) only=$2 ;;
            *) echo "tools/bench-peers.sh: --only takes attention or rowwise" >&2; exit 2 ;;
          esac
          ;;
      esac
      shift
      ;;
    *)
      echo "usage: tools/bench-peers.sh [--quick] [--rounds N] [--out DIR] [--build-dir DIR]" \
        "[--only attention|rowwise] [--libs LIB...]" \
        "[--rowwise-ops|--rowwise-dtypes|--rowwise-threads LIST]" >&2
      exit 2
      ;;
  esac
  shift
done
cd "$(dirname "$0")/.."
source tools/setup.sh
ditops_ensure_packages python

venv=${DITOPS_PEERS_VENV:-$ditops_venv}
[ -x "$venv/bin/python" ] || python3 -m venv "$venv"
if ! "$venv/bin/python" -c 'import onnxruntime, onnx, numpy' 2>/dev/null; then
  "$venv/bin/pip" install -q onnxruntime onnx numpy
fi
if [ "$only" != rowwise ] && ! "$venv/bin/python" -c 'import torch' 2>/dev/null; then
  # The CPU-only torch wheel is a tenth of the default one; fall back to PyPI's when its index
  # is not reachable.
  "$venv/bin/pip" install -q --index-url https://download.pytorch.org/whl/cpu torch ||
    "$venv/bin/pip" install -q torch
fi
if [ "$only" != rowwise ] && ! "$venv/bin/python" -c 'import openvino' 2>/dev/null; then
  "$venv/bin/pip" install -q openvino
fi

if [ -z "$build" ]; then
  build=build/release
  cmake --preset release >/dev/null
  cmake --build --preset release --target ditops-attention-peer ditops-rowwise-peer ditops_bench
fi
mkdir -p "$out"
# The FP32 FMA and bf16 dot peaks and the memory triad at 1 and 2 threads, for the fraction
# columns (no bf16 figures where the CPU lacks AVX512-BF16).
limits=$("$build/bench/ditops_bench" --benchmark_filter='peak_fp32|peak_bf16|triad' \
  --benchmark_format=json | "$venv/bin/python" -c 'import json, sys
rows = json.load(sys.stdin)["benchmarks"]
for name in ("peak_fp32", "peak_bf16", "triad"):
    print(" ".join(str(r.get("GFLOP/s", r.get("GB/s"))) for r in rows
                   if name in r["name"] and ("GFLOP/s" in r or "GB/s" in r)))')
peak=$(sed -n 1p <<<"$limits")
bf16_peak=$(sed -n 2p <<<"$limits")
triad=$(sed -n 3p <<<"$limits")
limit_flags=()
[ "$(wc -w <<<"$peak")" -eq 2 ] && limit_flags+=(--peak-gflops $peak)
[ "$(wc -w <<<"$bf16_peak")" -eq 2 ] && limit_flags+=(--bf16-peak-gflops $bf16_peak)
[ "$(wc -w <<<"$triad")" -eq 2 ] && limit_flags+=(--triad-gbs $triad)
part_flags=()
[ "$only" = rowwise ] || part_flags+=(--ditops "$build/bench/ditops-attention-peer")
if [ "$only" != attention ]; then
  if [ -x "$build/bench/ditops-rowwise-peer" ]; then
    part_flags+=(--ditops-rowwise "$build/bench/ditops-rowwise-peer")
  else
    # A build tree given with --build-dir may predate the row-wise peer: keep the attention table.
    echo "tools/bench-peers.sh: no $build/bench/ditops-rowwise-peer (build that target):" \
      "skipping the RMSNorm/RoPE table" >&2
  fi
fi
"$venv/bin/python" bench/peers/peers.py run "${part_flags[@]}" --out "$out" "${limit_flags[@]}" \
  "${peers_args[@]}"
