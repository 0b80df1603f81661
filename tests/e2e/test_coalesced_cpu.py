"""examples/export_coalesced.py: the programs it writes carry the delegates it promises (read back
from the files), the files it writes are there, the XNNPACK-only program runs through kiln_runner
on this CPU and gives eager's answer (so the runner links XNNPACK), and the programs with Kiln
partitions fail cleanly on a machine without a GPU. The GPU side is tests/gpu_e2e/check_coalesced.py."""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from conftest import REPO, run
import kiln_verify

EXAMPLE = REPO / "examples" / "export_coalesced.py"
GPU_E2E = REPO / "tests" / "gpu_e2e"


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    out = tmp_path_factory.mktemp("coalesced")
    env = {**os.environ, "PYTHONPATH": str(REPO / "python") + os.pathsep + os.environ.get("PYTHONPATH", "")}
    # The GPU end-to-end export: the example at fp32 plus kiln_verify.py for the GPU machine.
    r = subprocess.run([sys.executable, GPU_E2E / "export_coalesced.py", "--out", out], capture_output=True,
                       text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    assert (out / "kiln_verify.py").read_text() == (REPO / "tools" / "kiln_verify.py").read_text()
    return out


def manifest(out):
    return json.loads((out / "manifest.json").read_text())


# ExecuTorch's copies to and from the GPU around every Kiln delegate call.
COPIES = ["et_copy::_h2d_copy.out", "et_copy::_d2h_copy.out"]
H2D, D2H = (f"cpu:{c}" for c in COPIES)
# What the runner says on a machine without a usable GPU.
NO_GPU = "no usable CUDA device"
KILN = [H2D, "KilnBackend", D2H]


def test_files_carry_the_promised_delegates(exported):
    from kiln_executorch.aot import read_delegates, read_operators

    want = {  # backend ids in delegate-table order is not promised; the multiset and the CPU ops are
        "coalesced": (["KilnBackend", "KilnBackend"], ["aten::erfinv.out", *COPIES]),
        "mixed": (["KilnBackend", "KilnBackend", "XnnpackBackend"], COPIES),
        "xnnpack_only": (["XnnpackBackend"], []),
    }
    for name, (delegates, operators) in want.items():
        pte = exported / f"{name}.pte"
        assert sorted(d.backend_id for d in read_delegates(pte)) == delegates, name
        assert sorted(read_operators(pte)["forward"]) == sorted(operators), name
        assert pte.stat().st_size < 1 << 20, f"{pte} is {pte.stat().st_size} bytes"


def test_execution_order_crosses_backends(exported):
    spec = importlib.util.spec_from_file_location("export_coalesced", EXAMPLE)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    assert example.execution_sequence(exported / "coalesced.pte") == [
        *KILN, "cpu:aten::erfinv.out", *KILN]
    mixed = [*KILN, "XnnpackBackend", H2D, *KILN]
    assert example.execution_sequence(exported / "mixed.pte") == mixed
    m = manifest(exported)
    assert m["atol"] == 1e-3 and m["precision"] == "fp32"
    assert m["programs"]["mixed"]["sequence"] == mixed


def test_a_partitioning_change_fails_the_export(tmp_path):
    # The guard itself: the coalesced module lowered by XNNPACK alone is a valid program, but not
    # the one promised, and the script must refuse it.
    spec = importlib.util.spec_from_file_location("export_coalesced_guard", EXAMPLE)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    example.PROGRAMS["coalesced"]["partitioners"] = lambda p: [example.xnnpack()]
    with pytest.raises(SystemExit, match=r"executes \['XnnpackBackend', 'cpu:aten::erfinv.out', "
                                         r"'XnnpackBackend'\], expected \['cpu:et_copy::_h2d_copy.out', 'KilnBackend'"):
        example.export_one("coalesced", tmp_path, "fp32")
    assert not (tmp_path / "coalesced.expected").exists()


def test_expected_files_hold_eager_values(exported):
    import torch

    x = torch.ones(64, 64)
    eager = {"coalesced": torch.cos(torch.erfinv(torch.tanh(x)))}
    for name in ["coalesced", "mixed", "xnnpack_only"]:
        lines = (exported / f"{name}.expected").read_text().splitlines()
        assert lines[0] == "[64,64]" and len(lines[1].split()) == 8, lines
        entry = manifest(exported)["programs"][name]
        assert (exported / entry["input_file"]).stat().st_size == 64 * 64 * 4
        assert (exported / entry["output_file"]).stat().st_size == 64 * 64 * 4
    values = [float(v) for v in (exported / "coalesced.expected").read_text().splitlines()[1].split()]
    np.testing.assert_allclose(values, eager["coalesced"].flatten()[:8].numpy(), rtol=1e-5)
    # mixed and xnnpack_only are one module with one seed: one answer.
    assert (exported / "mixed.expected").read_text() == (exported / "xnnpack_only.expected").read_text()


def test_xnnpack_program_runs_on_the_cpu_and_matches_eager(runner, exported, tmp_path):
    pte = exported / "xnnpack_only.pte"
    r = run([runner, pte])
    assert r.returncode == 0, r.stderr
    problems = kiln_verify.verify(r.stdout, (exported / "xnnpack_only.expected").read_text(), atol=1e-3)
    assert not problems, "\n".join(problems) + "\n" + r.stdout

    r = run([runner, pte, "--input", f"0={exported / 'xnnpack_only.input_0.bin'}", "--output-dir", tmp_path])
    assert r.returncode == 0, r.stderr
    actual = np.fromfile(tmp_path / "output_0.bin", dtype=np.float32)
    expected = np.fromfile(exported / "xnnpack_only.output_0.bin", dtype=np.float32)
    assert actual.shape == expected.shape == (4096,)
    assert np.abs(actual - expected).max() < 1e-4, np.abs(actual - expected).max()


@pytest.mark.parametrize("name", ["coalesced", "mixed"])
def test_kiln_programs_run_or_fail_cleanly_without_a_gpu(runner, exported, name):
    # On a machine without a usable GPU (CI) the runner refuses the Kiln partitions with a message
    # that says why; where KilnBackend can run, the program gives eager's answer.
    r = run([runner, exported / f"{name}.pte"])
    if NO_GPU not in r.stderr:
        assert r.returncode == 0, r.stderr
        problems = kiln_verify.verify(r.stdout, (exported / f"{name}.expected").read_text(), atol=1e-3)
        assert not problems, "\n".join(problems) + "\n" + r.stdout
        return
    # The program keeps Kiln's tensors in GPU memory: the runner stops at allocating it.
    assert r.returncode == 1, f"{r.returncode}\n{r.stderr}"
    assert "bytes of device memory failed: NotFound (0x20)" in r.stderr, r.stderr
    assert "it needs an NVIDIA GPU" in r.stderr, r.stderr
    assert "XnnpackBackend" not in r.stderr, r.stderr


def test_gpu_check_passes_the_cpu_program_and_fails_the_kiln_ones_here(runner, exported):
    # check_coalesced.py as the GPU machine runs it; here only the XNNPACK-only program can pass.
    r = run([sys.executable, GPU_E2E / "check_coalesced.py", "--dir", exported, "--runner", runner])
    lines = r.stdout.splitlines()
    for case in ["ones", "random", "twice"]:
        assert any(l.startswith(f"PASS coalesced/xnnpack_only {case}: XnnpackBackend") or
                   l.startswith(f"PASS coalesced/xnnpack_only {case}: run0") for l in lines), r.stdout
    kiln_lines = [l for l in lines if l.startswith(("PASS coalesced/mixed", "FAIL coalesced/mixed",
                                                    "PASS coalesced/coalesced", "FAIL coalesced/coalesced"))]
    assert len(kiln_lines) == 6, r.stdout
    if any(NO_GPU in l for l in kiln_lines):
        assert r.returncode == 1 and all(l.startswith("FAIL") for l in kiln_lines), r.stdout
        assert lines[-1] == "coalesced: 3/9 cases passed", r.stdout
    else:
        assert r.returncode == 0 and lines[-1] == "coalesced: 9/9 cases passed", r.stdout


def test_gpu_check_needs_only_python_numpy_and_kiln_verify():
    # The GPU machine has python3, torch and numpy, not executorch or kiln_executorch.
    import ast

    # e2e_args: the check scripts' shared command line, beside them (stdlib only, checked too).
    allowed = set(sys.stdlib_module_names) | {"numpy", "torch", "kiln_verify", "e2e_args",
                                               "__future__"}
    for path in [GPU_E2E / "check_coalesced.py", GPU_E2E / "e2e_args.py",
                 REPO / "tools" / "kiln_verify.py"]:
        tree = ast.parse(path.read_text())
        imported = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        imported |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
        assert imported <= allowed, f"{path.name} imports {sorted(imported - allowed)}"
