"""Markdown summary of ExecuTorch's backend test suite run with the kiln flow:

    suite_summary.py --results "Operator tests=DIR/results.jsonl" [--results "Model tests=..."]
                     [--gpu suite_gpu.json] [--seconds N] --markdown bench/results/suite.md

--results [TITLE=]PATH: what tests/suite/run_suite.py --out DIR wrote (one line per subtest);
several (the operator and the model suites) make one report with a section each. --gpu: check_suite.py's
{case: null | why} from the H200 (scripts/gpu-check.sh run's suite_gpu.json), which fills the GPU
columns. Each subtest is one case, classified as:
- fully delegated: has a Kiln delegate and no operator left outside it;
- partially delegated: has a Kiln delegate and operators left to ExecuTorch's CPU kernels;
- not delegated: lowered without any Kiln delegate;
- lowering failed: the suite's LOWER_FAIL (the partitioner or the Kiln backend raised);
- other failure: to_executorch/serialize failed or the CPU run (the reference interpreter against
  eager) mismatched or crashed;
- skipped: the suite's own skip (the model does not export, or its eager run fails).
"""
from __future__ import annotations

import argparse
import collections
import json
import sys
from pathlib import Path

# Results of a case that lowered and ran on the CPU without failing.
PASSED = {"SUCCESS", "SUCCESS_UNDELEGATED"}


def classify(r: dict) -> str:
    if r["result"] == "LOWER_FAIL":
        return "lowering failed"
    if r["result"] == "SKIPPED" and not r["delegated_ops"] and not r["undelegated_ops"]:
        return "skipped"
    if r["result"] not in PASSED and r["result"] != "SKIPPED":
        return "other failure"   # a mismatch against eager or a failed run counts, delegated or not
    if not r["delegated_ops"]:
        return "not delegated"
    return "partially delegated" if r["undelegated_ops"] else "fully delegated"


def read(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _pct(n, total):
    return f"{n} ({100 * n / total:.1f} %)" if total else "0"


def section(title: str, rows: list[dict], gpu: dict | None) -> list[str]:
    kinds = collections.Counter(classify(r) for r in rows)
    cpu_failed = [r for r in rows if r["result"] not in PASSED | {"SKIPPED"}]
    total = len(rows)
    lines = [f"## {title}", "", "| cases | fully delegated | partially delegated | not delegated "
             "| lowering failed | other CPU failure | skipped (suite) | staged for the GPU | "
             "GPU pass | GPU fail |", "|---|---|---|---|---|---|---|---|---|---|"]
    staged = [r["staged"] for r in rows if r.get("staged")]
    if gpu is None:
        gpu_pass = gpu_fail = "not run"
    else:
        gpu_pass = sum(gpu.get(c, "not run") is None for c in staged)
        gpu_fail = sum(c in gpu and gpu[c] is not None for c in staged)
    lines.append(f"| {total} | {_pct(kinds['fully delegated'], total)} | "
                 f"{_pct(kinds['partially delegated'], total)} | "
                 f"{_pct(kinds['not delegated'], total)} | {kinds['lowering failed']} | "
                 f"{kinds['other failure']} | {kinds['skipped']} | {len(staged)} | {gpu_pass} | "
                 f"{gpu_fail} |")
    seconds = sum(r.get("total_s") or 0 for r in rows)
    lines += ["", f"CPU time in the suite's cases: {seconds / 60:.1f} min (lowering "
              f"{sum(r.get('lower_s') or 0 for r in rows) / 60:.1f} min)."]
    left = collections.Counter()
    for r in rows:
        for op in r["undelegated_ops"]:
            left[op] += 1
    if left:
        lines += ["", "Operators left outside Kiln, by how many cases leave them: " +
                  ", ".join(f"`{op}` ({n})" for op, n in left.most_common()) + "."]
    per_test = collections.defaultdict(list)
    for r in rows:
        per_test[r["base"]].append(r)
    lines += ["", "| test | subtests | fully | partially | not delegated | failed | outside Kiln "
              "| GPU |", "|---|---|---|---|---|---|---|---|"]
    for base, group in sorted(per_test.items()):
        k = collections.Counter(classify(r) for r in group)
        failed = k["lowering failed"] + k["other failure"]
        outside = sorted({op for r in group for op in r["undelegated_ops"]})
        staged = [r["staged"] for r in group if r.get("staged")]
        if gpu is None or not staged:
            g = ""
        else:
            bad = sum(c in gpu and gpu[c] is not None for c in staged)
            g = f"{len(staged) - bad}/{len(staged)}" if all(c in gpu for c in staged) else "partial"
        lines.append(f"| {base.removeprefix('test_')} | {len(group)} | {k['fully delegated']} | "
                     f"{k['partially delegated']} | {k['not delegated']} | {failed} | "
                     f"{', '.join(f'`{o}`' for o in outside)} | {g} |")
    if cpu_failed:
        lines += ["", "### Failures on the CPU", "", "| case | result | error |", "|---|---|---|"]
        for r in cpu_failed:
            error = r["error"].replace("|", "/").replace("\n", " ")[:300]
            lines.append(f"| {r['case']} | {r['result']} | {error} |")
    if gpu:
        bad = [(c, why) for c, why in gpu.items() if why is not None]
        if bad:
            lines += ["", "### Failures on the GPU", "", "| case | why |", "|---|---|"]
            lines += [f"| {c} | {why.replace('|', '/')[:300]} |" for c, why in bad]
    return lines


def markdown(results: dict[str, list[dict]], gpu: dict | None) -> str:
    lines = ["# ExecuTorch's backend test suite with the kiln flow", "",
             "The suite of the pinned executorch wheel (`executorch/backends/test/suite`, unedited) "
             "run by `tests/suite/run_suite.py` with the `kiln` flow "
             "(`python/kiln_testing/backend_suite.py`: KilnPartitioner, fp32, Kiln's default "
             "export settings); written by `bench/suite_summary.py`. One case is one subtest "
             "(one lowered program). On the CPU every lowered program also runs through the "
             "reference interpreter against eager PyTorch at the suite's tolerances; each case "
             "with a Kiln delegate is staged for the H200 (`tests/gpu_e2e/check_suite.py`, "
             "kiln_runner against eager outputs at 1e-4 of the output's magnitude).", ""]
    for title, rows in results.items():
        lines += section(title, rows, gpu) + [""]
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--results", action="append", required=True,
                    help="[TITLE=]results.jsonl (repeatable; TITLE heads its section)")
    ap.add_argument("--gpu", type=Path)
    ap.add_argument("--markdown", type=Path, required=True)
    args = ap.parse_args()
    results = {}
    for spec in args.results:
        title, _, path = spec.rpartition("=")
        results[title or Path(path).parent.name] = read(Path(path))
    gpu = json.loads(args.gpu.read_text()) if args.gpu else None
    args.markdown.write_text(markdown(results, gpu))
    return 0


if __name__ == "__main__":
    sys.exit(main())
