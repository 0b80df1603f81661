"""CI side of the dynamic-shape GPU check: export_dynamic.py writes what check_dynamic.py needs
(each program one Kiln delegate holding a variant set, nothing left to ExecuTorch's kernels,
inputs and eager outputs at three sizes, a past-the-bound case), and check_dynamic.py judges
runner results as intended (driven here by a stand-in runner that replays the expected files)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from kiln_executorch.aot import read_delegates, read_operators
from kiln_testing.blob_reader import read_variant_set

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    out = tmp_path_factory.mktemp("dynamic")
    env = dict(os.environ, PYTHONPATH=str(REPO / "python"), KILN_SKIP_DELEGATE_REGISTRATION="1")
    r = subprocess.run([sys.executable, HERE / "export_dynamic.py", "--out", out], env=env,
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    return out


def test_programs_are_one_variant_set_delegate(exported):
    expected = {"mlp_fp32": 16, "mlp_bf16": 16, "block_fp32": 32}
    for name, count in expected.items():
        pte = exported / f"{name}.pte"
        assert pte.stat().st_size < 4 << 20
        (delegate,) = read_delegates(pte)
        assert delegate.backend_id == "KilnBackend"
        assert delegate.compile_specs == {"precision": name.split("_")[1].encode(), "target_device": b"cuda:0"}
        variants, weights = read_variant_set(delegate.data)
        assert len(variants) == count and weights is not None
        assert read_operators(pte, device_copies=False)["forward"] == []


def test_cases_and_files(exported):
    cases = json.loads((exported / "cases.json").read_text())
    assert len(cases) == 12
    for case in cases:
        x = np.fromfile(exported / case["input"], dtype=np.float32)
        assert x.size == np.prod(case["shape"])
        if case.get("must_fail"):
            assert case["shape"] in ([17, 256], [1, 33, 32])
            continue
        y = np.fromfile(exported / case["expected"], dtype=np.float32)
        assert y.size == np.prod(case["expected_shape"]) and np.isfinite(y).all()
    sizes = {c["name"] for c in cases}
    assert {"mlp_fp32_1", "mlp_fp32_7", "mlp_fp32_16", "block_fp32_32"} <= sizes


STAND_IN = '''
import sys, shutil, pathlib, json
args = sys.argv[1:]
pte, d = pathlib.Path(args[0]), pathlib.Path(args[0]).parent
shape = args[args.index("--shape") + 1].split("=", 1)[1]
out = pathlib.Path(args[args.index("--output-dir") + 1])
case = next(c for c in json.loads((d / "cases.json").read_text())
            if c["program"] == pte.name and ",".join(map(str, c["shape"])) == shape)
if case.get("must_fail"):
    print("set_input(0) failed: InvalidArgument (0x12): past the bound", file=sys.stderr)
    sys.exit(1)
out.mkdir(parents=True)
shutil.copy(d / case["expected"], out / "output_0.bin")
print("output[0] shape=[" + ",".join(map(str, case["expected_shape"])) + "] dtype=Float")
'''


def test_check_script_passes_matching_results(exported, tmp_path):
    runner = tmp_path / "runner"
    runner.write_text("#!" + sys.executable + "\n" + STAND_IN)
    runner.chmod(0o755)
    r = subprocess.run([sys.executable, HERE / "check_dynamic.py", "--dir", exported,
                        "--runner", runner], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "dynamic: 12/12 cases passed" in r.stdout
    # A runner that succeeds past the bound, or returns wrong values, fails the check.
    (tmp_path / "bad").write_text("#!/bin/sh\nexit 0\n")
    (tmp_path / "bad").chmod(0o755)
    r = subprocess.run([sys.executable, HERE / "check_dynamic.py", "--dir", exported,
                        "--runner", tmp_path / "bad"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 1 and "dynamic: 0/12 cases passed" in r.stdout, r.stdout
