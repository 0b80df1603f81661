"""Bad input to kiln_runner gives a non-zero exit and a message that says what to do; never a crash
(a crash shows as a negative return code: killed by a signal)."""
from __future__ import annotations

import os

import pytest

from conftest import run


def check(r, *fragments):
    assert r.returncode > 0, f"expected a clean failure, got {r.returncode}\n{r.stderr}"
    for f in fragments:
        assert f in r.stderr, f"{f!r} not in:\n{r.stderr}"


@pytest.mark.parametrize("keep", [0, 7, 63, 500, 2000])
def test_truncated_program(runner, fixtures, tmp_path, keep):
    bad = tmp_path / "truncated.pte"
    bad.write_bytes((fixtures / "mlp" / "model.pte").read_bytes()[:keep])
    # Too short for a header (0-63 bytes) is InvalidArgument to ExecuTorch, a cut body
    # InvalidProgram: either way the runner says the file is bad, never "check the inputs".
    check(run([runner, bad]), "failed:", "(0x", "not a valid ExecuTorch program", "re-export it")


def test_random_bytes(runner, tmp_path):
    bad = tmp_path / "random.pte"
    bad.write_bytes(os.urandom(4096))
    check(run([runner, bad]), "InvalidProgram (0x23)", "not a valid ExecuTorch program")


def test_missing_file(runner, tmp_path):
    check(run([runner, tmp_path / "nope.pte"]), "opening", "failed")


def test_wrong_input_size(runner, fixtures, tmp_path):
    bad = tmp_path / "short.bin"
    bad.write_bytes(b"\0" * 12)
    check(run([runner, fixtures / "mlp" / "model.pte", "--input", f"0={bad}"]),
          "has 12 bytes, expected 8192", "shape [8,256]")


def test_input_index_out_of_range(runner, fixtures, tmp_path):
    f = tmp_path / "x.bin"
    f.write_bytes(b"\0" * 8192)
    check(run([runner, fixtures / "mlp" / "model.pte", "--input", f"3={f}"]), "has only 1 inputs")


def test_unknown_method(runner, fixtures):
    check(run([runner, fixtures / "multi_method" / "model.pte", "--method", "decode"]),
          "method 'decode' not found", "'encode', 'forward'")


def test_shape_past_dynamic_bound(runner, fixtures):
    check(run([runner, fixtures / "dynamic_mlp" / "model.pte", "--shape", "0=17,256"]),
          "--shape 0=[17,256] is past the bound [16,256] input 0 was exported with (dimension 0)")


def test_bad_option(runner):
    r = run([runner, "m.pte", "--frobnicate"])
    assert r.returncode == 2 and "unknown option" in r.stderr and "usage:" in r.stderr


def test_missing_operator_is_named_with_what_to_link(runner, fixtures):
    # With only the wheel's kernels the coalesced fixture (a portable program: no Kiln, so erfinv
    # is a CPU kernel there whatever Kiln supports) lacks aten::erfinv.out.
    r = run([runner, fixtures / "coalesced" / "model.pte"], env={**os.environ, "KILN_RUNNER_WHEEL_KERNELS_ONLY": "1"})
    check(r, "load_method('forward') failed: OperatorMissing (0x14)", "aten::erfinv.out", "link")
