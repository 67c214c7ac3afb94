#!/usr/bin/env bash
# Runs one libFuzzer harness over its seed corpus without writing into the source tree: new
# inputs go to a scratch corpus under WORK, crashes to WORK/artifacts.
# Usage: fuzz/run_fuzzer.sh BINARY SEED_DIR WORK [libFuzzer flags...]
set -euo pipefail
binary=$1 seeds=$2 work=$3
shift 3
name=$(basename "$binary")
mkdir -p "$work/$name/corpus" "$work/$name/artifacts"
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
# Inputs are microseconds of work each: a thread team pinned to cores and spinning between
# calls (libomp waits 200 ms by default) would wait on preempted workers whenever the machine
# is busy, which measured 2 inputs per second instead of hundreds.
export DITOPS_BIND=${DITOPS_BIND:-none}
export KMP_BLOCKTIME=${KMP_BLOCKTIME:-0}
# The operator harnesses run a library with process-wide state (OpenMP teams, the hwloc
# topology, the tuning cache, once-per-message warnings), so many inputs allocate more than they
# free without leaking; libFuzzer answers each such input with a second run and a scan of the
# whole heap until it gives up after 1000, which was most of a short run (attention_fuzz 98 ->
# 277 inputs/s, tune_cache_fuzz 81 -> 651). LeakSanitizer still checks the process at exit
# (ASAN_OPTIONS detect_leaks=1); the parsers, which keep no state, are checked after every input.
leaks=()
case "$name" in
  attention_fuzz | sparse_fuzz | mla_fuzz | rowwise_fuzz | tune_cache_fuzz | linear_fuzz)
    leaks=(-detect_leaks=0) ;;
esac
# Warnings the inputs provoke on purpose (a foreign tuning cache, a bad environment value) would
# flood the log: stderr of the code under test is closed, libFuzzer's own report is kept.
exec "$binary" -artifact_prefix="$work/$name/artifacts/" -close_fd_mask=2 -print_final_stats=1 \
  "${leaks[@]}" "$@" "$work/$name/corpus" "$seeds"
