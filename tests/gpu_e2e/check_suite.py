"""On the GPU machine: every case of ExecuTorch's backend operator suite that export_suite.py
staged (each program with a Kiln delegate; operators left outside run on ExecuTorch's CPU kernels
inside kiln_runner) runs through kiln_runner and gives eager PyTorch's answer, compared as
check_operators.py compares (floating outputs within 1e-4 of the output's magnitude, float16
1e-3, bfloat16 8e-3, float64 1e-4; NaN and infinities where eager has them; integers exactly).

    check_suite.py --dir DIR --runner PATH/kiln_runner

Runs 8 cases at a time (one GPU, one CUDA context each). Prints one line per case and
'N passed, M failed'; writes {case: null | why} to $KILN_E2E_OUT/suite_gpu.json when set
(scripts/gpu-check.sh run sets it to its results folder; bench/suite_summary.py --gpu reads it). Exits non-zero on any failure. Needs numpy only.
"""
from __future__ import annotations

import sys

import check_operators  # tests/gpu_e2e/check_operators.py, beside this script
import e2e_args

check_operators.TOLERANCE.setdefault("float64", 1e-4)


def main() -> int:
    args = e2e_args.parse(__doc__)
    results = {}
    for case, why, _ in check_operators.checked_cases(args, jobs=8):
        results[case["case"]] = why
        print(f"suite {case['case']}: {'ok' if why is None else 'FAIL ' + why}", flush=True)
    failed = sum(why is not None for why in results.values())
    print(f"suite: {len(results) - failed} passed, {failed} failed")
    e2e_args.write_results("suite_gpu.json", results)
    return 1 if failed or not results else 0


if __name__ == "__main__":
    sys.exit(main())
