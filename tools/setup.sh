# Sourced by tools/test.sh, tools/demo.sh and tools/fuzz.sh: installs what the build needs from
# Debian's packages (as root), or prints the one apt-get line to run and exits non-zero.

ditops_packages=(g++ cmake make pkg-config libomp-dev libxsimd-dev libhwloc-dev libeigen3-dev
                 libgtest-dev libbenchmark-dev nlohmann-json3-dev)
# The asan-ubsan preset: clang, its libFuzzer runtime (libclang_rt.fuzzer, in libclang-rt-14-dev on
# bookworm, which libclang-rt-dev pulls in) and clang's OpenMP runtime (libomp-dev, above).
ditops_fuzz_packages=(clang libclang-rt-dev)
# The demo's benchmark peer for the int8 linear layers (oneDNN's int8 matmul).
ditops_demo_packages=(libdnnl-dev)

# Usage: ditops_ensure_packages [fuzz | demo]
ditops_ensure_packages() {
  local missing=() wanted=("${ditops_packages[@]}")
  [ "${1:-}" = fuzz ] && wanted+=("${ditops_fuzz_packages[@]}")
  [ "${1:-}" = demo ] && wanted+=("${ditops_demo_packages[@]}")
  for package in "${wanted[@]}"; do
    dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed" ||
      missing+=("$package")
  done
  [ ${#missing[@]} -eq 0 ] && return 0
  if [ "$(id -u)" -ne 0 ]; then
    echo "ditops: missing Debian packages; run as root:" >&2
    echo "  apt-get install -y ${missing[*]}" >&2
    exit 1
  fi
  echo "ditops: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -q
  apt-get install -y -q --no-install-recommends "${missing[@]}"
}
