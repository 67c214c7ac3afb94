#!/usr/bin/env bash
# Checks that the repository stands alone (tools/check_isolation.sh), then builds and runs the
# whole test suite: the Release build (every ISA level, the ODR guard, the installed-package
# consumer, the simulator), then one clang AddressSanitizer + UBSan build that runs the suite
# again and the fuzz harnesses (a fixed number of inputs each from their seed corpora;
# tools/fuzz.sh runs them long). One sanitizer build, not two, keeps a clean clone's run within
# CI's 30 minutes on 2 cores.
# Usage: tools/test.sh [--quick]   (--quick skips the sanitizer build)
set -euo pipefail
cd "$(dirname "$0")/.."
# First, before any package or build: nothing tracked may refer outside the repository.
tools/check_isolation.sh
source tools/setup.sh
ditops_ensure_packages fuzz

cmake --preset release
cmake --build --preset release
ctest --preset release -j2

if [ "${1:-}" != "--quick" ]; then
  cmake --preset asan-ubsan
  cmake --build --preset asan-ubsan
  ctest --preset asan-ubsan -j2
fi
echo "tools/test.sh: all tests passed"
