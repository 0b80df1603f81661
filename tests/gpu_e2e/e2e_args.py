"""The command line every check_<name>.py takes from scripts/gpu-check.sh run:
--dir (what export_<name>.py staged), --runner (kiln_runner), --bin (the GPU test binaries) and
--install (the installed kiln_executorch tree); a check uses the ones it needs. write_results
puts a check's JSON where scripts/gpu-check.sh run collects results ($KILN_E2E_OUT)."""
import argparse
import json
import os
from pathlib import Path


def parse(doc: str, extra=None) -> argparse.Namespace:
    """`extra(parser)`, when given, adds the check's own options."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--dir", type=Path, required=True)
    ap.add_argument("--runner", type=Path, required=True)
    ap.add_argument("--bin", type=Path, help="the staged GPU test binaries")
    ap.add_argument("--install", type=Path, help="the installed kiln_executorch tree")
    if extra is not None:
        extra(ap)
    return ap.parse_args()


def write_results(name: str, results) -> None:
    """Writes `results` as JSON to $KILN_E2E_OUT/name when that is set."""
    if os.environ.get("KILN_E2E_OUT"):
        Path(os.environ["KILN_E2E_OUT"], name).write_text(json.dumps(results, indent=1) + "\n")
