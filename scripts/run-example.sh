#!/usr/bin/env bash
# The main job: sets everything up through scripts/setup.sh, then exports a small model and runs it
# with the reference runner (examples/quickstart.py says what it does).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
bash "$root/scripts/setup.sh"
PYTHONPATH="$root/python${PYTHONPATH:+:$PYTHONPATH}" exec "$root/.venv/bin/python" "$root/examples/quickstart.py" "$@"
