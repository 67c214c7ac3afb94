#!/usr/bin/env bash
# ODR guard: no symbol may be defined by two ISA objects, or by an ISA object and a
# baseline object. Otherwise the linker keeps one copy of, say, an inline helper compiled with
# -mavx512f, and an AVX2-only CPU executes it through the AVX2 path (SIGILL).
# Objects of one ISA level share their flags, so a symbol they both define is harmless: symbols
# are counted once per group (object library).
# Usage: tools/check_isa_objects.sh BUILD_DIR
set -euo pipefail
build=${1:?usage: check_isa_objects.sh BUILD_DIR}
objects=$(find "$build" -regextype posix-extended -regex '.*/CMakeFiles/ditops(_isa_[a-z0-9_]+)?\.dir/.*\.o' | sort)
[ -n "$objects" ] || { echo "check_isa_objects: no objects under $build" >&2; exit 1; }
for o in $objects; do
  group=$(echo "$o" | sed -E 's|.*CMakeFiles/([^/]+)\.dir/.*|\1|')
  # Code only (T, W): a shared constant (V, u) is the same bytes whatever the flags.
  nm -C --defined-only "$o" | awk '$2 ~ /^[TW]$/ { sub(/^[0-9a-f]+ [A-Za-z] /, ""); print }' |
    sed "s|^|$group\t|"
done | sort -u | awk -F'\t' '
  { groups[$2] = groups[$2] " " $1; count[$2]++ }
  END {
    bad = 0
    for (s in count) {
      # Helpers of the compilers: the personality routine, and the catch-and-terminate stub of
      # clang (__cxa_begin_catch, then std::terminate), have no code the -m flags change.
      if (count[s] > 1 && s !~ /__gxx_personality|__clang_call_terminate/ && groups[s] ~ /_isa_/) {
        print "duplicate symbol across ISA objects: " s " <-" groups[s]; bad = 1
      }
    }
    if (!bad) print "check_isa_objects: no symbol shared between ISA objects"
    exit bad
  }'
