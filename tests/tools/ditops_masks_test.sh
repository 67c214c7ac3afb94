#!/usr/bin/env bash
# ditops-masks on tiny layouts: the three SVGs are written, start with <svg, end with </svg>,
# parse as XML (when python3 is there) and carry the legend; a rerun into its own output is
# allowed; bad arguments and a directory holding anything else exit 2 with one line on stderr
# and write nothing.
# Usage: ditops_masks_test.sh DITOPS_MASKS WORK_DIR   (ctest passes them)
set -euo pipefail
[ $# -eq 2 ] || { echo "usage: $0 DITOPS_MASKS WORK_DIR" >&2; exit 2; }
tool=$1 work=$2
rm -rf "$work"
mkdir -p "$work"

source "$(dirname "$0")/checks.sh"

check_svgs() {
  local dir=$1 pattern file
  for pattern in spatial temporal textural; do
    file=$dir/$pattern.svg
    if [ ! -s "$file" ]; then
      fail "$file missing or empty"
      continue
    fi
    [ "$(head -c 4 "$file")" = "<svg" ] || fail "$file does not start with <svg"
    [[ "$(tail -c 16 "$file" | tr -d '[:space:]')" == *"</svg>" ]] ||
      fail "$file does not end with </svg>"
    grep -q "$pattern pattern, density [01]\.[0-9]" "$file" || fail "$file: no legend with density"
    grep -q "S = " "$file" || fail "$file: no S in the legend"
    if command -v python3 >/dev/null; then
      python3 -c 'import sys, xml.etree.ElementTree as E; E.parse(sys.argv[1])' "$file" ||
        fail "$file is not well-formed XML"
    fi
  done
}

# expect_usage_error NAME ARGS...: exit status 2, exactly one line on stderr.
expect_usage_error() {
  local name=$1 status=0
  shift
  "$tool" "$@" >"$work/stdout" 2>"$work/stderr" || status=$?
  [ "$status" -eq 2 ] || fail "$name: exit status $status, expected 2"
  [ "$(wc -l <"$work/stderr")" -eq 1 ] || fail "$name: stderr is not one line: $(cat "$work/stderr")"
}

layout=(--frames 3 --height 5 --width 7 --text 6)
"$tool" "${layout[@]}" --sparsity 0.5 --out "$work/a" || fail "tiny layout: exit status $?"
check_svgs "$work/a"
# Its own output may be overwritten; text last, no dense frame 0, another stride.
"$tool" "${layout[@]}" --text-last --no-dense-first-frame --stride 3 --out "$work/a" ||
  fail "rerun into its own output: exit status $?"
check_svgs "$work/a"
grep -q "text last" "$work/a/spatial.svg" || fail "--text-last not in the legend"
# More than 512 tokens: cells of several token pairs.
"$tool" --frames 4 --height 12 --width 15 --text 20 --out "$work/big" || fail "S = 740: exit $?"
check_svgs "$work/big"
grep -q "up to 2 x 2 token pairs" "$work/big/spatial.svg" || fail "S = 740: no cell size in legend"

expect_usage_error "frames 0" --frames 0 --height 5 --width 7 --text 6 --out "$work/b"
expect_usage_error "sparsity 1" "${layout[@]}" --sparsity 1 --out "$work/b"
expect_usage_error "sparsity nan" "${layout[@]}" --sparsity nan --out "$work/b"
expect_usage_error "stride 0" "${layout[@]}" --stride 0 --out "$work/b"
expect_usage_error "not an integer" --frames 3x --height 5 --width 7 --text 6 --out "$work/b"
expect_usage_error "unknown flag" "${layout[@]}" --bogus --out "$work/b"
expect_usage_error "missing --out" "${layout[@]}"
expect_usage_error "missing value" "${layout[@]}" --out
expect_usage_error "too many tokens" --frames 100 --height 100 --width 100 --text 0 --out "$work/b"
[ ! -e "$work/b" ] || fail "a rejected call created its output directory"

mkdir -p "$work/foreign"
echo notes >"$work/foreign/notes.txt"
expect_usage_error "foreign file" "${layout[@]}" --out "$work/foreign"
echo '<svg xmlns="http://www.w3.org/2000/svg"></svg>' >"$work/foreign/notes.txt"
mv "$work/foreign/notes.txt" "$work/foreign/other.svg"
expect_usage_error "foreign svg" "${layout[@]}" --out "$work/foreign"
[ "$(ls "$work/foreign")" = "other.svg" ] || fail "wrote into a directory it refused"
touch "$work/file"
expect_usage_error "out is a file" "${layout[@]}" --out "$work/file"

finish "ditops-masks"
