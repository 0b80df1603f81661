"""GPU side of the device-resident check. Builds examples/device_resident against the installed
Kiln package (--install DIR; executorch's package is at DIR/../executorch), runs it on
device_resident.pte (device pointers in and out, on the app's CUDA stream) and compares with the
eager outputs; then runs default.pte (the negative control, with et_copy operators) through
kiln_runner. One line per case with numbers; exits non-zero on any failure.

    python3 check_device_resident.py --dir DIR --runner kiln_runner --install DIR [--bin DIR]"""

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]
TOLERANCE = 1e-3


def run(cmd, **kw):
    return subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=600, **kw)


def build_app(install, work):
    cmake = shutil.which("cmake")
    if cmake is None:
        raise SystemExit("device_resident build: FAIL no cmake on PATH (needed to build the app "
                         "from the installed package)")
    prefix = f"{install};{install.parent / 'executorch' / 'lib' / 'cmake' / 'executorch'}"
    gen = ["-G", "Ninja"] if shutil.which("ninja") else []
    # Without a CUDA toolkit on the machine, the app takes the CUDA runtime of PyTorch's wheels.
    cuda_runtime = Path(sysconfig.get_paths()["purelib"]) / "nvidia" / "cu13"
    cfg = run([cmake, "-S", REPO / "examples" / "device_resident", "-B", work, *gen,
               "-DCMAKE_BUILD_TYPE=Release", f"-DCMAKE_PREFIX_PATH={prefix}",
               f"-DKILN_CUDA_RUNTIME_ROOT={cuda_runtime}"])
    if cfg.returncode == 0:
        cfg = run([cmake, "--build", work])
    if cfg.returncode != 0:
        print(cfg.stdout[-3000:] + cfg.stderr[-3000:])
        raise SystemExit("device_resident build: FAIL (cmake, see above)")
    print("device_resident build: ok")
    return work / "device_resident"


def check_app(app, d, meta):
    cmd = [app, d / "device_resident.pte"]
    cmd += [a for i in range(len(meta["inputs"])) for a in ("--input", d / f"input_{i}.bin")]
    cmd += [a for i in range(len(meta["outputs"])) for a in ("--expected", d / f"expected_output_{i}.bin")]
    cmd += ["--iterations", "200", "--tolerance", str(TOLERANCE)]
    r = run(cmd)
    out = r.stdout
    err = re.search(r"max_error=(\S+)", out)
    lat = re.search(r"median_latency_ms=(\S+) median_enqueue_ms=(\S+)", out)
    devices = re.findall(r"device_memory=(\w+)", out)
    ok = (r.returncode == 0 and err is not None and lat is not None
          and devices == ["yes"] * len(meta["outputs"]))
    print(f"device_resident app: {'ok' if ok else 'FAIL'} max_error={err.group(1) if err else '?'} "
          f"median_latency_ms={lat.group(1) if lat else '?'} "
          f"median_enqueue_ms={lat.group(2) if lat else '?'} outputs_device_memory={devices}")
    if not ok:
        print(out[-3000:] + r.stderr[-3000:])
    return ok


def check_default(runner, d, meta, work):
    cmd = [runner, d / "default.pte", "--output-dir", work]
    cmd += [a for i in range(len(meta["inputs"])) for a in ("--input", f"{i}={d / f'input_{i}.bin'}")]
    r = run(cmd)
    worst, ok = 0.0, r.returncode == 0
    for i in range(len(meta["outputs"])):
        got_path = work / f"output_{i}.bin"
        if not ok or not got_path.exists():
            ok = False
            break
        got = np.fromfile(got_path, dtype=np.float32)
        want = np.fromfile(d / f"expected_output_{i}.bin", dtype=np.float32)
        worst = max(worst, float(np.abs(got.astype(np.float64) - want).max()) if got.shape == want.shape else float("inf"))
    ok = ok and worst <= TOLERANCE
    print(f"default (et_copy negative control) via kiln_runner: {'ok' if ok else 'FAIL'} "
          f"max_error={worst:.3g} copies={meta['default']['copies']}")
    if not ok:
        print(r.stdout[-3000:] + r.stderr[-3000:])
    return ok


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", type=Path, required=True)
    ap.add_argument("--runner", type=Path, required=True)
    ap.add_argument("--install", type=Path, required=True)
    ap.add_argument("--bin", type=Path)
    args = ap.parse_args()
    meta = json.loads((args.dir / "meta.json").read_text())
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        app = build_app(args.install.resolve(), tmp / "app")
        results = [check_app(app, args.dir, meta),
                   check_default(args.runner, args.dir, meta, tmp / "default_out")]
    sys.exit(0 if all(results) else 1)


if __name__ == "__main__":
    main()
