# Sourced by tools/test.sh and tools/demo.sh: installs what the build needs from Debian's
# packages (as root), or prints the one apt-get line to run and exits non-zero.

ditops_packages=(g++ cmake make pkg-config libomp-dev libxsimd-dev libhwloc-dev libeigen3-dev
                 libgtest-dev libbenchmark-dev nlohmann-json3-dev)

ditops_ensure_packages() {
  local missing=()
  for package in "${ditops_packages[@]}"; do
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
