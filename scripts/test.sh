#!/usr/bin/env bash
# The test command (what .ci/run calls): sets everything up through scripts/setup.sh, then runs
# the C++ tests (CTest; tests labelled gpu need a CUDA device and run in scripts/gpu-check.sh),
# the Python tests (pytest), the C++ tests again under AddressSanitizer and UBSan
# (scripts/sanitize.sh) and 60 seconds of fuzzing of the blob reader (scripts/fuzz.sh). Any failure
# fails the whole run (set -e). A suite that collects no tests fails: ctest --no-tests=error, and
# pytest exits 5.
#
# Sourcing this file only defines run_ctest and run_pytest, the two suite invocations, so that
# tests/test_ci_fails_closed.py can point them at empty folders and see them fail.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

# CTest in build folder $1: the CPU tests; no tests found is an error.
run_ctest() {
  (cd "$1" && "$root/.venv/bin/ctest" --output-on-failure --no-tests=error -LE gpu -j2)
}

# pytest with its arguments; its exit status (5 when it collects nothing) is the function's.
run_pytest() {
  PYTHONPATH="$root/python${PYTHONPATH:+:$PYTHONPATH}" "$root/.venv/bin/python" -m pytest "$@"
}

main() {
  cd "$root"
  bash scripts/setup.sh

  echo "== C++ tests (CTest)"
  run_ctest build

  echo "== Python tests (pytest)"
  run_pytest tests -q "$@"

  echo "== C++ tests under ASan + UBSan (scripts/sanitize.sh)"
  bash scripts/sanitize.sh

  echo "== Fuzzing the blob reader for 60 s (scripts/fuzz.sh)"
  bash scripts/fuzz.sh 60
}

if [[ "${BASH_SOURCE[0]}" == "$0" ]]; then
  main "$@"
fi
