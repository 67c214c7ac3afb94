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
# Warnings the inputs provoke on purpose (a foreign tuning cache, a bad environment value) would
# flood the log: stderr of the code under test is closed, libFuzzer's own report is kept.
exec "$binary" -artifact_prefix="$work/$name/artifacts/" -close_fd_mask=2 -print_final_stats=1 \
  "$@" "$work/$name/corpus" "$seeds"
