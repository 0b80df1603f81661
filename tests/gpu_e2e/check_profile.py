"""GPU half of the profile check, over what export_profile.py wrote:

    check_profile.py --dir DIR --runner PATH/kiln_runner [--bin DIR] [--install DIR]

Runs the two-delegate program through `kiln_runner --profile` and checks the report: two Kiln
engines with the requested number of profiled runs, one row per op with rank 1..N, totals sorted
and above zero, means = total / runs, shares summing to 100%, the per-run and profile_total lines,
and the latency line flagged as measured with profiling on. The outputs must match eager PyTorch
with profiling on and again without it (CUDA graph replay). Prints one line per check and exits
non-zero on any failure. Needs python3 and numpy; no executorch or kiln_executorch packages.
"""
from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ATOL = RTOL = 2e-4
ITERATIONS = 20
ENGINE = re.compile(r"^Kiln engine (\d+) \((.*); (\d+) ops\): (\d+) profiled runs$")
ROW = re.compile(r"^\s+(\d+)\s+(\d+)\s+(\S+)\s+(\S+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)%$")
TOTAL = re.compile(r"profile_total kiln_op_ms_per_execute=([\d.]+) wall_ms_per_execute=([\d.]+)")


def run(runner: Path, d: Path, manifest: dict, out: Path, profile: bool):
    cmd = [str(runner), str(d / manifest["pte"]), "--input", f"0={d / manifest['input']['file']}",
           "--output-dir", str(out), "--values", "0", "--iterations", str(ITERATIONS), "--warmup", "3"]
    if profile:
        cmd.append("--profile")
    r = subprocess.run(cmd, capture_output=True, text=True, errors="replace", timeout=300)
    got = np.fromfile(out / "output_0.bin", dtype=np.float32) if r.returncode == 0 else None
    return r, got


def check_outputs(name: str, got, want) -> bool:
    if got is None or got.shape != want.shape:
        print(f"FAIL {name}: no output of {want.size} float32 values")
        return False
    err = float(np.max(np.abs(got - want)))
    ok = bool(np.allclose(got, want, atol=ATOL, rtol=RTOL))
    print(f"{'PASS' if ok else 'FAIL'} {name}: max_abs_err={err:.3g} (atol=rtol={ATOL})")
    return ok


def check_report(stdout: str) -> bool:
    ok = True

    def expect(cond: bool, what: str) -> None:
        nonlocal ok
        print(f"{'PASS' if cond else 'FAIL'} {what}")
        ok &= cond

    engines, current = [], None
    for line in stdout.splitlines():
        m = ENGINE.match(line)
        if m:
            current = {"id": int(m.group(1)), "ops": int(m.group(3)), "runs": int(m.group(4)),
                       "rows": [], "per_run": False, "total": False}
            engines.append(current)
            continue
        if current is None:
            continue
        m = ROW.match(line)
        if m:
            current["rows"].append((int(m.group(1)), int(m.group(2)), m.group(3), m.group(4),
                                    float(m.group(5)), float(m.group(6)), float(m.group(7))))
        current["total"] |= line.startswith("  total ")
        current["per_run"] |= "per run: op time" in line
    expect(len(engines) == 2, f"two Kiln engines reported (got {len(engines)})")
    expect("latency measured with --profile on" in stdout, "latency line flagged as profiled")
    for e in engines:
        rows = e["rows"]
        totals = [r[4] for r in rows]
        shares = sum(r[6] for r in rows)
        expect(e["runs"] == ITERATIONS, f"engine {e['id']}: {e['runs']} profiled runs (want {ITERATIONS})")
        expect(len(rows) == e["ops"] and e["ops"] > 1,
               f"engine {e['id']}: {len(rows)} rows for {e['ops']} ops")
        expect([r[0] for r in rows] == list(range(1, len(rows) + 1)), f"engine {e['id']}: ranks 1..N")
        expect(sorted({r[1] for r in rows}) == list(range(e["ops"])), f"engine {e['id']}: every op once")
        expect(totals == sorted(totals, reverse=True), f"engine {e['id']}: sorted by total time")
        expect(all(t > 0 for t in totals), f"engine {e['id']}: every op's time > 0 (min {min(totals, default=0):.4f} ms)")
        expect(all(abs(r[5] - r[4] / ITERATIONS) <= 1e-3 for r in rows), f"engine {e['id']}: mean = total / runs")
        expect(abs(shares - 100.0) <= 1.0, f"engine {e['id']}: shares sum to {shares:.1f}%")
        expect(e["total"] and e["per_run"], f"engine {e['id']}: total and per-run lines")
        for r in rows[:3]:
            print(f"     engine {e['id']} #{r[0]}: op {r[1]} {r[2]} {r[3]} {r[4]:.4f} ms ({r[6]:.1f}%)")
    m = TOTAL.search(stdout)
    expect(m is not None and 0 < float(m.group(1)) <= float(m.group(2)),
           "profile_total: op time per execute within wall time" +
           (f" ({m.group(1)} ms of {m.group(2)} ms)" if m else ""))
    return ok


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", type=Path, required=True)
    ap.add_argument("--runner", type=Path, required=True)
    ap.add_argument("--bin", type=Path)
    ap.add_argument("--install", type=Path)
    args = ap.parse_args()
    if not args.runner.is_file():
        print(f"FAIL kiln_runner: {args.runner} is missing")
        return 1
    manifest = json.loads((args.dir / "manifest.json").read_text())
    want = np.fromfile(args.dir / manifest["expected"]["file"], dtype=np.float32)
    ok = True
    with tempfile.TemporaryDirectory() as tmp:
        r, got = run(args.runner, args.dir, manifest, Path(tmp) / "profiled", profile=True)
        if r.returncode != 0:
            print(f"FAIL kiln_runner --profile: exit {r.returncode}\n{(r.stderr or r.stdout)[-3000:]}")
            return 1
        print("\n".join("     " + l for l in r.stdout.splitlines() if l.strip()))
        ok &= check_outputs("outputs with --profile", got, want)
        ok &= check_report(r.stdout)
        plain, got_plain = run(args.runner, args.dir, manifest, Path(tmp) / "plain", profile=False)
        ok &= plain.returncode == 0 and check_outputs("outputs without --profile (graph replay)", got_plain, want)
        ok &= "Kiln engine" not in plain.stdout
        same = got_plain is not None and np.allclose(got, got_plain, atol=1e-6, rtol=1e-6)
        print(f"{'PASS' if same else 'FAIL'} profiled and graph-replay outputs agree")
        ok &= same
    print("profile check: " + ("PASS" if ok else "FAIL"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
