"""The CPU half of the concurrency check: export_concurrency.py writes what program_threads_gpu_test
and check_concurrency.py read on the GPU machine. The programs carry the Kiln delegates they must
(two in one method for several_delegates, with the CPU operator between them), every case file is
there under the name the C++ test builds, with the right size and eager PyTorch's values, and the
check fails when its test binary is missing."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from conftest import REPO
from kiln_executorch.aot import read_delegates, read_operators

SCRIPTS = REPO / "tests" / "gpu_e2e"
sys.path.insert(0, str(SCRIPTS))
import export_concurrency  # noqa: E402


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    out = tmp_path_factory.mktemp("concurrency")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO / "python"), os.environ.get("PYTHONPATH", "")]))
    r = subprocess.run([sys.executable, str(SCRIPTS / "export_concurrency.py"), "--out", str(out)],
                       capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    return out


def test_manifest_names_every_program(exported):
    manifest = json.loads((exported / "manifest.json").read_text())
    assert [p["name"] for p in manifest] == ["mlp", "norm", "several_delegates"]
    for p in manifest:
        assert (exported / p["pte"]).stat().st_size < 4 << 20, "keep the staged programs small"


@pytest.mark.parametrize("name,delegates,outside", [
    ("mlp", 1, []),
    ("norm", 1, []),
    ("several_delegates", 2, ["aten::cumsum.out"]),
])
def test_programs_carry_their_kiln_delegates(exported, name, delegates, outside):
    pte = exported / f"{name}.pte"
    found = read_delegates(pte)
    assert [d.backend_id for d in found] == ["KilnBackend"] * delegates, found
    assert {d.method for d in found} == {"forward"}
    assert all(d.data[:4] for d in found), "every delegate carries a blob"
    # ExecuTorch's device copies around each Kiln call (et_copy::*) are not work left outside.
    assert sorted(set(op for ops in read_operators(pte).values() for op in ops
                      if not op.startswith("et_copy::"))) == outside


def test_case_files_are_where_the_cpp_test_looks(exported):
    manifest = json.loads((exported / "manifest.json").read_text())
    for p in manifest:
        assert len(p["cases"]) >= 2, "the threads cycle through several cases"
        for c, case in enumerate(p["cases"]):
            for kind, files in (("input", case["inputs"]), ("expected", case["expected"])):
                for i, f in enumerate(files):
                    assert f["file"] == f"{p['name']}_case{c}_{kind}_{i}.bin"
                    assert f["dtype"] == "float32"
                    size = (exported / f["file"]).stat().st_size
                    assert size == 4 * int(np.prod(f["shape"])), f


def test_expected_outputs_are_eager_pytorch(exported):
    manifest = {p["name"]: p for p in json.loads((exported / "manifest.json").read_text())}
    for index, (name, (cls, shape, _)) in enumerate(export_concurrency.PROGRAMS.items()):
        torch.manual_seed(index)
        module = cls().eval()
        cases = manifest[name]["cases"]
        inputs = [np.fromfile(exported / c["inputs"][0]["file"], dtype=np.float32) for c in cases]
        assert not np.array_equal(inputs[0], inputs[1]), "cases must differ"
        for c, x in zip(cases, inputs):
            with torch.no_grad():
                want = module(torch.from_numpy(x.reshape(shape))).numpy().ravel()
            got = np.fromfile(exported / c["expected"][0]["file"], dtype=np.float32)
            np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)


def test_check_fails_without_its_test_binary(exported, tmp_path):
    r = subprocess.run([sys.executable, str(SCRIPTS / "check_concurrency.py"), "--dir", str(exported),
                        "--bin", str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert r.returncode != 0
    assert "program_threads_gpu_test" in r.stdout and "missing" in r.stdout, r.stdout
