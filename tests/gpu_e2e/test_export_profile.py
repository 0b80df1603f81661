"""The CPU half of the profile check: export_profile.py writes a program with two Kiln delegates (a
CPU cumsum between them), its input and eager PyTorch's output; check_profile.py fails cleanly when
the runner is missing, and on this CPU-only machine kiln_runner --profile cannot run the program."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from conftest import REPO
from kiln_executorch.aot import read_delegates, read_operators

SCRIPTS = REPO / "tests" / "gpu_e2e"


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    out = tmp_path_factory.mktemp("profile")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO / "python"), os.environ.get("PYTHONPATH", "")]))
    r = subprocess.run([sys.executable, str(SCRIPTS / "export_profile.py"), "--out", str(out)],
                       capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    return out


def test_program_has_two_kiln_delegates_around_a_cpu_cumsum(exported):
    manifest = json.loads((exported / "manifest.json").read_text())
    pte = exported / manifest["pte"]
    assert pte.stat().st_size < 4 << 20
    found = read_delegates(pte)
    assert [d.backend_id for d in found] == ["KilnBackend"] * 2, found
    outside = {op for ops in read_operators(pte).values() for op in ops if not op.startswith("et_copy::")}
    assert outside == {"aten::cumsum.out"}, outside


def test_input_and_expected_files(exported):
    manifest = json.loads((exported / "manifest.json").read_text())
    x = np.fromfile(exported / manifest["input"]["file"], dtype=np.float32)
    y = np.fromfile(exported / manifest["expected"]["file"], dtype=np.float32)
    assert x.size == 16 * 64 and manifest["input"]["shape"] == [16, 64]
    assert y.size == 16 * 32 and manifest["expected"]["shape"] == [16, 32]
    # softmax rows sum to one
    np.testing.assert_allclose(y.reshape(16, 32).sum(axis=1), np.ones(16), atol=1e-5)


def test_check_fails_without_the_runner(exported, tmp_path):
    r = subprocess.run([sys.executable, str(SCRIPTS / "check_profile.py"), "--dir", str(exported),
                        "--runner", str(tmp_path / "kiln_runner")], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode != 0 and "missing" in r.stdout, r.stdout


def sample_report(runs: int) -> str:
    """kiln_runner --profile's lines as runtime/engine/profile.cpp prints them (same formats)."""
    lines = ["latency_ms min=1 median=1 max=1 iterations=20 warmup=3",
             "latency measured with --profile on: ops ran eagerly ...",
             "# profile of run 0: 20 executes of 'forward'; ..."]
    for engine, ops in ((1, [("matmul", "Float32[16,256]", 3.0), ("unary", "Float32[16,256]", 1.0)]),
                        (2, [("softmax", "Float32[16,32]", 2.0), ("unary", "Float32[16,32]", 2.0)])):
        total = sum(t for _, _, t in ops)
        lines.append(f"Kiln engine {engine} (inputs Float32[16,64], outputs Float32[16,64]; "
                     f"{len(ops)} ops): {runs} profiled runs")
        lines.append("  %4s %5s  %-12s %-24s %11s %11s %7s" % ("rank", "op", "opcode", "output",
                                                                 "total_ms", "mean_ms", "share"))
        for rank, (i, (opcode, out, t)) in enumerate(sorted(enumerate(ops), key=lambda p: -p[1][2])):
            lines.append("  %4d %5d  %-12s %-24s %11.4f %11.4f %6.1f%%" % (
                rank + 1, i, opcode, out, t, t / runs, 100 * t / total))
        lines.append("  %-44s %11.4f %11.4f %6.1f%%" % ("total", total, total / runs, 100.0))
        lines.append("  per run: op time 0.2 ms (GPU, CUDA events) vs execute wall 0.3 ms ...")
    lines.append("profile_total kiln_op_ms_per_execute=0.4500 wall_ms_per_execute=0.9000 ...")
    return "\n".join(lines) + "\n"


def test_check_reads_the_report_format():
    sys.path.insert(0, str(SCRIPTS))
    import check_profile

    assert check_profile.check_report(sample_report(check_profile.ITERATIONS))
    assert not check_profile.check_report(sample_report(check_profile.ITERATIONS + 1))
