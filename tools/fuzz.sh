#!/usr/bin/env bash
# Runs the libFuzzer harnesses (fuzz/) long: builds them in the asan-ubsan preset (clang, ASan +
# UBSan), then runs each harness in turn from its seed corpus plus what earlier runs found
# (build/asan-ubsan/runs), and prints per harness the executions, the time and the rate. A crash
# stops with the harness's report and the input under build/asan-ubsan/runs/NAME/artifacts/
# (replay it: BINARY FILE).
# Each harness runs once per kernel variant this CPU can run: first the one dispatch picks,
# then capped (DITOPS_ISA) to each lower one, since users run every variant and a result may
# differ between them (bf16 dot products exist only in the avx512+bf16+vnni variant, say).
# Usage: tools/fuzz.sh [--runs N] [--time SECONDS] [--isa LIST] [--no-build] [HARNESS...]
#   --runs N       inputs per harness and variant (default 1000000)
#   --time S       stop each harness after S seconds per variant instead (-max_total_time)
#   --isa LIST     the DITOPS_ISA caps to run, comma-separated (default: every variant the CPU
#                  runs, from avx512 down to scalar; e.g. --isa avx512 for the best one only)
#   --no-build     run the harnesses as last built (a build of the tree may be under way)
#   HARNESS        names from fuzz/CMakeLists.txt (default: all)
# On a machine shared with other work: nice -n 19 tools/fuzz.sh ...
set -euo pipefail
cd "$(dirname "$0")/.."
runs=1000000 seconds="" build=1 harnesses=() caps=""
while [ $# -gt 0 ]; do
  case "$1" in
    --runs) runs=$2; shift 2 ;;
    --time) seconds=$2; shift 2 ;;
    --isa) caps=$2; shift 2 ;;
    --no-build) build=0; shift ;;
    -h|--help) sed -n '2,19p' "$0"; exit 0 ;;
    -*) echo "tools/fuzz.sh: unknown option $1" >&2; exit 2 ;;
    *) harnesses+=("$1"); shift ;;
  esac
done
if [ "$build" = 1 ]; then
  source tools/setup.sh
  ditops_ensure_packages fuzz
  cmake --preset asan-ubsan >/dev/null
  cmake --build --preset fuzz
  cmake --build --preset asan-ubsan --target ditops-info
fi
info=build/asan-ubsan/tools/ditops-info
[ -x "$info" ] || { echo "tools/fuzz.sh: no $info (run without --no-build once)" >&2; exit 2; }
# The kernel variant a cap selects on this CPU ("kernel variant" in ditops-info); caps that
# select a variant already listed (a level the CPU lacks is capped to one it has) are dropped.
variant_of() { DITOPS_ISA=$1 "$info" | sed -n 's/^ *kernel variant *//p'; }
declare -A variant_of_cap=() cap_of_variant=()
isas=()
for cap in $(echo "${caps:-avx512,avx512bw,avxvnni,avx2,sse4.2,scalar}" | tr ',' ' '); do
  variant=$(variant_of "$cap")
  if [ -z "$variant" ]; then
    echo "tools/fuzz.sh: DITOPS_ISA=$cap selects no kernel variant" >&2
    exit 2
  fi
  [ -z "${cap_of_variant[$variant]:-}" ] || continue
  cap_of_variant[$variant]=$cap
  variant_of_cap[$cap]=$variant
  isas+=("$cap")
done
if [ ${#harnesses[@]} -eq 0 ]; then
  harnesses=($(sed -n 's/^ditops_add_fuzzer(\([a-z_]*\) .*/\1/p' fuzz/CMakeLists.txt))
fi
limit=(-runs="$runs")
[ -n "$seconds" ] && limit=(-max_total_time="$seconds")
summary=()
for name in "${harnesses[@]}"; do
  [ -x "build/asan-ubsan/fuzz/$name" ] || { echo "tools/fuzz.sh: no harness $name" >&2; exit 2; }
  for cap in "${isas[@]}"; do
    variant=${variant_of_cap[$cap]}
    log=build/asan-ubsan/runs/$name.$cap.log
    mkdir -p build/asan-ubsan/runs
    echo "== $name, DITOPS_ISA=$cap ($variant; ${limit[*]})"
    start=$(date +%s%N)
    status=0
    DITOPS_ISA=$cap fuzz/run_fuzzer.sh "build/asan-ubsan/fuzz/$name" "fuzz/corpus/$name" \
      build/asan-ubsan/runs "${limit[@]}" >"$log" 2>&1 || status=$?
    executions=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
    line=$(awk -v name="$name" -v variant="$variant" -v runs="${executions:-0}" \
      -v ns=$(($(date +%s%N) - start)) 'BEGIN { s = ns / 1e9
        printf "%-18s %-17s %10d executions %8.1f s %8.0f exec/s",
          name, variant, runs, s, runs / s }')
    echo "$line"
    summary+=("$line")
    if [ "$status" -ne 0 ]; then
      tail -40 "$log"
      echo "tools/fuzz.sh: $name failed under DITOPS_ISA=$cap (exit $status); log $log" >&2
      exit 1
    fi
  done
done
echo "== summary"
printf '%s\n' "${summary[@]}"
