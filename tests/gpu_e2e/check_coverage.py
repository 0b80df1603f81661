"""On the GPU machine: every coverage model export_coverage.py staged runs through kiln_runner and
gives eager PyTorch's answer within check_operators.py's tolerances (fp32: 1e-4 of the output's
magnitude). Writes {model: the output's error relative to its magnitude, or null where the run
failed} to $KILN_E2E_OUT/coverage_gpu.json when set (bench/coverage.py --gpu reads it).

    check_coverage.py --dir DIR --runner PATH/kiln_runner

Prints one line per model and a closing 'N passed, M failed'; exits non-zero on any failure.
"""
from __future__ import annotations

import sys

import check_operators  # tests/gpu_e2e/check_operators.py, beside this script
import e2e_args


def main() -> int:
    args = e2e_args.parse(__doc__)
    failed, relative = 0, {}
    for case, why, errors in check_operators.checked_cases(args):
        failed += why is not None
        relative[case["case"]] = max(errors) if errors else (0.0 if why is None else None)
        error = f" (relative error {relative[case['case']]:.2e})" if errors else ""
        print(f"coverage {case['case']}: {'ok' if why is None else 'FAIL ' + why}{error}",
              flush=True)
    print(f"coverage: {len(relative) - failed} passed, {failed} failed")
    e2e_args.write_results("coverage_gpu.json", relative)
    return 1 if failed or not relative else 0


if __name__ == "__main__":
    sys.exit(main())
