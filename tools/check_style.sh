#!/usr/bin/env bash
# The style checks tools/test.sh runs before it builds: every tracked C++ file as .clang-format
# formats it (clang-format, the Debian package), and every tracked Python file clean under
# pyproject.toml's ruff profile (ruff from the project's venv). Each failure names the file and
# the line; `clang-format -i FILE` and `ruff check --fix` repair most.
# Usage: tools/check_style.sh [PYTHON]   (PYTHON: an interpreter with ruff; default build/venv's)
set -euo pipefail
cd "$(dirname "$0")/.."
python=${1:-build/venv/bin/python}
status=0
mapfile -t cpp < <(git ls-files '*.cpp' '*.hpp' '*.h')
if ! clang-format --dry-run --Werror "${cpp[@]}"; then
  echo "check_style: C++ files differ from .clang-format's layout (clang-format -i FILE)" >&2
  status=1
fi
mapfile -t py < <(git ls-files '*.py')
if ! "$python" -m ruff check --quiet "${py[@]}"; then
  echo "check_style: ruff found the problems above (pyproject.toml [tool.ruff])" >&2
  status=1
fi
[ "$status" -ne 0 ] || echo "check_style: ${#cpp[@]} C++ and ${#py[@]} Python files clean"
exit "$status"
