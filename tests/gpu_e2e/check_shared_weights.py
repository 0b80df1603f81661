"""GPU check of a two-method program whose methods share one nn.Linear (export_shared_weights.py).

Cases, one result line each:
  module   shared_weights_gpu_test (from --bin) loads both methods with ExecuTorch's Module, checks
           that Kiln holds the shared Linear once (kiln_executorch_weight_bytes), runs both
           methods against eager outputs, unloads and checks Kiln's memory is back to zero;
           its measured numbers are echoed
  runner   kiln_runner (from --runner) runs each method on its own and matches eager outputs
Runs with python3 + numpy only. Exits non-zero when any case fails or anything it needs is missing.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

BINARY = "shared_weights_gpu_test"


def find_binary(bin_dir):
    hits = sorted(p for p in Path(bin_dir).rglob(BINARY) if p.is_file())
    return hits[0] if hits else None


def case_module(args):
    binary = find_binary(args.bin)
    if binary is None:
        return False, f"no {BINARY} under --bin {args.bin}"
    env = dict(os.environ, KILN_SHARED_WEIGHTS_DIR=str(args.dir))
    proc = subprocess.run([str(binary)], env=env, capture_output=True, text=True, timeout=300)
    for line in proc.stdout.splitlines():
        if line.startswith("[shared weights]"):
            print("  " + line)
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-40:])
        return False, f"{binary.name} exited {proc.returncode}:\n{tail}"
    return True, f"{binary.name} passed"


def case_runner(args, meta):
    if args.runner is None or not Path(args.runner).is_file():
        return False, f"kiln_runner not found: --runner {args.runner}"
    details = []
    ok = True
    for method, info in meta["methods"].items():
        want = np.fromfile(args.dir / info["expected"], dtype=np.float32)
        with tempfile.TemporaryDirectory() as out:
            proc = subprocess.run(
                [args.runner, str(args.dir / meta["pte"]), "--method", method,
                 "--input", f"0={args.dir / meta['input']['file']}", "--output-dir", out],
                capture_output=True, text=True, timeout=300)
            got_path = Path(out) / "output_0.bin"
            if proc.returncode != 0 or not got_path.is_file():
                ok = False
                details.append(f"{method}: kiln_runner exited {proc.returncode}: "
                               f"{(proc.stdout + proc.stderr)[-2000:]}")
                continue
            got = np.fromfile(got_path, dtype=np.float32)
        if got.shape != want.shape:
            ok = False
            details.append(f"{method}: {got.size} values, expected {want.size}")
            continue
        err = float(np.max(np.abs(got - want) / (1e-4 + 1e-4 * np.abs(want))))
        ok &= err <= 1.0
        details.append(f"{method}: max |error|/tol {err:.3f} (max abs {np.max(np.abs(got - want)):.2e})")
    return ok, "; ".join(details)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", required=True, type=Path)
    parser.add_argument("--bin", required=True, type=Path)
    parser.add_argument("--runner")
    parser.add_argument("--install", type=Path)  # accepted for a uniform call; not needed
    args = parser.parse_args()

    meta_path = args.dir / "meta.json"
    if not meta_path.is_file():
        print(f"shared_weights: FAIL: {meta_path} is missing (run export_shared_weights.py)")
        return 1
    meta = json.loads(meta_path.read_text())
    w = meta["weight_bytes"]
    print(f"shared_weights: program {meta['pte_bytes']} bytes; weight bytes: one copy of each "
          f"{w['expected']}, shared Linear {w['shared_linear']}, proj {w['proj']}, "
          f"without sharing {w['unshared']}")
    failed = 0
    for name, run in (("module", lambda: case_module(args)),
                      ("runner", lambda: case_runner(args, meta))):
        try:
            ok, detail = run()
        except Exception as e:  # a crash in one case is that case's failure
            ok, detail = False, f"{type(e).__name__}: {e}"
        print(f"shared_weights {name}: {'PASS' if ok else 'FAIL'}: {detail}")
        failed += not ok
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
