"""The command line every check_<name>.py takes from scripts/gpu-check.sh run:
--dir (what export_<name>.py staged), --runner (kiln_runner), --bin (the GPU test binaries) and
--install (the installed kiln_executorch tree); a check uses the ones it needs."""
import argparse
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
