"""GPU half of the concurrency check, over what export_concurrency.py wrote:

    check_concurrency.py --dir DIR --bin TESTS_DIR [--runner PATH/kiln_runner] [--install DIR]

1. program_threads_gpu_test (from --bin) with KILN_TEST_PROGRAMS=DIR: Kiln-delegated programs
   loaded with ExecuTorch's Module and executed from several threads at once, hundreds of times
   each, plus the method with several Kiln delegates; every output is compared with eager PyTorch.
2. With --runner: each program's first case once more through kiln_runner, compared here.

Prints one line per case with its numbers and exits non-zero on any failure (a missing binary,
program or file is a failure). Needs python3 and numpy; no executorch or kiln_executorch packages.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

TEST_BINARY = "program_threads_gpu_test"
ATOL = RTOL = 2e-4
DTYPES = {"float32": np.float32, "int64": np.int64}


def run_threads_test(binary: Path, programs: Path) -> bool:
    if not binary.is_file():
        print(f"FAIL {TEST_BINARY}: {binary} is missing (stage the C++ GPU tests with --bin)")
        return False
    env = dict(os.environ, KILN_TEST_PROGRAMS=str(programs))
    try:
        r = subprocess.run([str(binary)], env=env, capture_output=True, text=True, errors="replace",
                           timeout=900)
    except subprocess.TimeoutExpired:
        print(f"FAIL {TEST_BINARY}: no result after 900 s (a hang with threads?)")
        return False
    out = r.stdout + r.stderr
    for line in out.splitlines():
        if line.startswith("thread ") or line.startswith("several_delegates:"):
            print(f"     {line}")
    results = re.findall(r"^\[\s+(OK|FAILED)\s+\] (\S+)(?: \((\d+) ms\))?$", out, re.M)
    for status, name, ms in results:
        print(f"{'PASS' if status == 'OK' else 'FAIL'} {name}" + (f" ({ms} ms)" if ms else ""))
    ok = r.returncode == 0 and bool(results) and all(s == "OK" for s, _, _ in results)
    if not ok:
        print(f"FAIL {TEST_BINARY}: exit code {r.returncode}; its output ends with:")
        print("\n".join(out.splitlines()[-40:]))
    return ok


def run_through_runner(runner: Path, programs: Path, manifest: list) -> bool:
    if not runner.is_file():
        print(f"FAIL kiln_runner: {runner} is missing")
        return False
    ok = True
    for p in manifest:
        case = p["cases"][0]
        with tempfile.TemporaryDirectory() as out:
            cmd = [str(runner), str(programs / p["pte"]), "--method", p["method"], "--output-dir", out]
            for i, inp in enumerate(case["inputs"]):
                cmd += ["--input", f"{i}={programs / inp['file']}"]
            r = subprocess.run(cmd, capture_output=True, text=True, errors="replace", timeout=300)
            if r.returncode != 0:
                print(f"FAIL runner {p['name']} case 0: exit code {r.returncode}: {r.stderr.strip()[-500:]}")
                ok = False
                continue
            for o, exp in enumerate(case["expected"]):
                want = np.fromfile(programs / exp["file"], dtype=DTYPES[exp["dtype"]])
                got_path = Path(out) / f"output_{o}.bin"
                got = np.fromfile(got_path, dtype=DTYPES[exp["dtype"]]) if got_path.exists() else None
                if got is None or got.shape != want.shape:
                    print(f"FAIL runner {p['name']} case 0 output {o}: missing or "
                          f"{None if got is None else got.shape} elements, want {want.shape}")
                    ok = False
                    continue
                err = float(np.max(np.abs(got.astype(np.float64) - want))) if want.size else 0.0
                good = bool(np.allclose(got, want, atol=ATOL, rtol=RTOL))
                ok &= good
                print(f"{'PASS' if good else 'FAIL'} runner {p['name']} case 0 output {o}: "
                      f"max abs error {err:.3g} (atol {ATOL}, rtol {RTOL}), "
                      f"{p['kiln_delegates']} Kiln delegate(s)")
    return ok


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", type=Path, required=True, help="what export_concurrency.py --out wrote")
    ap.add_argument("--bin", type=Path, required=True, help="folder holding " + TEST_BINARY)
    ap.add_argument("--runner", type=Path, help="kiln_runner, for the cross-check through the runner")
    ap.add_argument("--install", type=Path, help="unused; accepted like the other checks")
    args = ap.parse_args()
    manifest_path = args.dir / "manifest.json"
    if not manifest_path.is_file():
        print(f"FAIL concurrency: {manifest_path} is missing; run export_concurrency.py --out {args.dir}")
        return 1
    manifest = json.loads(manifest_path.read_text())
    ok = run_threads_test(args.bin / TEST_BINARY, args.dir)
    if args.runner is not None:
        ok &= run_through_runner(args.runner, args.dir, manifest)
    print("concurrency: " + ("all passed" if ok else "FAILED"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
