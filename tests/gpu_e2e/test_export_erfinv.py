"""CI side of the GPU erfinv check: export_erfinv.py writes what check_erfinv.py needs (erfinv and
the coalesced fixture each one Kiln delegate with nothing left to ExecuTorch's kernels, the domain
inputs, expected outputs), and check_erfinv.py judges runner results as intended, driven by a
stand-in runner: a correctly rounded erfinv and the expected coalesced outputs pass every case
but the comparison with torch on CUDA (no GPU here, which it must report as a failure); a runner
whose erfinv is one step short of 1 at the poles, or whose coalesced output has a NaN, fails."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from kiln_executorch.aot import read_delegates, read_operators

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    out = tmp_path_factory.mktemp("erfinv")
    env = dict(os.environ, PYTHONPATH=str(REPO / "python"), KILN_SKIP_DELEGATE_REGISTRATION="1")
    r = subprocess.run([sys.executable, HERE / "export_erfinv.py", "--out", out], env=env,
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return out


def test_programs_are_one_kiln_delegate(exported):
    for name, precision in [("erfinv", "fp32"), ("coalesced_fp32", "fp32"),
                            ("coalesced_bf16", "bf16"), ("coalesced_fp16", "fp16")]:
        pte = exported / f"{name}.pte"
        (delegate,) = read_delegates(pte)
        assert delegate.backend_id == "KilnBackend"
        assert delegate.compile_specs == {"precision": precision.encode(),
                                          "target_device": b"cuda:0"}
        assert read_operators(pte, device_copies=False)["forward"] == []
        assert pte.stat().st_size < 1 << 20


def test_manifest_and_files(exported):
    m = json.loads((exported / "manifest.json").read_text())
    x = np.fromfile(exported / m["kernel"]["input"], dtype=np.float32)
    assert x.size == m["kernel"]["count"] > 100000
    assert np.isnan(x).any() and (x == 1).any() and (x == -1).any() and (np.abs(x) > 1).any()
    assert [c["name"] for c in m["coalesced"]] == [
        f"coalesced_{p}_{i}" for p in ("fp32", "bf16", "fp16") for i in ("fixture", "linspace")]
    for c in m["coalesced"]:
        assert (exported / c["input"]).stat().st_size == 64 * 64 * 4
        assert np.isfinite(np.fromfile(exported / c["expected"], dtype=np.float32)).all()


# Writes output_0.bin as a runner would: erfinv in float64 rounded to float32 (so every kernel
# case can pass) or the expected coalesced output; BREAK=1 makes erfinv(+-1) finite and puts a
# NaN into coalesced's output.
STAND_IN = '''
import json, os, pathlib, sys
import numpy as np, torch
args = sys.argv[1:]
pte, d = pathlib.Path(args[0]), pathlib.Path(args[0]).parent
inp = pathlib.Path(args[args.index("--input") + 1].split("=", 1)[1])
out = pathlib.Path(args[args.index("--output-dir") + 1])
out.mkdir(parents=True, exist_ok=True)
x = np.fromfile(inp, dtype=np.float32)
broken = os.environ.get("BREAK") == "1"
if pte.name == "erfinv.pte":
    y = torch.erfinv(torch.from_numpy(x).double()).float().numpy()
    if broken:
        y[x == 1], y[x == -1] = 4.0, -4.0
else:
    m = json.loads((d / "manifest.json").read_text())
    c = next(c for c in m["coalesced"] if c["program"] == pte.name and c["input"] == inp.name)
    y = np.fromfile(d / c["expected"], dtype=np.float32)
    if broken:
        y[0] = np.nan
y.astype(np.float32).tofile(out / "output_0.bin")
'''


def check(exported, runner, **env):
    return subprocess.run([sys.executable, HERE / "check_erfinv.py", "--dir", exported,
                           "--runner", runner], capture_output=True, text=True, timeout=600,
                          env=dict(os.environ, **env))


def test_check_script_judges_runner_results(exported, tmp_path):
    runner = tmp_path / "runner"
    runner.write_text("#!" + sys.executable + "\n" + STAND_IN)
    runner.chmod(0o755)
    r = check(exported, runner)
    lines = r.stdout.splitlines()
    failed = [line for line in lines if line.startswith("FAIL")]
    if torch.cuda.is_available():
        # float64-rounded erfinv is not erfinvf bit for bit; only the torch comparison may differ.
        assert all(line.startswith("FAIL erfinv/erfinv vs torch.cuda") for line in failed), r.stdout
        assert lines[-1] in ("erfinv: 9/10 cases passed", "erfinv: 10/10 cases passed"), r.stdout
    else:
        assert failed == ["FAIL erfinv/erfinv vs torch.cuda: torch has no CUDA device here, so "
                          "torch.erfinv on CUDA cannot be compared"], r.stdout
        assert r.returncode == 1 and lines[-1] == "erfinv: 9/10 cases passed", r.stdout

    r = check(exported, runner, BREAK="1")
    failed = {line.split(":")[0] for line in r.stdout.splitlines() if line.startswith("FAIL")}
    assert {"FAIL erfinv/erfinv special values", "FAIL erfinv/coalesced_bf16_linspace",
            "FAIL erfinv/coalesced_fp32_fixture"} <= failed, r.stdout
    assert "PASS erfinv/erfinv near 1" in r.stdout, r.stdout
    (tmp_path / "bad").write_text("#!/bin/sh\nexit 3\n")
    (tmp_path / "bad").chmod(0o755)
    r = check(exported, tmp_path / "bad")
    assert r.returncode == 1 and "erfinv: 0/10 cases passed" in r.stdout, r.stdout
    assert "kiln_runner exit 3" in r.stdout


@pytest.mark.parametrize("script", ["check_erfinv.py", "check_operators.py", "e2e_args.py"])
def test_check_needs_only_python_numpy_and_torch(script):
    # The GPU machine has python3, numpy and torch, not executorch or kiln_executorch; e2e_args is
    # the checks' shared command line beside them.
    import ast

    tree = ast.parse((HERE / script).read_text())
    imported = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import)
                for a in n.names}
    imported |= {n.module.split(".")[0] for n in ast.walk(tree)
                 if isinstance(n, ast.ImportFrom) and n.module}
    allowed = set(sys.stdlib_module_names) | {"numpy", "torch", "e2e_args", "__future__"}
    assert imported <= allowed, sorted(imported - allowed)
