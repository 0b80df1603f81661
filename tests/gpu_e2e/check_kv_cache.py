"""GPU check of the KV-cache decode programs written by export_kv_cache.py.

    check_kv_cache.py --dir DIR --runner PATH/kiln_runner [--install DIR] [--bin DIR]

For each precision: every decode step runs in ONE loaded method (kiln_runner --next), so the
caches live in the Kiln delegate's device state from step to step; each step's output is compared
with eager PyTorch and the bytes Kiln copied in that step are printed and checked against the
step's inputs and output (the 8 KiB of caches never cross). A control runs step 2 on a fresh
method: its output must differ from the expected one, since the step reads what step 1 wrote.
A position past the cache must fail the execution with an index_put error, not crash.
Then examples/tiny_lm is built with CMake against --install DIR (executorch at DIR/../executorch)
and generates tokens greedily from DIR/tiny_lm/tiny_lm.pte: they must equal eager PyTorch's, and
its tokens/s is printed. One line per case; exits non-zero on any failure. Needs python3 with
numpy and cmake, no executorch.
"""

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

COPY_LINE = re.compile(r"copy_bytes host_to_device=(\d+) device_to_host=(\d+) kiln_executes=(\d+)")


def run_runner(runner, pte, steps, out_dir):
    cmd = [str(runner), str(pte), "--copy-stats", "--output-dir", str(out_dir), "--values", "4"]
    for k, (x, pos) in enumerate(steps):
        if k:
            cmd.append("--next")
        cmd += ["--input", f"0={x}", "--input", f"1={pos}"]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300)


def close(actual, expected, tol):
    return bool(np.all(np.abs(actual - expected) <= tol["atol"] + tol["rtol"] * np.abs(expected)))


def check_precision(args, meta, precision, failures):
    d = args.dir
    tol = meta["precisions"][precision]
    program = meta["programs"][precision]
    if program["delegates"] != 1 or program["cpu_operators"]:
        failures.append(precision)
        print(f"kv_cache {precision} export: FAIL delegates={program['delegates']} "
              f"cpu_operators={program['cpu_operators']}")
        return
    pte = d / program["file"]
    steps = [(d / s["x"], d / s["pos"]) for s in meta["steps"]]
    with tempfile.TemporaryDirectory() as tmp:
        r = run_runner(args.runner, pte, steps, Path(tmp))
        if r.returncode != 0:
            failures.append(precision)
            print(f"kv_cache {precision} decode: FAIL runner rc={r.returncode}: "
                  f"{r.stderr.strip()[-500:]}")
            return
        copies = [tuple(map(int, m.groups())) for m in COPY_LINE.finditer(r.stdout)]
        want = meta["copy_per_step"]
        for k, s in enumerate(meta["steps"]):
            got = np.fromfile(Path(tmp) / f"run{k}_output_0.bin", dtype=np.float32)
            expected = np.fromfile(d / s["expected"], dtype=np.float32)
            err = float(np.max(np.abs(got - expected)))
            ok_values = close(got, expected, tol)
            h2d, d2h, n = copies[k] if k < len(copies) else (-1, -1, -1)
            ok_copy = n == 1 and h2d == want["host_to_device"] and d2h == want["device_to_host"]
            ok = ok_values and ok_copy
            if not ok:
                failures.append(f"{precision} step{k + 1}")
            print(f"kv_cache {precision} step{k + 1} pos={s['position']}: "
                  f"{'PASS' if ok else 'FAIL'} max_abs_err={err:.3g} "
                  f"(atol {tol['atol']}, rtol {tol['rtol']}) bytes_copied h2d={h2d} d2h={d2h} "
                  f"(expected {want['host_to_device']}/{want['device_to_host']}; caches "
                  f"{meta['cache_bytes']} B stay on the GPU)")

    # Control: step 2 on a fresh method has nothing of step 1 in its cache.
    with tempfile.TemporaryDirectory() as tmp:
        r = run_runner(args.runner, pte, steps[1:2], Path(tmp))
        expected = np.fromfile(d / meta["steps"][1]["expected"], dtype=np.float32)
        if r.returncode == 0:
            got = np.fromfile(Path(tmp) / "output_0.bin", dtype=np.float32)
            diff = float(np.max(np.abs(got - expected)))
            ok = not close(got, expected, tol)
        else:
            diff, ok = float("nan"), False
        if not ok:
            failures.append(f"{precision} control")
        print(f"kv_cache {precision} control (step2 without step1): {'PASS' if ok else 'FAIL'} "
              f"differs from the stateful result by {diff:.3g}")

    # A position past the cache: an execution error naming index_put, not a crash.
    with tempfile.TemporaryDirectory() as tmp:
        bad = [steps[0], (steps[1][0], d / meta["bad_position_file"])]
        r = run_runner(args.runner, pte, bad, Path(tmp))
        ok = r.returncode == 1 and "index_put" in r.stderr and "position 32" in r.stderr
        if not ok:
            failures.append(f"{precision} bad position")
        line = next((l for l in r.stderr.splitlines() if "index_put" in l), r.stderr.strip()[-200:])
        print(f"kv_cache {precision} bad position 32: {'PASS' if ok else 'FAIL'} rc={r.returncode} "
              f"{line.strip()}")


REPO = Path(__file__).resolve().parents[2]


def check_tiny_lm_copies(args, meta, failures):
    """Three prompt steps of the tiny LM through kiln_runner --next: per step only the token and
    the position go in and the logits (plus the engine's error flag) come out; the four caches
    (layers x k/v, float32 [1, heads, max_seq, d_model / heads]) stay on the GPU."""
    lm = meta["tiny_lm"]
    cache_bytes = lm["layers"] * 2 * lm["max_seq"] * lm["d_model"] * 4
    want_in, want_out = 8 + 8, lm["vocab"] * 4 + meta["error_flag_bytes"]
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [str(args.runner), str(args.dir / "tiny_lm" / lm["model"]), "--copy-stats",
               "--values", "2"]
        for pos, token in enumerate(lm["prompt"][:3]):
            np.array([token], dtype=np.int64).tofile(Path(tmp) / f"tok{pos}.bin")
            np.array([pos], dtype=np.int64).tofile(Path(tmp) / f"pos{pos}.bin")
            cmd += (["--next"] if pos else []) + ["--input", f"0={tmp}/tok{pos}.bin",
                                                  "--input", f"1={tmp}/pos{pos}.bin"]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    copies = [tuple(map(int, m.groups())) for m in COPY_LINE.finditer(r.stdout)]
    ok = r.returncode == 0 and len(copies) == 3 and \
        all(c == (want_in, want_out, 1) for c in copies)
    if not ok:
        failures.append("tiny_lm copies")
    print(f"tiny_lm bytes copied per decode step: {'PASS' if ok else 'FAIL'} "
          f"{[(h, d) for h, d, _ in copies]} (expected h2d={want_in} d2h={want_out}; "
          f"caches {cache_bytes} B stay on the GPU)"
          + ("" if r.returncode == 0 else f" runner rc={r.returncode}: {r.stderr.strip()[-300:]}"))


def check_tiny_lm(args, meta, failures):
    lm = meta["tiny_lm"]
    if args.install is None:
        failures.append("tiny_lm")
        print("tiny_lm: FAIL no --install DIR given: the app is built against the install tree")
        return
    cmake = shutil.which("cmake")
    if cmake is None:
        failures.append("tiny_lm")
        print("tiny_lm: FAIL no cmake on PATH to build examples/tiny_lm")
        return
    et_cmake = args.install.parent / "executorch" / "lib" / "cmake" / "executorch"
    with tempfile.TemporaryDirectory() as build:
        gen = ["-G", "Ninja"] if shutil.which("ninja") else []
        cfg = subprocess.run([cmake, "-S", REPO / "examples" / "tiny_lm", "-B", build, *gen,
                              "-DCMAKE_BUILD_TYPE=Release",
                              f"-DCMAKE_PREFIX_PATH={args.install};{et_cmake}"],
                             capture_output=True, text=True)
        bld = subprocess.run([cmake, "--build", build], capture_output=True, text=True) \
            if cfg.returncode == 0 else cfg
        if bld.returncode != 0:
            failures.append("tiny_lm build")
            print(f"tiny_lm build: FAIL {(bld.stdout + bld.stderr).strip()[-800:]}")
            return
        prompt = " ".join(map(str, lm["prompt"]))
        expect = " ".join(map(str, lm["expected_tokens"]))
        r = subprocess.run([Path(build) / "tiny_lm", args.dir / "tiny_lm" / lm["model"],
                            "--prompt", prompt, "--new-tokens", str(lm["new_tokens"]),
                            "--expect", expect], capture_output=True, text=True, timeout=300)
    rate = re.search(r"([\d.]+) tokens/s", r.stdout)
    ok = r.returncode == 0 and "matches eager greedy tokens: yes" in r.stdout
    if not ok:
        failures.append("tiny_lm")
    verdict = "match" if ok else ("differ from" if "matches eager greedy tokens: no" in r.stdout
                                  else f"not generated (app rc={r.returncode}), so not compared with")
    print(f"tiny_lm {lm['precision']} {lm['layers']} layers vocab {lm['vocab']}: "
          f"{'PASS' if ok else 'FAIL'} {lm['new_tokens']} greedy tokens {verdict} eager, "
          f"{rate.group(1) if rate else '?'} tokens/s (host round trip per token)")
    if not ok:
        print((r.stdout + r.stderr).strip()[-1500:])


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", required=True, type=Path)
    parser.add_argument("--runner", required=True, type=Path)
    parser.add_argument("--install", type=Path)
    parser.add_argument("--bin", type=Path)
    args = parser.parse_args()
    meta = json.loads((args.dir / "meta.json").read_text())
    failures = []
    for precision in meta["precisions"]:
        check_precision(args, meta, precision, failures)
    check_tiny_lm_copies(args, meta, failures)
    check_tiny_lm(args, meta, failures)
    print(f"check_kv_cache: {'FAIL ' + ', '.join(failures) if failures else 'all passed'}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
