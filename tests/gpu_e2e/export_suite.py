"""Stages ExecuTorch's backend operator suite for check_suite.py: runs the suite with the kiln flow
(tests/suite/run_suite.py, which lowers every case with KilnPartitioner and checks it on the CPU
through the reference interpreter) and keeps, per case that has a Kiln delegate, its .pte, raw
inputs and eager PyTorch's outputs (manifest.json, export_operators.py's format), and
results.jsonl, the suite's result per subtest.

    export_suite.py --out DIR [--subset ci]

A case the suite fails on the CPU is still staged when it got as far as a program; the suite's
own exit status is printed and written to DIR/cpu_status (CI is where it fails the run).
The whole operator suite takes most of an hour on 2 cores: KILN_SUITE_STAGED=DIR (a finished
`run_suite.py --out DIR` of the same tree) copies that run instead of running the suite again.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

RUN_SUITE = Path(__file__).resolve().parents[1] / "suite" / "run_suite.py"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--subset", choices=["ci"])
    args = ap.parse_args()
    # KILN_SUITE_SUBSET=ci: the CI subset (one file per operator family, minutes instead of an hour).
    args.subset = args.subset or os.environ.get("KILN_SUITE_SUBSET") or None
    staged = os.environ.get("KILN_SUITE_STAGED")
    if staged:
        shutil.copytree(staged, args.out, dirs_exist_ok=True)
        status = "copied from " + staged
    else:
        command = [sys.executable, str(RUN_SUITE), "--out", str(args.out)]
        status = subprocess.call(command + (["--subset", args.subset] if args.subset else []),
                                 stdout=subprocess.DEVNULL)
        (args.out / "cpu_status").write_text(f"{status}\n")
    manifest = json.loads((args.out / "manifest.json").read_text())
    print(f"export_suite: {len(manifest)} delegated cases -> {args.out} (the suite's CPU run "
          f"exited {status})")
    return 0 if manifest else 1


if __name__ == "__main__":
    sys.exit(main())
