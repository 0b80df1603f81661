"""kiln_runner --profile on a program without Kiln delegates: the outputs and the latency line as
usual, the latency line flagged as measured with profiling on, and a clear "no Kiln engine ran"
line instead of a table; exit 0. (The tables themselves need a GPU: engine_profile_gpu_test.)"""
from __future__ import annotations

from conftest import run
import kiln_verify


def test_profile_of_a_cpu_only_program_says_no_kiln_engine_ran(runner, fixtures):
    program = fixtures / "add_one" / "model.pte"
    r = run([runner, program, "--profile", "--iterations", "3", "--warmup", "1"])
    assert r.returncode == 0, r.stderr
    assert "# profile of run 0: 3 executes of 'forward'" in r.stdout, r.stdout
    assert "profile: no Kiln engine ran" in r.stdout, r.stdout
    assert "Kiln engine 1" not in r.stdout and "profile_total" not in r.stdout, r.stdout
    assert "latency_ms min=" in r.stdout, r.stdout
    assert "latency measured with --profile on" in r.stdout, r.stdout
    # The outputs are unchanged by --profile.
    problems = kiln_verify.verify(r.stdout, (fixtures / "add_one" / "ones.expected").read_text(),
                                  atol=1e-4)
    assert not problems, "\n".join(problems)


def test_profile_reports_each_run_of_next(runner, fixtures):
    r = run([runner, fixtures / "add_one" / "model.pte", "--profile", "--next"])
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("profile: no Kiln engine ran") == 2, r.stdout
    assert "# profile of run 1: 1 executes of 'forward'" in r.stdout, r.stdout


def test_usage_names_profile(runner):
    r = run([runner, "m.pte", "--frobnicate"])
    assert r.returncode == 2 and "--profile" in r.stderr, r.stderr
