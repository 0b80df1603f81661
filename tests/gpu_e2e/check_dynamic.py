"""Runs the bounded-dynamic programs of export_dynamic.py through kiln_runner on the GPU machine.

    check_dynamic.py --dir DIR --runner PATH/kiln_runner

For every case in DIR/cases.json: runs kiln_runner with the case's --input and --shape, reads
output 0, and compares it with the eager output (fp32: |a - e| <= atol + rtol * |e|; bf16: max abs
error <= rel_max * max |e|). A case marked must_fail (a size past the exported bound) must exit
non-zero by itself, not by a signal, with a message that names the bound. Prints one line per case; exits 1 if
any case fails. Needs python3 and numpy only.
"""

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np


def run_case(runner, d, case, tmp):
    out_dir = Path(tmp) / case["name"]
    cmd = [str(runner), str(d / case["program"]), "--input", f"0={d / case['input']}",
           "--shape", "0=" + ",".join(map(str, case["shape"])), "--output-dir", str(out_dir)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    text = (r.stderr.strip().splitlines() or [""])[-1]
    if case.get("must_fail"):
        ok = r.returncode > 0 and "past the bound" in r.stderr
        why = "signal" if r.returncode < 0 else f"rc={r.returncode}"
        return ok, f"{why}, message: {text[:160]}"
    if r.returncode != 0:
        return False, f"rc={r.returncode}: {r.stderr.strip()[-400:]}"
    if not (out_dir / "output_0.bin").is_file():
        return False, f"the runner wrote no {out_dir / 'output_0.bin'}"
    actual = np.fromfile(out_dir / "output_0.bin", dtype=np.float32)
    expected = np.fromfile(d / case["expected"], dtype=np.float32)
    want = int(np.prod(case["expected_shape"]))
    if actual.size != want or expected.size != want:
        return False, f"{actual.size} output values, expected {want}"
    shape_line = next((l for l in r.stdout.splitlines() if l.startswith("output[0]")), "")
    if "shape=[" + ",".join(map(str, case["expected_shape"])) + "]" not in shape_line:
        return False, f"runner printed '{shape_line}', expected shape {case['expected_shape']}"
    err = np.abs(actual.astype(np.float64) - expected.astype(np.float64))
    tol = case["tolerance"]
    scale = float(np.abs(expected).max()) if expected.size else 0.0
    if "rel_max" in tol:
        ok = bool(np.isfinite(actual).all()) and err.max() <= tol["rel_max"] * max(scale, 1e-30)
    else:
        ok = bool(np.isfinite(actual).all()) and bool(
            (err <= tol["atol"] + tol["rtol"] * np.abs(expected)).all())
    return ok, f"max abs err {err.max():.3g} (max |expected| {scale:.3g}, tolerance {tol})"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", required=True, type=Path)
    parser.add_argument("--runner", required=True, type=Path)
    parser.add_argument("--bin", type=Path)
    parser.add_argument("--install", type=Path)
    args = parser.parse_args()
    cases = json.loads((args.dir / "cases.json").read_text())
    failures = 0
    with tempfile.TemporaryDirectory() as tmp:
        for case in cases:
            try:
                ok, detail = run_case(args.runner, args.dir, case, tmp)
            except subprocess.TimeoutExpired:
                ok, detail = False, "timed out"
            except (OSError, ValueError) as e:
                ok, detail = False, f"{type(e).__name__}: {e}"
            failures += not ok
            print(f"{'PASS' if ok else 'FAIL'} dynamic {case['name']} "
                  f"shape={case['shape']}: {detail}", flush=True)
    print(f"dynamic: {len(cases) - failures}/{len(cases)} cases passed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
