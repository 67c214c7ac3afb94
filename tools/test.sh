#!/usr/bin/env bash
# Checks that the repository stands alone (tools/check_isolation.sh) and its style
# (tools/check_style.sh: clang-format, ruff), then builds and runs the
# whole test suite: the Release build (every ISA level, the ODR guard, the installed-package
# consumer, the simulator), then one clang AddressSanitizer + UBSan build that runs the suite
# again and the fuzz harnesses (a fixed number of inputs each from their seed corpora;
# tools/fuzz.sh runs them long). One sanitizer build, not two, keeps a clean clone's run within
# CI's 30 minutes on 2 cores.
# The Release build also builds the Python module (python/) against a virtual environment with
# torch and diffusers from PyPI (build/venv) and runs its tests; then `pip install .` into that
# environment is checked as a user would run it.
# Usage: tools/test.sh [--quick]   (--quick skips the sanitizer build)
set -euo pipefail
cd "$(dirname "$0")/.."
# Each phase's wall time, so a slow CI run shows where its time went.
phase_start=$SECONDS
phase_done() {
  echo "tools/test.sh: $1 took $((SECONDS - phase_start)) s (total $SECONDS s)"
  phase_start=$SECONDS
}
# First, before any package or build: nothing tracked may refer outside the repository.
tools/check_isolation.sh
source tools/setup.sh
ditops_ensure_packages fuzz python style
ditops_ensure_venv
ditops_ensure_lowest_diffusers
phase_done "packages and venv"
# Formatting and lint before anything is built (tools/check_style.sh).
tools/check_style.sh "$ditops_python"
phase_done "style"

cmake --preset release -DDITOPS_PYTHON=ON -DPython_EXECUTABLE="$ditops_python" \
  -DDITOPS_DIFFUSERS_LOWEST="$ditops_diffusers_lowest" \
  -DDITOPS_DIFFUSERS_LOWEST_VERSION="$ditops_diffusers_lowest_version"
cmake --build --preset release
phase_done "Release build"
ctest --preset release -j2
phase_done "Release tests"

# pip install . as a user runs it (no build isolation: the venv has the build requirements;
# the build directory under build/ is reused by the next run), then the installed package,
# imported from outside the source tree, runs an attention. This step checks the packaging, not
# the kernels (the Release build above tested every variant): it compiles the scalar kernels
# only, which saves CI four fifths of a second kernel build.
"$ditops_python" -m pip install -q . --no-build-isolation --config-settings=build-dir=build/pip \
  --config-settings=cmake.define.DITOPS_KERNEL_VARIANTS=scalar
(cd /tmp && "$ditops_python" -c '
import ditops, torch
q = torch.randn(1, 64, 2, 32)
out = ditops.attention_forward(q, q, q)
ref = torch.nn.functional.scaled_dot_product_attention(*(q.transpose(1, 2),) * 3).transpose(1, 2)
assert ditops.__file__.find("site-packages") > 0 and (out - ref).abs().max() < 1e-5
print("pip install .: ditops", ditops.__version__, "imports and runs from", ditops.__file__)')
phase_done "pip install ."

if [ "${1:-}" != "--quick" ]; then
  # The sanitized suite runs at the level dispatch picks on this machine: its kernels (and the
  # scalar ones, always compiled) are the only ones the build needs (ditops-info's name for it
  # is one DITOPS_KERNEL_VARIANTS takes).
  variant=$(build/release/tools/ditops-info | sed -n 's/^ *kernel variant *//p')
  cmake --preset asan-ubsan -DDITOPS_KERNEL_VARIANTS="$variant"
  # Sanitized: the operator suite at the level dispatch picks and the fuzz harnesses (the
  # simulator and the tools run in the Release build; their parsers are fuzzed here).
  cmake --build --preset asan-ubsan --target ditops_tests ditops_fuzzers
  phase_done "sanitizer build"
  ctest --preset asan-ubsan -j2
  phase_done "sanitizer tests"
fi
echo "tools/test.sh: all tests passed"
