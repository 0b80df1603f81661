"""CI cannot go green by skipping: a setup that fails fails .ci/run, and a test suite that collects
nothing fails the run. Each case runs the real scripts (in a temporary copy where they would
change something) and checks the exit status, with a control case that shows the same harness
passes when it should."""
from __future__ import annotations

import os
import re
import shutil
import subprocess

from conftest import REPO

VENV_BIN = REPO / ".venv" / "bin"


def copy_of_scripts(tmp_path):
    """The files .ci/run and setup.sh need before their first real step: the scripts, the CI
    entry point and pins.txt."""
    root = tmp_path / "repo"
    shutil.copytree(REPO / "scripts", root / "scripts")
    shutil.copytree(REPO / ".ci", root / ".ci")
    shutil.copy(REPO / "pins.txt", root / "pins.txt")
    return root


def run(cmd, timeout=120, **kw):
    return subprocess.run([str(c) for c in cmd], capture_output=True, text=True, errors="replace",
                          timeout=timeout, **kw)


def suite_function(call, *args, cwd=REPO):
    """Sources scripts/test.sh (which then only defines its suite functions), runs `call` with
    `args` and prints REACHED afterwards; under test.sh's `set -e` a failing suite ends the shell
    before that line, as it ends the CI run."""
    script = f'source "{REPO}/scripts/test.sh"; {call} "$@"; echo REACHED'
    return run(["bash", "-c", script, "suite", *args], cwd=cwd)


# (a) setup failing makes .ci/run fail, quickly and with the reason.

def test_ci_fails_when_setup_finds_no_cuda(tmp_path):
    root = copy_of_scripts(tmp_path)
    env = {**os.environ, "CUDA_HOME": str(tmp_path / "no-cuda-here")}
    r = run(["bash", root / ".ci" / "run"], timeout=60, env=env, cwd=root)
    assert r.returncode != 0, r.stdout + r.stderr
    assert "no CUDA toolkit" in r.stderr, r.stderr
    assert "== C++ tests" not in r.stdout and "== Python tests" not in r.stdout, r.stdout


def test_ci_fails_when_the_pins_cannot_be_installed(tmp_path):
    root = copy_of_scripts(tmp_path)
    # Not a version: pip rejects the file before it looks anything up or installs anything.
    (root / "pins.txt").write_text("executor" + "ch==\n")
    r = run(["bash", root / ".ci" / "run"], timeout=240, cwd=root)
    assert r.returncode != 0, r.stdout + r.stderr
    assert "pip install -r pins.txt failed" in r.stderr, r.stderr[-2000:]
    assert "== C++ tests" not in r.stdout, r.stdout


# (b) a pytest run that collects nothing fails the script.

def test_pytest_collecting_nothing_fails_the_run(tmp_path):
    empty = tmp_path / "no_tests"
    empty.mkdir()
    r = suite_function("run_pytest", empty, "-q", "-p", "no:cacheprovider", cwd=tmp_path)
    assert r.returncode == 5, r.stdout + r.stderr          # pytest's "no tests collected"
    assert "REACHED" not in r.stdout


def test_pytest_with_a_passing_test_carries_on(tmp_path):
    (tmp_path / "test_one.py").write_text("def test_one():\n    pass\n")
    r = suite_function("run_pytest", tmp_path, "-q", "-p", "no:cacheprovider", cwd=tmp_path)
    assert r.returncode == 0 and "REACHED" in r.stdout, r.stdout + r.stderr


# (c) ctest with no tests fails the script: an empty build folder, and one whose only test is
#     labelled gpu (excluded in CI).

def test_ctest_in_an_empty_build_folder_fails_the_run(tmp_path):
    r = suite_function("run_ctest", tmp_path)
    assert r.returncode != 0, r.stdout + r.stderr
    assert "REACHED" not in r.stdout


def configured_project(tmp_path, tests):
    src, build = tmp_path / "src", tmp_path / "build"
    src.mkdir()
    lines = ["cmake_minimum_required(VERSION 3.20)", "project(only_tests NONE)", "enable_testing()"]
    for name, label in tests:
        lines.append(f"add_test(NAME {name} COMMAND {shutil.which('true')})")
        if label:
            lines.append(f"set_tests_properties({name} PROPERTIES LABELS {label})")
    (src / "CMakeLists.txt").write_text("\n".join(lines) + "\n")
    r = run([VENV_BIN / "cmake", "-S", src, "-B", build, "-G", "Ninja",
             f"-DCMAKE_MAKE_PROGRAM={VENV_BIN / 'ninja'}"])
    assert r.returncode == 0, r.stdout + r.stderr
    return build


def test_ctest_whose_only_tests_need_a_gpu_fails_the_run(tmp_path):
    build = configured_project(tmp_path, [("kernel_on_device", "gpu")])
    r = suite_function("run_ctest", build)
    assert r.returncode != 0, r.stdout + r.stderr
    assert "No tests were found" in r.stdout + r.stderr
    assert "REACHED" not in r.stdout


def test_ctest_with_a_cpu_test_carries_on(tmp_path):
    build = configured_project(tmp_path, [("kernel_on_device", "gpu"), ("cpu_check", None)])
    r = suite_function("run_ctest", build)
    assert r.returncode == 0 and "REACHED" in r.stdout, r.stdout + r.stderr


# The CI entry point runs every suite through those functions, under set -e, with nothing that
# swallows a failure.

def test_the_ci_script_runs_every_suite_and_swallows_nothing():
    ci = (REPO / ".ci" / "run").read_text()
    assert "set -euo pipefail" in ci and re.search(r"^exec bash scripts/test\.sh", ci, re.M), ci
    test_sh = (REPO / "scripts" / "test.sh").read_text()
    assert "set -euo pipefail" in test_sh
    main = test_sh[test_sh.index("main() {"):]
    main = main[:main.index("\n}\n")]
    for step in ("bash scripts/setup.sh", "run_ctest build", "run_pytest tests",
                 "bash scripts/sanitize.sh", "bash scripts/fuzz.sh 60"):
        assert re.search(rf"^\s+{re.escape(step)}", main, re.M), f"scripts/test.sh main() lacks {step!r}"
    for swallow in ("|| true", "|| :", "set +e", "--no-tests=ignore"):
        assert swallow not in test_sh, f"scripts/test.sh contains {swallow!r}"
