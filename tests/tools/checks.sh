# Sourced by the command-line tests in tests/tools. `fail` records a failed check and goes on, so
# one run reports every failure; `finish NAME` prints the count and exits 1 if any failed.
failures=0
fail() {
  echo "FAIL: $*"
  failures=$((failures + 1))
}
finish() {
  if [ "$failures" -ne 0 ]; then
    echo "$1: $failures failure(s)"
    exit 1
  fi
  echo "$1: all checks passed"
}
