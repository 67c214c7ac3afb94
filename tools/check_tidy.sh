#!/usr/bin/env bash
# clang-tidy with the repository's profile (.clang-tidy) on every translation unit of the
# library (ops/, loader/), the simulator (sim/), the tools (tools/) and the Python module
# (python/src), with the headers they include from those folders and include/ditops/: each
# kernel source once, at one of its ISA variants. Any finding fails; it names the file, the line
# and the check.
# Usage: tools/check_tidy.sh BUILD_DIR   (BUILD_DIR configured with CMake, which writes
#        compile_commands.json)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:?usage: tools/check_tidy.sh BUILD_DIR}
database=$build/compile_commands.json
[ -f "$database" ] || { echo "check_tidy: no $database (configure $build first)" >&2; exit 2; }
# One entry per source file of those folders. A kernel source has one compile command per
# variant, and clang-tidy -p analyses a file once per command of it: a database of the first
# command of each file (the scalar variant for a kernel) checks each file once, not six times.
tidy_db=$(mktemp -d)
trap 'rm -rf "$tidy_db"' EXIT
mapfile -t files < <(python3 - "$database" "$tidy_db/compile_commands.json" "$PWD" <<'PY'
import json, sys
database, out, root = sys.argv[1:]
first = {}
for entry in json.load(open(database)):
    if entry["file"].startswith(tuple(f"{root}/{folder}/" for folder in
                                      ("ops", "loader", "sim", "tools", "python/src"))):
        first.setdefault(entry["file"], entry)
json.dump(list(first.values()), open(out, "w"))
print("\n".join(sorted(first)))
PY
)
[ ${#files[@]} -gt 0 ] || { echo "check_tidy: no source file in $database" >&2; exit 2; }
# GCC's warning flags clang lacks (-Wno-restrict) are not findings.
if printf '%s\0' "${files[@]}" |
   xargs -0 -n 4 -P 2 clang-tidy -p "$tidy_db" --quiet --extra-arg=-Wno-unknown-warning-option \
     2>/dev/null; then
  echo "check_tidy: ${#files[@]} files clean (.clang-tidy)"
else
  echo "check_tidy: clang-tidy found the problems above (.clang-tidy)" >&2
  exit 1
fi
