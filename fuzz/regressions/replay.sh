#!/usr/bin/env bash
# Replays one fuzz input that once failed, with the attention tuning cache it failed under: a
# copy of CACHE (the fixture is never written) as DITOPS_TUNE_CACHE. The cache must decide the
# run: if the library tuned anything instead (the copy changed), the input no longer meets the
# fixture's entry and the replay reproduces nothing, which fails too.
# Usage: fuzz/regressions/replay.sh BINARY INPUT CACHE WORK_DIR   (ctest passes them)
set -euo pipefail
binary=$1 input=$2 cache=$3 work=$4
mkdir -p "$work"
copy=$work/$(basename "$input").tune.json
cp "$cache" "$copy"
status=0
DITOPS_TUNE_CACHE=$copy DITOPS_BIND=none "$binary" "$input" || status=$?
if ! cmp -s "$cache" "$copy"; then
  echo "replay: the input's call did not use the fixture's cache entry (the cache changed):" >&2
  diff "$cache" "$copy" >&2 || true
  exit 1
fi
exit "$status"
