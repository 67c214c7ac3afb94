#!/usr/bin/env bash
# Runs the libFuzzer harnesses (fuzz/) long: builds them in the asan-ubsan preset (clang, ASan +
# UBSan), then runs each harness in turn from its seed corpus plus what earlier runs found
# (build/asan-ubsan/runs), and prints per harness the executions, the time and the rate. A crash
# stops with the harness's report and the input under build/asan-ubsan/runs/NAME/artifacts/
# (replay it: BINARY FILE).
# Usage: tools/fuzz.sh [--runs N] [--time SECONDS] [--no-build] [HARNESS...]
#   --runs N       inputs per harness (default 1000000)
#   --time S       stop each harness after S seconds instead (libFuzzer -max_total_time)
#   --no-build     run the harnesses as last built (a build of the tree may be under way)
#   HARNESS        names from fuzz/CMakeLists.txt (default: all)
# On a machine shared with other work: nice -n 19 tools/fuzz.sh ...
set -euo pipefail
cd "$(dirname "$0")/.."
runs=1000000 seconds="" build=1 harnesses=()
while [ $# -gt 0 ]; do
  case "$1" in
    --runs) runs=$2; shift 2 ;;
    --time) seconds=$2; shift 2 ;;
    --no-build) build=0; shift ;;
    -h|--help) sed -n '2,13p' "$0"; exit 0 ;;
    -*) echo "tools/fuzz.sh: unknown option $1" >&2; exit 2 ;;
    *) harnesses+=("$1"); shift ;;
  esac
done
if [ "$build" = 1 ]; then
  source tools/setup.sh
  ditops_ensure_packages fuzz
  cmake --preset asan-ubsan >/dev/null
  cmake --build --preset fuzz
fi
if [ ${#harnesses[@]} -eq 0 ]; then
  harnesses=($(sed -n 's/^ditops_add_fuzzer(\([a-z_]*\) .*/\1/p' fuzz/CMakeLists.txt))
fi
limit=(-runs="$runs")
[ -n "$seconds" ] && limit=(-max_total_time="$seconds")
summary=()
for name in "${harnesses[@]}"; do
  [ -x "build/asan-ubsan/fuzz/$name" ] || { echo "tools/fuzz.sh: no harness $name" >&2; exit 2; }
  log=build/asan-ubsan/runs/$name.log
  mkdir -p build/asan-ubsan/runs
  echo "== $name (${limit[*]})"
  start=$(date +%s%N)
  status=0
  fuzz/run_fuzzer.sh "build/asan-ubsan/fuzz/$name" "fuzz/corpus/$name" build/asan-ubsan/runs "${limit[@]}" \
    >"$log" 2>&1 || status=$?
  executions=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  line=$(awk -v name="$name" -v runs="${executions:-0}" -v ns=$(($(date +%s%N) - start)) \
    'BEGIN { s = ns / 1e9; printf "%-18s %10d executions %8.1f s %8.0f exec/s", name, runs, s, runs / s }')
  echo "$line"
  summary+=("$line")
  if [ "$status" -ne 0 ]; then
    tail -40 "$log"
    echo "tools/fuzz.sh: $name failed (exit $status); log $log" >&2
    exit 1
  fi
done
echo "== summary"
printf '%s\n' "${summary[@]}"
