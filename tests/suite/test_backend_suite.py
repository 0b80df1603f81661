"""ExecuTorch's backend test suite with the kiln flow, CI's share (run_suite.py --subset ci: one
operator file per family; `python tests/suite/run_suite.py` runs every operator test): every case
lowers with KilnPartitioner, serializes and, run through the reference interpreter, gives eager's
answer; the plugin records each subtest and stages each delegated one for the GPU check."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import run_suite  # noqa: E402


def test_ci_subset_lowers_every_case_and_matches_eager_on_the_cpu(tmp_path):
    r = subprocess.run([sys.executable, str(HERE / "run_suite.py"), "--subset", "ci",
                        "--out", str(tmp_path), "-rfE"], capture_output=True, text=True)
    rows = [json.loads(line) for line in (tmp_path / "results.jsonl").read_text().splitlines()]
    failed = [f"{row['case']}: {row['result']} {row['error'][:200]}" for row in rows
              if row["result"] not in ("SUCCESS", "SUCCESS_UNDELEGATED", "SKIPPED")]
    assert r.returncode == 0 and not failed, "\n".join(failed) + r.stdout[-3000:] + r.stderr[-2000:]
    # Every CI file ran (a file that no longer collects would shrink the suite silently).
    ran = {row["base"].split("[")[0] for row in rows}
    for name in run_suite.CI_FILES:
        op = name.removeprefix("test_").removesuffix(".py")
        assert any(base.startswith(f"test_{op}") for base in ran), f"{name}: no case ran"
    # Each case with a Kiln delegate is staged with its program, inputs and eager outputs.
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    staged = {row["staged"] for row in rows if row["staged"]}
    assert staged == {case["case"] for case in manifest} and staged
    for case in manifest:
        for f in [case["program"]] + [s["file"] for s in case["inputs"] + case["expected"]]:
            assert (tmp_path / f).stat().st_size > 0, f
