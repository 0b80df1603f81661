"""kiln_llm's command line: bad options are refused with the reason and the usage (exit 2) before
any program loads; the usage names the timing and teacher-forcing options."""
import pytest

from conftest import BUILD, require, run


@pytest.fixture(scope="module")
def kiln_llm():
    return require(BUILD / "runner" / "kiln_llm", "run scripts/setup.sh to build it")


@pytest.mark.parametrize("args, reason", [
    (["--warmup", "-1"], "--warmup must be an integer >= 0"),
    (["--warmup", "1.5"], "--warmup must be an integer >= 0"),
    (["--repeats", "0"], "--repeats must be a positive integer"),
    (["--force", "1 x"], "--force takes space-separated token ids"),
    (["--logits"], "--logits needs a value"),
])
def test_bad_options_are_refused_before_loading(kiln_llm, tmp_path, args, reason):
    r = run([kiln_llm, tmp_path / "missing.pte", "--prompt", "1 2", *args])
    assert r.returncode == 2, r.stdout + r.stderr
    assert reason in r.stderr
    assert "usage: kiln_llm" in r.stderr


def test_usage_names_the_new_options(kiln_llm):
    r = run([kiln_llm])
    assert r.returncode == 2
    for option in ("--warmup N", "--repeats R", "--force", "--logits FILE"):
        assert option in r.stderr


def test_a_missing_program_is_named(kiln_llm, tmp_path):
    r = run([kiln_llm, tmp_path / "missing.pte", "--prompt", "1 2", "--warmup", "0"])
    assert r.returncode == 1
    assert "missing.pte" in r.stderr
