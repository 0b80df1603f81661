"""On the GPU machine: every operator case export_operators.py staged runs through kiln_runner and
gives eager PyTorch's answer (recorded at export): floating outputs within 1e-4 (float16: 1e-3,
bfloat16: 8e-3, about one unit in the last place) of the output's magnitude (max(1, max|expected|)),
NaN and infinities (with their sign) where eager has them; integer and Bool outputs exactly.

    check_operators.py --dir DIR --runner PATH/kiln_runner

Prints one line per case and a closing 'N passed, M failed'; exits non-zero on any failure.
Needs numpy only.
"""
from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

import e2e_args  # tests/gpu_e2e/e2e_args.py, beside this script

TOLERANCE = {"float32": 1e-4, "float16": 1e-3, "bfloat16": 8e-3}


def load(path: Path, dtype: str) -> np.ndarray:
    """A raw file of `dtype`; bfloat16 (stored as its 16 bits) widened to float32."""
    if dtype == "bfloat16":
        return (np.fromfile(path, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)
    return np.fromfile(path, dtype=dtype)


def read(directory: Path, spec: dict) -> np.ndarray:
    return load(directory / spec["file"], spec["dtype"]).reshape(spec["shape"])


def compare(actual: np.ndarray, expected: np.ndarray, tolerance: float,
            errors: list | None = None) -> str | None:
    """None when actual matches expected, else what differs. The relative error of a floating
    output (max abs error / max(1, max|expected|)) is appended to `errors` when given."""
    if actual.size != expected.size:
        return f"{actual.size} elements, expected {expected.size}"
    actual = actual.reshape(expected.shape)
    if expected.dtype.kind != "f":
        bad = np.flatnonzero(actual != expected)
        return None if bad.size == 0 else (
            f"{bad.size} elements differ, first at {bad[0]}: {actual.flat[bad[0]]} vs "
            f"{expected.flat[bad[0]]}")
    if not np.array_equal(np.isnan(actual), np.isnan(expected)):
        return "NaN where eager has none, or the other way round"
    infinite = np.isinf(expected)
    if not np.array_equal(np.isinf(actual), infinite) or not np.array_equal(
            actual[infinite], expected[infinite]):
        return "an infinity where eager has none, of the other sign, or missing"
    finite = np.isfinite(expected)
    if not finite.any():
        return None
    scale = max(1.0, float(np.abs(expected[finite]).max()))
    err = float(np.abs(actual[finite].astype(np.float64) - expected[finite]).max())
    if errors is not None:
        errors.append(err / scale)
    return None if err <= tolerance * scale else f"max abs error {err:.3g} > {tolerance} * {scale:.3g}"


def run_case(runner: Path, directory: Path, case: dict, errors: list | None = None) -> str | None:
    with tempfile.TemporaryDirectory() as tmp:
        command = [str(runner), str(directory / case["program"]), "--output-dir", tmp]
        for i, spec in enumerate(case["inputs"]):
            command += ["--input", f"{i}={directory / spec['file']}"]
        r = subprocess.run(command, capture_output=True, text=True, timeout=300)
        if r.returncode != 0:
            return f"kiln_runner exit {r.returncode}: {r.stderr.strip()[-400:]}"
        for j, spec in enumerate(case["expected"]):
            path = Path(tmp) / f"output_{j}.bin"
            if not path.exists():
                return f"kiln_runner wrote no {path.name}"
            why = compare(load(path, spec["dtype"]), read(directory, spec),
                          TOLERANCE.get(spec["dtype"], 0.0), errors)
            if why:
                return f"output {j}: {why}"
    return None


def checked_cases(args, jobs: int = 1):
    """(case, why, errors) for every case of args.dir's manifest, run through kiln_runner, in the
    manifest's order: why is None or what differs (a timeout or an unreadable file is that case's
    failure), errors the relative errors of its floating outputs. jobs > 1 runs that many
    kiln_runner processes at once (each its own CUDA context on the one GPU: the suite's hundreds
    of small programs are dominated by process start-up)."""
    def check(case):
        errors = []
        try:
            why = run_case(args.runner, args.dir, case, errors)
        except Exception as e:
            why = f"{type(e).__name__}: {e}"
        return case, why, errors

    cases = json.loads((args.dir / "manifest.json").read_text())
    if jobs <= 1:
        yield from map(check, cases)
        return
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        yield from pool.map(check, cases)


def main() -> int:
    args = e2e_args.parse(__doc__)
    passed = failed = 0
    for case, why, _ in checked_cases(args):
        passed, failed = passed + (why is None), failed + (why is not None)
        print(f"operator {case['case']}: {'ok' if why is None else 'FAIL ' + why}", flush=True)
    print(f"operators: {passed} passed, {failed} failed")
    return 1 if failed or not passed else 0


if __name__ == "__main__":
    sys.exit(main())
