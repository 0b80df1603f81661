"""Every public fixture program runs through kiln_runner on ExecuTorch's CPU kernels and gives the
eager PyTorch answer: its ones.expected through kiln-verify, and its real inputs within the
tolerance its meta.json suggests."""
from __future__ import annotations

import json

import numpy as np
import pytest

from conftest import FIXTURES, run
import kiln_verify

NAMES = sorted(p.parent.name for p in FIXTURES.glob("*/meta.json"))
NP_DTYPES = {"Float": np.float32, "Long": np.int64, "Int": np.int32, "Bool": np.bool_}


def test_every_fixture_is_covered():
    # The list is read from the folder; an empty list would make the parametrized tests vanish.
    assert len(NAMES) >= 9, f"expected the 9 public fixtures under {FIXTURES}, found {NAMES}"


def methods(name):
    meta = json.loads((FIXTURES / name / "meta.json").read_text())
    return [(name, m["name"]) for m in meta["methods"]]


ALL_METHODS = [nm for n in NAMES for nm in methods(n)]


@pytest.mark.parametrize("name,method", ALL_METHODS, ids=[f"{n}-{m}" for n, m in ALL_METHODS])
def test_ones_expected(runner, fixtures, name, method):
    meta = json.loads((fixtures / name / "meta.json").read_text())
    m = next(x for x in meta["methods"] if x["name"] == method)
    cmd = [runner, fixtures / name / "model.pte", "--method", method]
    for i, shape in enumerate(m["ones_input_shapes"]):
        cmd += ["--shape", f"{i}={','.join(map(str, shape))}"]
    r = run(cmd)
    assert r.returncode == 0, r.stderr
    expected = (fixtures / name / m["ones_expected_file"]).read_text()
    # ones.expected holds %.6g text: 6 significant digits, so compare at 1e-4 absolute.
    problems = kiln_verify.verify(r.stdout, expected, atol=1e-4)
    assert not problems, "\n".join(problems) + "\n" + r.stdout


@pytest.mark.parametrize("name,method", ALL_METHODS, ids=[f"{n}-{m}" for n, m in ALL_METHODS])
def test_real_inputs(runner, fixtures, tmp_path, name, method):
    meta = json.loads((fixtures / name / "meta.json").read_text())
    m = next(x for x in meta["methods"] if x["name"] == method)
    tol = meta["tolerance"]
    # Stateful programs run their cases as consecutive steps of one loaded method.
    stateful = bool(m.get("mutable_buffers"))
    groups = [m["cases"]] if stateful else [[c] for c in m["cases"]]
    for g, cases in enumerate(groups):
        out_dir = tmp_path / f"group{g}"
        cmd = [runner, fixtures / name / "model.pte", "--method", method, "--output-dir", out_dir]
        for k, case in enumerate(cases):
            if k:
                cmd.append("--next")
            for i, inp in enumerate(case["inputs"]):
                cmd += ["--input", f"{i}={fixtures / name / inp['file']}"]
                cmd += ["--shape", f"{i}={','.join(map(str, inp['shape']))}"]
        r = run(cmd)
        assert r.returncode == 0, r.stderr
        for k, case in enumerate(cases):
            for j, out in enumerate(case["outputs"]):
                prefix = f"run{k}_" if len(cases) > 1 else ""
                actual_file = out_dir / f"{prefix}output_{j}.bin"
                dtype = NP_DTYPES[out["et_dtype"]]
                actual = np.fromfile(actual_file, dtype=dtype)
                expected = np.fromfile(fixtures / name / out["file"], dtype=dtype)
                assert actual.shape == expected.shape, f"{case['name']} output {j}: {actual.shape} vs {expected.shape}"
                bound = tol["atol"] + tol["rtol"] * np.abs(expected)
                err = np.abs(actual.astype(np.float64) - expected.astype(np.float64))
                bad = np.flatnonzero(err > bound)
                assert bad.size == 0, (f"{name}/{method} case {case['name']} output {j}: {bad.size} values off, "
                                       f"max abs error {err.max():.3g} (atol {tol['atol']}, rtol {tol['rtol']})")


@pytest.mark.parametrize("name", [n for n in NAMES if n != "kv_cache_decode"])
def test_repeated_execution_gives_the_same_answer(runner, fixtures, name):
    # A memory-planned input may share arena bytes with later intermediates: the runner must hand
    # the inputs over again before every execution, or timing loops compute on clobbered data.
    once = run([runner, fixtures / name / "model.pte"])
    many = run([runner, fixtures / name / "model.pte", "--warmup", "2", "--iterations", "3"])
    assert once.returncode == 0 and many.returncode == 0, once.stderr + many.stderr
    strip = lambda text: [l for l in text.splitlines() if not l.startswith(("latency_ms", "load_method", "kiln_device_bytes"))]
    assert strip(many.stdout) == strip(once.stdout)
