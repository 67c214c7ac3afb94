#!/usr/bin/env bash
# bench-summary lists a file's rows in the order the benchmarks are declared (family, then
# instance), whatever order the run wrote them in: runs with random interleaving write their
# aggregates in the order the repetitions ended.
# Usage: bench_summary_test.sh BENCH_SUMMARY WORK_DIR   (ctest passes them)
set -euo pipefail
[ $# -eq 2 ] || { echo "usage: $0 BENCH_SUMMARY WORK_DIR" >&2; exit 2; }
tool=$1 work=$2
rm -rf "$work"
mkdir -p "$work"

source "$(dirname "$0")/checks.sh"

entry() {  # name family instance time
  printf '{"name": "%s_median", "run_name": "%s", "run_type": "aggregate", "aggregate_name": "median", "family_index": %d, "per_family_instance_index": %d, "real_time": %s, "time_unit": "ms", "label": "%s"}' \
    "$1" "$1" "$2" "$3" "$4" "$1"
}
{
  echo '{"context": {}, "benchmarks": ['
  entry BM_b/shape:1 1 1 4 && echo ,
  entry BM_a/shape:1 0 1 2 && echo ,
  entry BM_b/shape:0 1 0 3 && echo ,
  entry BM_a/shape:0 0 0 1
  echo ']}'
} >"$work/interleaved.json"
"$tool" "$work/interleaved.json" >"$work/table.md" || fail "bench-summary exited $?"
order=$(grep -o '^| BM_[ab]/shape:[01]' "$work/table.md" | tr -d '| ' | tr '\n' ' ')
[ "$order" = "BM_a/shape:0 BM_a/shape:1 BM_b/shape:0 BM_b/shape:1 " ] ||
  fail "rows in the order '$order', not as declared"
finish bench_summary_test
