# Sourced by tools/test.sh, tools/demo.sh and tools/fuzz.sh: installs what the build needs from
# Debian's packages (as root), or prints the one apt-get line to run and exits non-zero.

ditops_packages=(g++ cmake make pkg-config libomp-dev libxsimd-dev libhwloc-dev libeigen3-dev
                 libgtest-dev libbenchmark-dev nlohmann-json3-dev)
# The asan-ubsan preset: clang, its libFuzzer runtime (libclang_rt.fuzzer, in libclang-rt-14-dev on
# bookworm, which libclang-rt-dev pulls in) and clang's OpenMP runtime (libomp-dev, above).
ditops_fuzz_packages=(clang libclang-rt-dev)
# tools/check_style.sh: the C++ formatter (.clang-format); tools/check_tidy.sh (ctest
# style.clang_tidy): clang-tidy with .clang-tidy.
ditops_style_packages=(clang-format clang-tidy)
# The demo's benchmark peer for the int8 linear layers (oneDNN's int8 matmul).
ditops_demo_packages=(libdnnl-dev)
# The Python package (python/): the interpreter, its headers for the module, venv for PyPI.
ditops_python_packages=(python3 python3-dev python3-venv)

# Usage: ditops_ensure_packages [fuzz | demo | python | style]...
ditops_ensure_packages() {
  local missing=() wanted=("${ditops_packages[@]}") group
  for group in "$@"; do
    [ "$group" = fuzz ] && wanted+=("${ditops_fuzz_packages[@]}")
    [ "$group" = demo ] && wanted+=("${ditops_demo_packages[@]}")
    [ "$group" = python ] && wanted+=("${ditops_python_packages[@]}")
    [ "$group" = style ] && wanted+=("${ditops_style_packages[@]}")
  done
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

# The one virtual environment of the Python work (build/venv; DITOPS_VENV overrides), with what
# the package, its tests and the model benchmarks need from PyPI. pip keeps its cache
# (~/.cache/pip), so a second run, or a fresh clone on the same machine, downloads nothing.
# cache-dit: the tests run its MindIE-SD attention backend on ditops.mindiesd (the version
# they were written against).
# diffusers: the newest release in the range ditops.diffusers supports (pyproject.toml's).
ditops_diffusers_range=$(sed -n 's/.*"diffusers\(>=[0-9.]*,<[0-9.]*\)".*/\1/p' pyproject.toml)
# ruff: tools/check_style.sh's Python linter.
# transformers: the text encoders of the whole-pipeline tests and benchmark.
ditops_python_requirements=(numpy safetensors torch "diffusers$ditops_diffusers_range" nanobind
                            scikit-build-core pytest "cache-dit==1.5.3" transformers ruff)
ditops_venv=${DITOPS_VENV:-build/venv}
ditops_ensure_venv() {
  [ -x "$ditops_venv/bin/python" ] || python3 -m venv "$ditops_venv"
  local modules="numpy, safetensors, torch, diffusers, nanobind, scikit_build_core, pytest, cache_dit, transformers, ruff"
  if ! "$ditops_venv/bin/python" -c "import $modules" 2>/dev/null; then
    echo "ditops: installing ${ditops_python_requirements[*]} into $ditops_venv"
    "$ditops_venv/bin/pip" install -q "${ditops_python_requirements[@]}"
  fi
  ditops_python="$(cd "$ditops_venv" && pwd)/bin/python"
}

# The lowest diffusers release ditops.diffusers supports, in a directory of its own beside the
# venv (diffusers is pure Python; its dependencies are the venv's): the test suite runs the
# diffusers integration's tests again with it first on PYTHONPATH.
ditops_diffusers_lowest_version=$(sed -n 's/^>=\([0-9.]*\),.*/\1.0/p' <<<"$ditops_diffusers_range")
ditops_ensure_lowest_diffusers() {
  ditops_diffusers_lowest="$(cd "$ditops_venv/.." && pwd)/diffusers-$ditops_diffusers_lowest_version"
  if [ ! -f "$ditops_diffusers_lowest/diffusers/__init__.py" ]; then
    "$ditops_venv/bin/pip" install -q --no-deps --target "$ditops_diffusers_lowest" \
      "diffusers==$ditops_diffusers_lowest_version"
  fi
}
