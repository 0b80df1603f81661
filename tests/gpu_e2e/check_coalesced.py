"""GPU end-to-end, check side (runs on the GPU machine: python3 + numpy, no executorch): every
program export_coalesced.py wrote runs through kiln_runner and gives eager PyTorch's answer within
the manifest's tolerance (1e-3 for fp32):

  ones     all-ones input, output[0] against NAME.expected with kiln-verify's logic
  random   the exported random input, the whole output against eager's NAME.output_0.bin
  twice    one loaded method run on the random input, then on ones (--next): delegates that are
           executed again keep giving the right answer
  latency  median of kiln_runner --iterations (reported, not judged)

`mixed` crosses Kiln -> XNNPACK and XNNPACK -> Kiln, `coalesced` Kiln -> CPU erfinv -> Kiln
(erfinv excluded from Kiln; check_erfinv.py runs the default, one-partition export), so a
wrong boundary copy in either direction shows as a wrong output. One line per case; exits non-zero
on any failure."""
from __future__ import annotations

import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

import e2e_args  # tests/gpu_e2e/e2e_args.py, beside this script


def load_verify(directory: Path):
    # The export copies kiln_verify.py beside the programs; in a checkout it is tools/kiln_verify.py.
    for where in (directory, Path(__file__).resolve().parents[2] / "tools"):
        if (where / "kiln_verify.py").exists():
            sys.path.insert(0, str(where))
            import kiln_verify
            return kiln_verify
    raise SystemExit(f"check_coalesced: kiln_verify.py is neither in {directory} nor in tools/")


def run(cmd):
    return subprocess.run([str(c) for c in cmd], capture_output=True, text=True, errors="replace", timeout=300)


def first_values(text: str, index: int = 0, run_index: int = 0):
    """The printed values of output[index] of run run_index in kiln_runner's text."""
    lines = text.splitlines()
    if run_index:
        lines = lines[next(i for i, l in enumerate(lines) if l.strip() == f"# run {run_index}"):]
    i = next(i for i, l in enumerate(lines) if l.startswith(f"output[{index}] "))
    return np.array([float(v) for v in lines[i + 1].split()])


def compare_file(actual_file: Path, expected_file: Path, atol: float):
    actual = np.fromfile(actual_file, dtype=np.float32).astype(np.float64)
    expected = np.fromfile(expected_file, dtype=np.float32).astype(np.float64)
    if actual.shape != expected.shape:
        return False, f"{actual.size} values, expected {expected.size}"
    err = np.abs(actual - expected)
    bad = int(np.count_nonzero(~(err <= atol)))       # NaN counts as bad
    return bad == 0, f"max_abs_err={np.nanmax(err):.3g} bad={bad}/{err.size} atol={atol:g}"


def main() -> int:
    args = e2e_args.parse(__doc__)
    verify = load_verify(args.dir)
    manifest = json.loads((args.dir / "manifest.json").read_text())
    atol = manifest["atol"]
    failures = 0

    def report(name, case, ok, detail):
        nonlocal failures
        failures += not ok
        print(f"{'PASS' if ok else 'FAIL'} coalesced/{name} {case}: {detail}", flush=True)

    for name, p in manifest["programs"].items():
        pte = args.dir / p["pte"]
        path = " -> ".join(p["sequence"])
        expected_text = (args.dir / p["expected"]).read_text()

        r = run([args.runner, pte])
        if r.returncode:
            report(name, "ones", False, f"kiln_runner exit {r.returncode} ({path}): {r.stderr.strip()[-600:]}")
        else:
            problems = verify.verify(r.stdout, expected_text, atol=atol)
            exp8 = np.array([float(v) for v in expected_text.splitlines()[1].split()])
            err = np.abs(first_values(r.stdout) - exp8).max() if not problems else float("nan")
            report(name, "ones", not problems, f"{path}: max_abs_err={err:.3g} over 8 values, atol={atol:g}"
                   + ("; " + "; ".join(problems) if problems else ""))

        with tempfile.TemporaryDirectory() as tmp:
            r = run([args.runner, pte, "--input", f"0={args.dir / p['input_file']}", "--output-dir", tmp])
            if r.returncode:
                report(name, "random", False, f"kiln_runner exit {r.returncode}: {r.stderr.strip()[-600:]}")
            else:
                ok, detail = compare_file(Path(tmp) / "output_0.bin", args.dir / p["output_file"], atol)
                report(name, "random", ok, f"{path}: {detail}")

        with tempfile.TemporaryDirectory() as tmp:
            ones = Path(tmp) / "ones.bin"
            np.ones(p["input_shape"], dtype=np.float32).tofile(ones)
            r = run([args.runner, pte, "--input", f"0={args.dir / p['input_file']}", "--next",
                     "--input", f"0={ones}", "--output-dir", tmp])
            if r.returncode:
                report(name, "twice", False, f"kiln_runner exit {r.returncode}: {r.stderr.strip()[-600:]}")
            else:
                ok, detail = compare_file(Path(tmp) / "run0_output_0.bin", args.dir / p["output_file"], atol)
                problems = verify.verify(r.stdout, expected_text, atol=atol, run_index=1)
                report(name, "twice", ok and not problems,
                       f"run0 random {detail}; run1 ones {'OK' if not problems else '; '.join(problems)}")

        r = run([args.runner, pte, "--iterations", "50", "--warmup", "5"])
        m = re.search(r"latency_ms min=(\S+) median=(\S+) max=(\S+)", r.stdout)
        print(f"INFO coalesced/{name} latency: " +
              (f"median={m.group(2)} ms min={m.group(1)} ms (50 iterations)" if m and r.returncode == 0
               else f"not measured (exit {r.returncode})"), flush=True)

    total = 3 * len(manifest["programs"])
    print(f"coalesced: {total - failures}/{total} cases passed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
