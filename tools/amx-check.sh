#!/usr/bin/env bash
# AMX on this machine, in one command: detects Intel's tile units (as the library does), builds,
# runs the AMX tests on the real instructions (and the tile model's everywhere), then times the
# AMX kernels (the W8A8 GEMM, the bf16 linear layer, flash_bf16 and int8 attention) beside the
# AVX-512 ones of the same build and beside the peers a user would pick (oneDNN's int8 and bf16
# matmul, PyTorch's bf16 scaled_dot_product_attention where torch is installed), all in this one
# run, and writes a table. Meant for a machine lent for minutes: it finishes in about ten minutes
# on 16 cores, most of it the build.
#
# Usage: tools/amx-check.sh [--build-dir DIR] [--out DIR] [--threads N] [--reps N]
#   --build-dir DIR  release build tree to use or make (default build/amx-check)
#   --out DIR        where the table and the raw results go (default out/amx-check)
#   --threads N      threads of every timed call (default 2, as every figure of bench/RESULTS.md)
#   --reps N         repetitions of each timing; the table gives their median (default 5)
#   --time-anyway    time even where AMX is not used (both ditops columns are then AVX-512: a
#                    check of this script, not of AMX)
# Exit status: 0 when every test passed (the timings are reported, never judged), 1 when a test
# failed, 2 on bad arguments. A CPU without AMX (or with AMX hidden by its hypervisor) runs the
# tests on the tile model, times nothing, and says why; the expected AMX figures are then the
# model's in docs/operators.md (section AMX).
set -euo pipefail

build=build/amx-check
out=out/amx-check
threads=2
reps=5
time_anyway=0
while [ $# -gt 0 ]; do
  case "$1" in
    --build-dir | --out | --threads | --reps)
      [ $# -ge 2 ] || { echo "tools/amx-check.sh: $1 needs a value" >&2; exit 2; }
      case "$1" in
        --build-dir) build=$2 ;;
        --out) out=$2 ;;
        --threads) threads=$2 ;;
        --reps) reps=$2 ;;
      esac
      shift
      ;;
    --time-anyway) time_anyway=1 ;;
    -h | --help) sed -n '2,18p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "tools/amx-check.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done
for number in "$threads" "$reps"; do
  [[ "$number" =~ ^[1-9][0-9]*$ ]] || { echo "tools/amx-check.sh: not a count: $number" >&2; exit 2; }
done

cd "$(dirname "$0")/.."
source tools/setup.sh
ditops_ensure_packages demo  # the build, and oneDNN as the int8 peer
mkdir -p "$out"
build=$(realpath -m -- "$build")
out=$(realpath -- "$out")

echo "== build ($build, $(nproc) jobs)"
if [ ! -f "$build/CMakeCache.txt" ]; then
  cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DDITOPS_PYTHON=OFF >"$out/configure.log"
fi
cmake --build "$build" -j "$(nproc)" --target ditops_tests ditops-info ditops_bench \
  ditops_linear_bench >"$out/build.log"

echo "== detection"
"$build/tools/ditops-info" | tee "$out/ditops-info.txt"
unit_status() {  # "used" or the reason ditops-info gives for amx int8 / amx bf16
  local line
  line=$(grep -m1 "^  amx $1 " "$out/ditops-info.txt" | sed "s/^  amx $1 *//")
  case "$line" in
    "not used: "*) echo "${line#not used: }" ;;
    "") echo "not reported by ditops-info" ;;
    *) echo used ;;
  esac
}
int8_status=$(unit_status int8)
bf16_status=$(unit_status bf16)

echo "== tests"
tests_failed=0
run_tests() {  # label, log, then the environment and arguments
  local label=$1 log=$2
  shift 2
  if env "$@" --gtest_brief=1 >"$log" 2>&1; then
    echo "passed: $label: $(grep -E '^\[  (PASSED|SKIPPED) +\] [0-9]+ test' "$log" | tr -s ' ' |
      paste -sd ' ')"
  else
    tests_failed=1
    echo "FAILED: $label (see $log)"
    grep -E '^\[  FAILED  \]' "$log" | head -20 || true
  fi
}
# The tile model's programs and, where AMX is used, the library's kernels on the instructions
# against the AVX-512 kernels of the same variant (bit for bit for int8).
run_tests "AMX tests" "$out/tests-amx.log" "$build/tests/ditops_tests" --gtest_filter='*Amx*'
if [ "$int8_status" = used ] || [ "$bf16_status" = used ]; then
  # Every operator at the AMX level, against its references: the layers and attention calls
  # that run on tiles here.
  run_tests "whole suite, DITOPS_ISA=amx" "$out/tests-suite.log" DITOPS_ISA=amx \
    "$build/tests/ditops_tests"
fi

if [ "$int8_status" != used ] && [ "$bf16_status" != used ] && [ "$time_anyway" = 0 ]; then
  {
    echo "# AMX check: $(grep -m1 'model name' /proc/cpuinfo | sed 's/.*: //')"
    echo
    echo "No AMX used here (int8: $int8_status; bf16: $bf16_status): nothing timed."
    echo "The tests ran the AMX kernels on the tile model. Expected figures: docs/operators.md, AMX."
  } >"$out/amx-check.md"
  cat "$out/amx-check.md"
  exit "$tests_failed"
fi

echo "== timing ($threads threads, median of $reps)"
bench_flags=(--benchmark_repetitions="$reps" --benchmark_report_aggregates_only=true
             --benchmark_format=json)
# The W8A8 layer at FLUX's [4608 tokens, 3072] -> 3072 (dynamic and static activations) and
# oneDNN's s8 x s8 matmul of the same size, a bf16 FLOAT layer [4096, 3072] -> 3072 and oneDNN's
# bf16 matmul, with AMX and capped to AVX-512 (vpdpbusd, vdpbf16ps).
linear_filter="(BM_linear/shape:0/kind:[014]/threads:$threads/misaligned:0|BM_linear_bf16/shape:0/"
linear_filter+="x_f32:0/threads:$threads/misaligned:0|BM_dnnl_bf16/shape:0/threads:$threads)/"
attention_filter="(attention_flash_bf16/shape:2/threads:$threads/eigen:0|attention_int8/shape:2/"
attention_filter+="threads:$threads/chunk:2/flash:0)/misaligned:0/"
for isa in amx avx512; do
  DITOPS_ISA=$isa "$build/bench/ditops_linear_bench" --benchmark_filter="$linear_filter" \
    "${bench_flags[@]}" --benchmark_out="$out/linear-$isa.json" >/dev/null 2>>"$out/bench.log"
  DITOPS_ISA=$isa "$build/bench/ditops_bench" --benchmark_filter="$attention_filter" \
    "${bench_flags[@]}" --benchmark_out="$out/attention-$isa.json" >/dev/null 2>>"$out/bench.log"
done

# PyTorch's bf16 SDPA at the same shape (B 1, 24 heads, S 4608, d 128), where torch imports.
python=""
for candidate in "${DITOPS_VENV:-build/venv}/bin/python" python3; do
  if command -v "$candidate" >/dev/null && "$candidate" -c "import torch" 2>/dev/null; then
    python=$candidate
    break
  fi
done
if [ -n "$python" ]; then
  "$python" - "$threads" "$reps" >"$out/torch.json" <<'PY'
import json, statistics, sys, time
import torch
threads, reps = int(sys.argv[1]), int(sys.argv[2])
torch.set_num_threads(threads)
q, k, v = (torch.randn(1, 24, 4608, 128).to(torch.bfloat16) for _ in range(3))
sdpa = torch.nn.functional.scaled_dot_product_attention
with torch.no_grad():
    sdpa(q, k, v)
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        sdpa(q, k, v)
        times.append(time.perf_counter() - start)
print(json.dumps({"torch": torch.__version__, "ms": 1e3 * statistics.median(times)}))
PY
else
  echo '{}' >"$out/torch.json"
fi

python3 - "$out" "$threads" "$reps" "$int8_status" "$bf16_status" >"$out/amx-check.md" <<'PY'
import json, pathlib, sys
out, threads, reps, int8_status, bf16_status = sys.argv[1:]
out = pathlib.Path(out)

def medians(path):
    """name -> median real time in ms of a Google Benchmark JSON file."""
    result = {}
    for entry in json.loads(path.read_text())["benchmarks"]:
        # The median of the repetitions; a single run (--reps 1) has no aggregates.
        if entry.get("aggregate_name") == "median" or (
                entry.get("run_type") == "iteration" and entry["run_name"] not in result):
            scale = {"ns": 1e-6, "us": 1e-3, "ms": 1.0, "s": 1e3}[entry["time_unit"]]
            result[entry["run_name"]] = (entry["real_time"] * scale, entry.get("label", ""))
    return result

def find(times, text):
    return next(((ms, label) for name, (ms, label) in times.items() if text in name), (None, ""))

linear = {isa: medians(out / f"linear-{isa}.json") for isa in ("amx", "avx512")}
attention = {isa: medians(out / f"attention-{isa}.json") for isa in ("amx", "avx512")}
torch = json.loads((out / "torch.json").read_text())
cpu = next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if "model name" in line)

def ms(value):
    return "-" if value is None else f"{value:.2f}"

def ratio(a, b):
    return "-" if a is None or b is None else f"{b / a:.2f}x"

rows = []
for kind, text in (("W8A8_DYNAMIC layer", "kind:0/"), ("W8A8 static layer", "kind:1/")):
    amx, _ = find(linear["amx"], text)
    avx, _ = find(linear["avx512"], text)
    dnnl, _ = find(linear["amx"], "kind:4/")
    rows.append((f"{kind} [4608, 3072] -> 3072", amx, avx, "oneDNN s8s8 matmul", dnnl,
                 ">= 1.0x oneDNN"))
amx, _ = find(linear["amx"], "BM_linear_bf16/")
avx, _ = find(linear["avx512"], "BM_linear_bf16/")
dnnl, _ = find(linear["amx"], "BM_dnnl_bf16/")
rows.append(("bf16 FLOAT layer [4096, 3072] -> 3072", amx, avx, "oneDNN bf16 matmul", dnnl, ""))
torch_name = f"torch {torch.get('torch', '(not installed)')} bf16 SDPA"
for call, text, target in (("flash_bf16 attention", "attention_flash_bf16", ">= 1.2x torch"),
                           ("int8 attention (chunk 2)", "attention_int8", "")):
    amx, _ = find(attention["amx"], text)
    avx, _ = find(attention["avx512"], text)
    rows.append((f"{call}, B 1, H 24, S 4608, d 128", amx, avx, torch_name, torch.get("ms"),
                 target))

print(f"# AMX check: {cpu}")
print()
print(f"AMX int8: {int8_status}; AMX bf16: {bf16_status}. {threads} threads, median of {reps} "
      "(ms). AMX and AVX-512 are the same build, DITOPS_ISA unset and =avx512; peers in the "
      "same run (oneDNN in the AMX run's process, torch in its own).")
print()
print("| call | ditops AMX | ditops AVX-512 | AMX speed-up | peer | peer ms | ditops AMX vs peer | target |")
print("|---|---|---|---|---|---|---|---|")
for call, amx, avx, peer, peer_ms, target in rows:
    print(f"| {call} | {ms(amx)} | {ms(avx)} | {ratio(amx, avx)} | {peer} | {ms(peer_ms)} | "
          f"{ratio(amx, peer_ms)} | {target} |")
PY
cat "$out/amx-check.md"
exit "$tests_failed"
