"""On the GPU machine: the GPU time of every kernel one execute of a staged program runs, from
Nsight Compute (`ncu --clock-control none --cache-control none`: clocks and caches as the run
leaves them) over kiln_runner
--profiler-range, so load, warm-up and graph capture stay out and the kernels are those of the
warm CUDA graph replay. kiln_runner --profile times ops eagerly with a sync each, which hides how
long small kernels take; this shows it, and the gap between the kernels' sum and the execute's
latency (launch gaps of the replay).

    kernel_times.py --models DIR --runner kiln_runner --keys K1,K2 [--precisions bf16] --out FILE
    kernel_times.py --runner kiln_runner --program llm.pte:decode --program llm.pte:prefill --out FILE
"""

import argparse
import csv
import io
import json
import re
import shutil
import subprocess
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

METRIC = "gpu__time_duration.sum"


def short_name(name: str) -> str:
    """A kernel's name without its argument list and namespaces, templates kept short."""
    name = name.strip().replace("(anonymous namespace)::", "").replace("<unnamed>::", "")
    name = re.sub(r"\(.*\)$", "", name)
    name = re.sub(r"^void ", "", name)
    name = re.sub(r"^kiln::(engine::kernels::)?", "", name)
    return name[:110]


def kernel_rows(report: str):
    """(kernel name, ns) per profiled kernel launch of an ncu --csv report."""
    start = report.find('"ID"')
    if start < 0:
        return []
    rows = []
    for row in csv.DictReader(io.StringIO(report[start:])):
        if row.get("Metric Name") == METRIC:
            value = float(row["Metric Value"].replace(",", ""))
            unit = row.get("Metric Unit", "nsecond")
            scale = {"nsecond": 1.0, "usecond": 1e3, "msecond": 1e6, "second": 1e9}.get(unit, 1.0)
            rows.append((short_name(row["Kernel Name"]), value * scale))
    return rows


def profile(ncu: str, runner: str, models: Path, entry: dict, iterations: int):
    with tempfile.TemporaryDirectory() as tmp:
        log = Path(tmp) / "ncu.csv"
        cmd = [ncu, "--clock-control", "none", "--cache-control", "none", "--profile-from-start",
               "off", "--metrics", METRIC,
               "--csv", "--print-units", "base", "--log-file", str(log), runner,
               str(models / entry["pte"]), "--warmup", "3", "--iterations", str(iterations),
               "--profiler-range"]
        if entry.get("method"):
            cmd += ["--method", entry["method"]]
        for i, spec in enumerate(entry["inputs"]):
            cmd += ["--input", f"{i}={models / spec['file']}"]
        r = subprocess.run(cmd, capture_output=True, text=True, errors="replace", timeout=500)
        report = log.read_text(errors="replace") if log.exists() else ""
    if r.returncode != 0 or not report:
        return None, (r.stderr or r.stdout)[-1500:]
    return kernel_rows(report), ""


def summary(key: str, rows, iterations: int) -> str:
    per = defaultdict(lambda: [0, 0.0])
    for name, ns in rows:
        per[name][0] += 1
        per[name][1] += ns
    total_us = sum(ns for _, ns in rows) / 1e3 / iterations
    lines = [f"=== {key}: {len(rows) // iterations} kernels per execute, "
             f"{total_us:.1f} us of kernel time per execute (ncu, clocks as set)",
             f"  {'us/exec':>9} {'share':>6} {'count':>5} {'mean_us':>8}  kernel"]
    for name, (count, ns) in sorted(per.items(), key=lambda kv: -kv[1][1]):
        us = ns / 1e3 / iterations
        lines.append(f"  {us:9.1f} {100 * us / max(total_us, 1e-9):5.1f}% {count // iterations:5d} "
                     f"{ns / 1e3 / count:8.2f}  {name}")
    lines.append("  in launch order (first execute): " +
                 ", ".join(f"{n.split('<')[0].split('::')[-1]}={ns / 1e3:.1f}"
                           for n, ns in rows[:len(rows) // iterations]))
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--models", type=Path, default=Path("."))
    p.add_argument("--runner", required=True)
    p.add_argument("--keys", default="", help="comma list of model keys (manifest.json)")
    p.add_argument("--program", action="append", default=[],
                   help="PATH.pte or PATH.pte:METHOD, a program outside the manifest, run with "
                        "kiln_runner's default inputs (a decoder's prefill or decode method)")
    p.add_argument("--precisions", default="", help="comma list; default all staged")
    p.add_argument("--iterations", type=int, default=2)
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args()
    if not args.keys and not args.program:
        p.error("give --keys (with --models) or --program")
    ncu = shutil.which("ncu") or "/usr/local/cuda/bin/ncu"
    if not Path(ncu).exists():
        print(f"kernel_times: no ncu on this machine ({ncu})", file=sys.stderr)
        return 1
    manifest = json.loads((args.models / "manifest.json").read_text()) if args.keys else []
    for spec in args.program:
        path, _, method = spec.partition(":")
        manifest.append({"key": Path(path).stem, "precision": method or "forward",
                         "pte": str(Path(path).resolve()), "inputs": [], "method": method})
        args.keys += ("," if args.keys else "") + Path(path).stem
    keys, precs = args.keys.split(","), [s for s in args.precisions.split(",") if s]
    status, parts = 0, []
    for entry in manifest:
        if entry["key"] not in keys or (precs and entry["precision"] not in precs):
            continue
        label = f"{entry['key']} {entry['precision']}"
        rows, error = profile(ncu, args.runner, args.models, entry, args.iterations)
        if rows is None:
            status = 1
            parts.append(f"=== {label}: ncu failed\n{error}")
        else:
            parts.append(summary(label, rows, args.iterations))
        print(parts[-1].split("\n  in launch order")[0], flush=True)
    args.out.write_text("\n\n".join(parts) + "\n")
    return status


if __name__ == "__main__":
    sys.exit(main())
