"""GPU end-to-end, export side (runs here, with executorch): examples/export_coalesced.py's programs
into --out, plus tools/kiln_verify.py, so check_coalesced.py on the GPU machine needs only python3,
numpy and kiln_runner."""
from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "examples"))
sys.path.insert(0, str(REPO / "python"))

import export_coalesced  # noqa: E402  (the example, found through the path above)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    # fp32: the check holds every program to 1e-3 of eager.
    rc = export_coalesced.main(["--out", str(args.out), "--precision", "fp32"])
    shutil.copy2(REPO / "tools" / "kiln_verify.py", args.out / "kiln_verify.py")
    return rc


if __name__ == "__main__":
    sys.exit(main())
