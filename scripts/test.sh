#!/usr/bin/env bash
# The test command (what .ci/run calls): sets everything up through scripts/setup.sh, then runs
# the C++ tests (CTest; tests labelled gpu need a CUDA device and run in scripts/gpu-check.sh) and
# the Python tests (pytest). A suite that collects no tests fails: ctest --no-tests=error, and
# pytest exits 5.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
bash scripts/setup.sh

echo "== C++ tests (CTest)"
(cd build && "$root/.venv/bin/ctest" --output-on-failure --no-tests=error -LE gpu -j2)

echo "== Python tests (pytest)"
PYTHONPATH="$root/python${PYTHONPATH:+:$PYTHONPATH}" "$root/.venv/bin/python" -m pytest tests -q "$@"
