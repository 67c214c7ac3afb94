#!/usr/bin/env bash
# Compile-only check that the build does not depend on the CPU it runs on. Every translation
# unit compiled for a particular CPU (-march=native: the peers' benches) or with ISA flags of its
# own (the per-ISA kernels, the peak probes) is compiled again, as the build compiles it
# (warnings, -Werror, optimization level: the warnings that differ between CPUs come from the
# optimizer), once for each target CPU below, with no output and no linking. A machine without
# AVX-512 thereby sees what -march=native breaks on one with it, and the reverse.
# Usage: tools/check_march.sh BUILD_DIR [MARCH... | --other-side]   (BUILD_DIR configured with
#        CMake, which writes compile_commands.json; default targets below. --other-side: the one
#        target across the AVX-512 line from this machine, sapphirerapids on a CPU without
#        AVX-512 and x86-64-v3 on one with it, each source file compiled once, at the lowest of
#        its ISA variants that the target changes: what the test suite runs, a quarter of the
#        compiles of checking every variant)
set -euo pipefail
build=${1:?usage: tools/check_march.sh BUILD_DIR [MARCH... | --other-side]}
shift
targets=("$@")
once_per_file=0
if [ "${targets[*]}" = "--other-side" ]; then
  if grep -qw avx512f /proc/cpuinfo; then targets=(x86-64-v3); else targets=(sapphirerapids); fi
  once_per_file=1
fi
# The default targets are the x86 CPUs users run: AVX2 (x86-64-v3, as on Zen 3), Alder Lake (AVX2
# with AVX-VNNI, as later Core and Xeon 6 E-cores), Zen 4, Ice Lake, Sapphire / Emerald Rapids
# and Granite Rapids (the last two with AMX: the AMX kernel's compile sees their tile macros).
# x86-64-v2 and x86-64-v4 enable nothing that these and the build's own compiles (the scalar and
# SSE4.2 kernels) do not: name them to check them too.
[ ${#targets[@]} -gt 0 ] ||
  targets=(x86-64-v3 alderlake znver4 icelake-server sapphirerapids graniterapids)
database=$build/compile_commands.json
[ -f "$database" ] || { echo "check_march: no $database (configure $build first)" >&2; exit 2; }

# CMake writes one '"command": "..."' line per translation unit, JSON-escaped; the commands
# selected here hold no quotes or backslashes of their own, so unescaping those two suffices.
mapfile -t commands < <(sed -n 's/^ *"command": "\(.*\)",\{0,1\}$/\1/p' "$database" |
  sed 's/\\"/"/g; s/\\\\/\\/g' | grep -E -- ' -march=native | -DDITOPS_ISA_LEVEL=| -m(avx|sse)')
if [ ${#commands[@]} -eq 0 ]; then
  echo "check_march: no CPU-specific command in $database" >&2
  exit 2
fi
compiler=${commands[0]%% *}

# The flags that target a CPU. A GCC older than the CPU (GCC 12.2 and znver4) gets what its
# -march=native gives on that CPU: the nearest older -march and the CPU's AVX-512 extensions.
march_flags() {
  local compiler=$1 march=$2
  if echo 'int x;' | "$compiler" -march="$march" -x c++ -fsyntax-only - 2>/dev/null; then
    echo "-march=$march"
    return
  fi
  case "$march" in
    znver4)
      echo "-march=znver3 -mavx512f -mavx512vl -mavx512bw -mavx512dq -mavx512cd -mavx512vbmi" \
        "-mavx512ifma -mavx512vpopcntdq -mavx512vbmi2 -mavx512vnni -mavx512bitalg -mavx512bf16"
      echo "check_march: $compiler has no -march=znver4; checking znver3 + Zen 4's AVX-512" >&2 ;;
    graniterapids)
      # Sapphire Rapids' ISA plus AMX-FP16 and PREFETCHI, which GCC 12 has no flags for.
      echo "-march=sapphirerapids"
      echo "check_march: $compiler has no -march=graniterapids; checking sapphirerapids" >&2 ;;
    sierraforest | arrowlake)
      # Alder Lake's ISA (AVX2, AVX-VNNI) plus AVX-IFMA, AVX-VNNI-INT8, AVX-NE-CONVERT and
      # CMPCCXADD, which GCC 12 has no flags for and no kernel uses.
      echo "-march=alderlake"
      echo "check_march: $compiler has no -march=$march; checking alderlake" >&2 ;;
    *) echo "check_march: $compiler has no -march=$march" >&2; exit 2 ;;
  esac
}

# The ISA macros a compile sees (-dM -E of its flags): two compiles of one file with the same
# other flags that see the same ones compile the same code, so a target that adds no feature to
# what a kernel variant's own flags enable is not compiled again for that variant (the build
# compiled it; only the tuning differs).
isa_macros() {
  "$@" -dM -E -x c++ /dev/null | grep -E '^#define __(AVX|SSE|FMA|F16C|BMI|GFNI|VAES|VPCLMUL|AMX)' |
    sort | md5sum
}

declare -A march_of=() seen=() queued=()
for march in "${targets[@]}"; do
  march_of[$march]=$(march_flags "$compiler" "$march")
done
jobs=()
for command in "${commands[@]}"; do
  read -r -a words <<<"$command"
  flags=() native=()  # the command without its output, its input and -march=native
  for ((i = 1; i < ${#words[@]} - 2; ++i)); do
    case "${words[i]}" in
      -march=native) native=(-march=native) ;;
      -o) ((++i)) ;;
      *) flags+=("${words[i]}") ;;
    esac
  done
  # The compile without its ISA flags (defines included: kernel variants differ in those too).
  file="${words[-1]} $(printf '%s\n' "${flags[@]}" | grep -v '^-m' | tr '\n' ' ')"
  seen["$file $(isa_macros "$compiler" "${native[@]}" "${flags[@]}")"]=1
  for march in "${targets[@]}"; do
    # shellcheck disable=SC2206 # the target's flags are words
    line=("$compiler" ${march_of[$march]} "${flags[@]}")
    key="$file $(isa_macros "${line[@]}")"
    [ -z "${seen[$key]:-}" ] || continue
    seen[$key]=1
    # --other-side: the kernel variants of one source differ in DITOPS_ISA_LEVEL and their -m
    # flags, which the target's flags mostly override; the lowest variant (first in the
    # database) sees the most the target adds.
    [ "$once_per_file" = 0 ] || [ -z "${queued[${words[-1]} $march]:-}" ] || continue
    queued[${words[-1]} $march]=1
    job=$(printf '%q ' "${line[@]}" -c "${words[-1]}" -o /dev/null)
    jobs+=("${job% }")
  done
done

echo "check_march: ${#commands[@]} translation units x ${#targets[@]} targets (${targets[*]}):" \
  "${#jobs[@]} distinct compiles"
log=$(mktemp)
trap 'rm -f "$log"' EXIT
# One compile per job, as many at a time as there are cores; each failure names its target
# and file, then the compiler's first lines.
printf '%s\0' "${jobs[@]}" | xargs -0 -n 1 -P "$(nproc)" bash -c '
  march=$(grep -o -- "-march=[^ ]*" <<<"$0" | head -1)
  file=$(grep -o -- "-c [^ ]*" <<<"$0" | cut -c4-)
  if ! output=$(eval "$0" 2>&1); then
    printf "FAILED %s %s\n%s\n" "$march" "$file" "$(head -n 12 <<<"$output")"
    exit 1
  fi' >"$log" 2>&1 || true
if grep -q '^FAILED' "$log"; then
  cat "$log"
  echo "check_march: $(grep -c '^FAILED' "$log") of ${#jobs[@]} compiles failed" >&2
  exit 1
fi
echo "check_march: all ${#jobs[@]} compiles passed"
