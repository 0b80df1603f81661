"""GPU side of the erfinv check (runs on the GPU machine: python3, numpy and torch with CUDA; no
executorch). Runs export_erfinv.py's programs through kiln_runner:

  erfinv vs torch.cuda   Kiln's erfinv (CUDA's erfinvf) against torch.erfinv on a CUDA tensor,
                         which calls the same function: bitwise, or at most 2 ulp apart, with NaN,
                         infinities and signed zeros in the same places
  erfinv vs float64      relative error <= 1e-6 against float64 truth for |x| < 1 - 2^-9 with a
                         normal result; subnormal results within 2 steps of 2^-149
  erfinv near 1          every float in [1 - 2^-9, 1) and its negatives: finite and monotone (the
                         relative error there is printed, not judged)
  erfinv special values  erfinv(+-1) = +-inf, erfinv(+-0) = +-0, |x| > 1, +-inf and NaN give NaN
  coalesced_<p>_<input>  the default-exported coalesced fixture (one Kiln partition) against the
                         fixture's recorded output and against eager fp32 on linspace(-6, 6), with
                         the manifest's tolerance and no NaN

    check_erfinv.py --dir DIR --runner PATH/kiln_runner

One line per case; exits 1 if any case fails (a missing CUDA torch is a failure that says so)."""
from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

import e2e_args  # tests/gpu_e2e/e2e_args.py, beside this script

F32 = np.float32


def run_program(runner, pte, inp, out):
    """output_0 of kiln_runner on one input (written under `out`), or (None, why)."""
    r = subprocess.run([str(runner), str(pte), "--input", f"0={inp}", "--output-dir", str(out)],
                       capture_output=True, text=True, errors="replace", timeout=300)
    if r.returncode != 0:
        return None, f"kiln_runner exit {r.returncode}: {r.stderr.strip()[-600:]}"
    if not (out / "output_0.bin").is_file():
        return None, f"kiln_runner wrote no {out / 'output_0.bin'}"
    return np.fromfile(out / "output_0.bin", dtype=F32), ""


def ordered(a: np.ndarray) -> np.ndarray:
    """float32 bits as integers that order like the floats (-0 and +0 one apart)."""
    i = a.view(np.int32).astype(np.int64)
    return np.where(i < 0, -(i & 0x7FFFFFFF) - 1, i)


def vs_torch_cuda(x, y):
    import torch   # main() reports a missing torch for every case alike

    if not torch.cuda.is_available():
        return False, "torch has no CUDA device here, so torch.erfinv on CUDA cannot be compared"
    want = torch.erfinv(torch.from_numpy(x).cuda()).cpu().numpy()
    nan = np.isnan(want)
    if not np.array_equal(nan, np.isnan(y)):
        return False, f"NaN in {int((nan != np.isnan(y)).sum())} places where the other has none"
    a, b = y[~nan], want[~nan]
    ulp = np.abs(ordered(a) - ordered(b))
    same = int((a.view(np.int32) == b.view(np.int32)).sum())
    worst = int(ulp.argmax()) if ulp.size else 0
    detail = (f"bitwise {same}/{a.size}, max {int(ulp.max()) if ulp.size else 0} ulp"
              + (f" at x={x[~nan][worst]!r}" if ulp.size and ulp.max() else ""))
    return bool((ulp <= 2).all()), detail


def vs_float64(x, y, near_one):
    import torch

    truth = torch.erfinv(torch.from_numpy(x).double()).numpy()
    ours = y.astype(np.float64)
    tiny = float(np.finfo(F32).tiny)
    with np.errstate(invalid="ignore"):   # inf - inf and NaN - NaN where the truth is not finite
        err = np.abs(ours - truth)
        normal = np.isfinite(truth) & (np.abs(truth) >= tiny) & (np.abs(x) < near_one)
        rel = err[normal] / np.abs(truth)[normal]
        sub = np.isfinite(truth) & (np.abs(truth) < tiny) & (truth != 0)
    worst = int(rel.argmax())
    sub_ok = bool((err[sub] <= 2 * 2.0 ** -149).all())
    ok = rel.max() <= 1e-6 and sub.any() and sub_ok
    return ok, (f"max relative error {rel.max():.3g} at x={x[normal][worst]!r} over {normal.sum()} "
                f"values (limit 1e-6); {sub.sum()} subnormal results within 2 steps: {sub_ok}")


def near_one(x, y, near):
    import torch

    details, ok = [], True
    for sign in (1, -1):
        band = (sign * x >= near) & (sign * x < 1)
        order = np.argsort(x[band])
        xs, ys = x[band][order], y[band][order]
        finite = bool(np.isfinite(ys).all())
        monotone = bool((ys[1:] >= ys[:-1]).all())
        truth = torch.erfinv(torch.from_numpy(xs).double()).numpy()
        rel = float((np.abs(ys - truth) / np.abs(truth)).max())
        ok = ok and finite and monotone and xs.size > 0
        details.append(f"{'+' if sign > 0 else '-'}: {xs.size} values finite={finite} "
                       f"monotone={monotone} max relative error {rel:.3g}")
    return ok, "; ".join(details)


def special_values(x, y):
    def at(v):
        same = (x == F32(v)) & (np.signbit(x) == np.signbit(F32(v)))
        where = np.isnan(x) if np.isnan(v) else same
        return y[np.flatnonzero(where)[0]]

    # A list, not a dict: 0.0 and -0.0 are equal keys.
    got = [(v, at(v)) for v in [1, -1, 0.0, -0.0, 1.5, -2, np.inf, -np.inf, np.nan]]
    (one, minus_one, zero, minus_zero), outside = [g for _, g in got[:4]], [g for _, g in got[4:]]
    ok = (one == np.inf and minus_one == -np.inf and zero == 0 and not np.signbit(zero)
          and minus_zero == 0 and np.signbit(minus_zero) and all(np.isnan(g) for g in outside))
    return ok, ", ".join(f"erfinv({v!r})={float(g)!r}" for v, g in got)


def coalesced(actual, expected, tol):
    err = np.abs(actual.astype(np.float64) - expected.astype(np.float64))
    scale = float(np.abs(expected).max())
    limit = (tol["abs_scaled"] * max(1.0, scale) if "abs_scaled" in tol
             else tol["rel_max"] * scale)
    nan = int(np.isnan(actual).sum())
    ok = nan == 0 and actual.size == expected.size and bool((err <= limit).all())
    return ok, f"max_abs_err={np.nanmax(err):.3g} limit={limit:.3g} nan={nan}/{actual.size}"


def main() -> int:
    args = e2e_args.parse(__doc__)
    manifest = json.loads((args.dir / "manifest.json").read_text())
    failures, total = 0, 0

    def report(case, ok, detail):
        nonlocal failures, total
        total += 1
        failures += not ok
        print(f"{'PASS' if ok else 'FAIL'} erfinv/{case}: {detail}", flush=True)

    k = manifest["kernel"]
    x = np.fromfile(args.dir / k["input"], dtype=F32)
    with tempfile.TemporaryDirectory() as tmp:
        y, why = run_program(args.runner, args.dir / k["program"], args.dir / k["input"],
                             Path(tmp) / "erfinv")
        kernel_cases = [("erfinv vs torch.cuda", lambda: vs_torch_cuda(x, y)),
                        ("erfinv vs float64", lambda: vs_float64(x, y, k["near_one"])),
                        ("erfinv near 1", lambda: near_one(x, y, k["near_one"])),
                        ("erfinv special values", lambda: special_values(x, y))]
        for case, judge in kernel_cases:
            if y is None or y.size != x.size:
                report(case, False, why or f"{y.size} outputs for {x.size} inputs")
                continue
            try:
                report(case, *judge())
            except ImportError as e:
                report(case, False, f"cannot import torch ({e}); the GPU machine needs torch "
                       "with CUDA")

        for c in manifest["coalesced"]:
            actual, why = run_program(args.runner, args.dir / c["program"], args.dir / c["input"],
                                      Path(tmp) / c["name"])
            if actual is None:
                report(c["name"], False, why)
                continue
            expected = np.fromfile(args.dir / c["expected"], dtype=F32)
            report(c["name"], *coalesced(actual, expected, c["tolerance"]))
    print(f"erfinv: {total - failures}/{total} cases passed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
