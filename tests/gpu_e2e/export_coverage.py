"""Stages the coverage report's models for check_coverage.py: bench/export_coverage.py's programs
(KilnPartitioner, fp32, seeded grid weights), inputs and eager outputs.

    export_coverage.py --out DIR

Stages the HF transformers configs (small: a minute or two). KILN_COVERAGE_STAGED=DIR (a finished
`bench/export_coverage.py --out DIR --models ...` of the same tree, e.g. every torchvision model
too) is copied instead.
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    staged = os.environ.get("KILN_COVERAGE_STAGED")
    if staged:
        shutil.copytree(staged, args.out, dirs_exist_ok=True)
        return 0
    sys.path.insert(0, str(BENCH))
    import coverage_models
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(BENCH)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
    return subprocess.call([sys.executable, str(BENCH / "export_coverage.py"), "--out",
                            str(args.out), "--models", ",".join(coverage_models.HF_MODELS)],
                           env=env)


if __name__ == "__main__":
    sys.exit(main())
