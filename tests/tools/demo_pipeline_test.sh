#!/usr/bin/env bash
# tools/demo.sh's whole pipeline on its tiny setting against an already built tree, once as an
# AVX2 machine and once as the x86-64 baseline (DITOPS_ISA=avx2, DITOPS_ISA=scalar): the script
# must exit 0 and write summary.md, every .json file it writes must be strict JSON (a counter of
# 0 over repetitions once wrote NaN, which made ditops-sim reject the benchmark output), and the
# measured peaks must be the capped ISA's.
# Usage: demo_pipeline_test.sh BUILD_DIR STRICT_JSON_CHECK WORK_DIR   (ctest passes them)
set -euo pipefail
[ $# -eq 3 ] || { echo "usage: $0 BUILD_DIR STRICT_JSON_CHECK WORK_DIR" >&2; exit 2; }
root=$(cd "$(dirname "$0")/../.." && pwd)
build=$1 check=$2 work=$3
mkdir -p "$work"

source "$(dirname "$0")/checks.sh"

for isa in avx2 scalar; do
  out=$work/demo-$isa
  log=$work/demo-$isa.log
  status=0
  DITOPS_ISA=$isa "$root/tools/demo.sh" --tiny --out "$out" --build-dir "$build" >"$log" 2>&1 ||
    status=$?
  if [ "$status" -ne 0 ]; then
    fail "DITOPS_ISA=$isa: tools/demo.sh exited with status $status; the end of $log:"
    tail -n 40 "$log"
  fi
  [ -f "$out/summary.md" ] || fail "DITOPS_ISA=$isa: no $out/summary.md"
  # The summary lists every section, with what did not run and why.
  for section in build machine benchmarks 'sparse: not in --tiny' linear dit simulator \
    cpu-vs-simulator 'peers: not in --tiny' summary; do
    grep -q "^- $section" "$out/summary.md" ||
      fail "DITOPS_ISA=$isa: summary.md lists no section '$section'"
  done
  for file in bench.json mla_chunks.json; do
    [ -f "$out/$file" ] || fail "DITOPS_ISA=$isa: no $out/$file"
  done
  mapfile -t files < <(find "$out" -name '*.json' | sort)
  if [ ${#files[@]} -gt 0 ] && ! "$check" "${files[@]}"; then
    fail "DITOPS_ISA=$isa: not every .json file tools/demo.sh wrote is strict JSON"
  fi
done

# The peaks follow DITOPS_ISA as the kernels do: capped at avx2 (on an AVX-512 machine too), no
# BF16 peak and the AVX2 int8 sequence; at the baseline, no FMA peak.
expect_peak() {
  grep -q "^| BM_peak_$2/2/[^|]*| $3" "$work/demo-$1/summary.md" ||
    fail "DITOPS_ISA=$1: summary.md does not show the $2 peak as '$3'"
}
expect_peak scalar fp32_fma "not on this CPU"
expect_peak scalar int8_dot "not on this CPU"
expect_peak avx2 bf16_dot "not on this CPU"
if grep -q "isa (dispatch) *avx2" "$work/demo-avx2/machine.txt"; then  # the CPU has AVX2
  expect_peak avx2 int8_dot "ymm vpmaddubsw"
  expect_peak avx2 fp32_fma "ymm vfmadd231ps"
fi

finish "demo pipeline (DITOPS_ISA=avx2 and scalar)"
