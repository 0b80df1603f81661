"""bench/suite_summary.py's classification and report, and bench/coverage.py's summary, on
hand-made results (no export runs here)."""
from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench"
sys.path.insert(0, str(BENCH))
import suite_summary  # noqa: E402


def _load(name, path):
    """bench/coverage.py under another name: `coverage` is also a well-known package."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


coverage = _load("bench_coverage", BENCH / "coverage.py")


def row(case, result="SUCCESS", delegated=None, undelegated=None, staged=True, error=""):
    return {"test": f"test_{case}[kiln]", "base": f"test_{case.rsplit('_', 1)[0]}",
            "subtest": 0, "case": case, "result": result, "error": error,
            "delegated_ops": delegated if delegated is not None else {"aten::add.Tensor": 1},
            "undelegated_ops": undelegated or {}, "lower_s": 1.0, "total_s": 2.0,
            "staged": case if staged else None}


ROWS = [row("add_0"), row("add_1", undelegated={"aten::cumsum": 1}),
        row("sort_0", "SUCCESS_UNDELEGATED", delegated={}, undelegated={"aten::sort": 1},
            staged=False),
        row("conv_0", "LOWER_FAIL", delegated={}, staged=False, error="ValueError: bad"),
        row("pool_0", "SKIPPED", delegated={}, staged=False),
        row("bag_0", "OUTPUT_MISMATCH_FAIL", staged=False, error="AssertionError: Output 0")]


def test_each_case_is_classified():
    assert [suite_summary.classify(r) for r in ROWS] == [
        "fully delegated", "partially delegated", "not delegated", "lowering failed", "skipped",
        "other failure"]


def test_report_counts_cases_and_fills_the_gpu_columns(tmp_path):
    results = tmp_path / "results.jsonl"
    results.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    gpu = tmp_path / "suite_gpu.json"
    gpu.write_text(json.dumps({"add_0": None, "add_1": "output 0: max abs error 1 > 1e-4"}))
    out = tmp_path / "suite.md"
    sys.argv = ["suite_summary.py", "--results", f"Operators={results}", "--gpu", str(gpu),
                "--markdown", str(out)]
    assert suite_summary.main() == 0
    text = out.read_text()
    assert "| 6 | 1 (16.7 %) | 1 (16.7 %) | 1 (16.7 %) | 1 | 1 | 1 | 2 | 1 | 1 |" in text
    assert "bag_0 | OUTPUT_MISMATCH_FAIL | AssertionError: Output 0" in text
    assert "`aten::cumsum` (1)" in text and "conv_0 | LOWER_FAIL | ValueError: bad" in text
    assert "| add_1 | output 0: max abs error 1 > 1e-4 |" in text


def test_coverage_summary_counts_one_partition_models_and_ranks_operators():
    results = {"hf_a": {"partitions": 1, "outside": {}, "export_s": 1.0},
               "hf_b": {"partitions": 2, "outside": {"cumsum.default": 2}, "export_s": 1.0},
               "resnet": {"partitions": 1, "outside": {}, "export_s": 1.0},
               "swin": {"error": "RuntimeError: x", "export_s": 1.0},
               "convnext": {"partitions": 3, "outside": {"cumsum.default": 1, "fmod.Tensor": 1},
                            "export_s": 1.0}}
    lines = coverage.summary(results)
    assert lines[0].startswith("- HF transformers: 1 / 2 in one Kiln partition")
    assert lines[1].startswith("- torchvision: 1 / 3 in one Kiln partition") and "1 failed" in lines[1]
    assert "`cumsum.default` (2 models, 3 nodes), `fmod.Tensor` (1 models, 1 nodes)" in lines[2]
    text = coverage.markdown(results, {"resnet": 3e-6})
    assert "| swin | export failed: RuntimeError: x |" in text and "3.00e-06" in text


def test_coverage_update_reads_back_the_report_it_wrote(tmp_path):
    results = {"hf_a": {"partitions": 1, "outside": {}, "reasons": {}, "export_s": 3.0},
               "hf_b": {"error": "AttributeError: no '_schema' (at a.py:1 f)", "export_s": 2.0},
               "vgg": {"partitions": 2, "outside": {"_adaptive_avg_pool2d.default": 1,
                                                    "cumsum.default": 2},
                       "reasons": {"cumsum.default": "not in Kiln's operator table"},
                       "export_s": 9.0},
               "big": {"skipped": "not measured: the run stopped first"}}
    report = tmp_path / "coverage.md"
    report.write_text(coverage.markdown(results, {"hf_a": 2e-6}, "Run on abc.\n\nSecond note."))
    back, gpu, notes = coverage.read_report(report)
    assert back == results and list(back) == list(results)
    assert gpu == {"hf_a": 2e-6} and notes == ["Run on abc.", "Second note."]
