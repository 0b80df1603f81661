"""Unit tests for tools/kiln_verify.py and its tools/kiln-verify wrapper."""

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
TOOLS = REPO / "tools"
FIXTURES = REPO.parent / "shared" / "fixtures"

sys.path.insert(0, str(TOOLS))
from kiln_verify import verify  # noqa: E402

EXPECTED = "[2,4]\n1 2 3 4 5 6 7 8\n"
RUNNER = "loaded model.pte\noutput[0] shape=[2,4] dtype=Float\n1 2 3 4 5 6 7 8\nlatency 1.5 ms\n"


def run_cli(tmp_path, runner_text, expected_text=EXPECTED, *args, stdin=False):
    expected = tmp_path / "model.expected"
    expected.write_text(expected_text)
    cmd = [sys.executable, str(TOOLS / "kiln_verify.py"), "--expected", str(expected), *args]
    if not stdin:
        runner = tmp_path / "runner.txt"
        runner.write_text(runner_text)
        cmd.append(str(runner))
    return subprocess.run(cmd, input=runner_text if stdin else None, capture_output=True,
                          text=True, timeout=60)


def one_problem(runner_text, expected_text=EXPECTED, atol=1e-5, **kw):
    problems = verify(runner_text, expected_text, atol, **kw)
    assert len(problems) == 1, problems
    return problems[0]


# Passing cases.

def test_exact_pass_cli(tmp_path):
    r = run_cli(tmp_path, RUNNER.replace("1 2 3", "1.0 2 3"), EXPECTED, "--atol", "0")
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout == "kiln-verify: OK output[0] shape=[2,4] 8 values within atol=0\n"


def test_tolerance_pass_and_fail():
    near = RUNNER.replace("1 2 3", "1.000009 1.999991 3")
    assert verify(near, EXPECTED, 1e-5) == []
    problems = verify(near, EXPECTED, 1e-6)
    assert problems == ["output[0] value[0]: actual 1.000009 expected 1 (diff 9e-06 > atol 1e-06)",
                        "output[0] value[1]: actual 1.999991 expected 2 (diff 9e-06 > atol 1e-06)"]


def test_boundary_diff_shown_in_full():
    # 2 - 1.99999 is 1.0000000000065512e-05 in binary: just over atol, so it fails, and the
    # message must not read "diff 1e-05 > atol 1e-05".
    problem = one_problem(RUNNER.replace(" 2 ", " 1.99999 "))
    assert problem.endswith("(diff 1.0000000000065512e-05 > atol 1e-05)")


def test_wrapper_and_stdin(tmp_path):
    expected = tmp_path / "m.expected"
    expected.write_text(EXPECTED)
    for extra in ([], ["-"]):
        r = subprocess.run([str(TOOLS / "kiln-verify"), "--expected", str(expected), *extra],
                           input=RUNNER, capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stdout + r.stderr
        assert "kiln-verify: OK output[0] shape=[2,4] 8 values within atol=1e-05" in r.stdout


def test_stdin_failure(tmp_path):
    r = run_cli(tmp_path, RUNNER.replace("8\n", "9\n"), EXPECTED, stdin=True)
    assert r.returncode == 1
    assert r.stdout == ("kiln-verify: FAIL output[0] value[7]: actual 9 expected 8 "
                        "(diff 1 > atol 1e-05)\n")


# Output and run selection.

MULTI = """# run 0
output[0] shape=[2,4] dtype=Float
0 0 0 0 0 0 0 0
output[1] shape=[] dtype=Long
7
output[2] value=3 type=Int
# run 1
output[0] shape=[2,4] dtype=Float
1 2 3 4 5 6 7 8
"""


def test_run_selection(tmp_path):
    assert verify(MULTI, EXPECTED, 0, run_index=1) == []
    assert "value[0]: actual 0 expected 1" in verify(MULTI, EXPECTED, 0, run_index=0)[0]
    r = run_cli(tmp_path, MULTI, EXPECTED, "--run", "1")
    assert r.returncode == 0, r.stdout
    r = run_cli(tmp_path, MULTI, EXPECTED)
    assert r.returncode == 1 and "value[0]" in r.stdout


def test_output_selection(tmp_path):
    assert verify(MULTI, "[]\n7\n", 0, output_index=1) == []
    r = run_cli(tmp_path, MULTI, "[]\n7\n", "--output", "1", "--atol", "0")
    assert r.returncode == 0, r.stdout
    assert "OK output[1] shape=[] 1 values within atol=0" in r.stdout


def test_non_tensor_output():
    problem = one_problem(MULTI, "[]\n3\n", output_index=2)
    assert "runner line 6: output[2] is not a tensor (type=Int value=3)" in problem


def test_missing_output():
    assert one_problem(MULTI, output_index=1, run_index=1) == \
        "missing output[1] in run 1 of the runner text"
    assert "missing output[0]" in one_problem("loaded model.pte\n")


def test_missing_run(tmp_path):
    assert one_problem(MULTI, run_index=2) == \
        "missing output[0]: runner text has no '# run 2' line"
    assert "no '# run 1' line" in one_problem(RUNNER, run_index=1)
    r = run_cli(tmp_path, MULTI, EXPECTED, "--run", "5")
    assert r.returncode == 1 and "FAIL missing output[0]" in r.stdout


def test_duplicate_output():
    assert "printed output[0] 2 times in run 0 (lines 2, 6)" in one_problem(RUNNER + RUNNER)


# Failure modes.

def test_wrong_shape(tmp_path):
    r = run_cli(tmp_path, RUNNER.replace("[2,4]", "[4,2]"))
    assert r.returncode == 1
    assert r.stdout == "kiln-verify: FAIL output[0] shape mismatch: actual [4,2] expected [2,4]\n"


def test_many_bad_values_are_capped():
    runner = "output[0] shape=[12] dtype=Float\n" + " ".join(["0"] * 12) + "\n"
    problems = verify(runner, "[12]\n" + " ".join(["1"] * 12) + "\n", 0.5)
    assert len(problems) == 11
    assert problems[9].startswith("output[0] value[9]: actual 0 expected 1")
    assert problems[10] == "output[0]: 2 more values outside atol 0.5 (12 of 12 in all)"


def test_missing_values_line_in_expected(tmp_path):
    for expected in ("[2,4]\n", "[2,4]\n\n", "[2,4]\n   \n"):
        assert "missing values line" in one_problem(RUNNER, expected)
    r = run_cli(tmp_path, RUNNER, "[2,4]")
    assert r.returncode == 1 and "FAIL expected file: missing values line" in r.stdout


def test_empty_expected_file(tmp_path):
    assert one_problem(RUNNER, "") == "expected file is empty"
    r = run_cli(tmp_path, RUNNER, "\n")
    assert r.returncode == 1 and "FAIL expected file is empty" in r.stdout


def test_extra_expected_line():
    assert "expected line 3: unexpected extra line '9'" in one_problem(RUNNER, EXPECTED + "9\n")


def test_fewer_runner_values():
    problem = one_problem(RUNNER.replace(" 7 8", ""))
    assert problem == "output[0]: runner printed 6 values, expected file has 8"


def test_runner_values_line_missing():
    # The header is followed by another output, then by the end of the text.
    for runner in ("output[0] shape=[2,4] dtype=Float\noutput[1] shape=[] dtype=Long\n7\n",
                   "output[0] shape=[2,4] dtype=Float\n"):
        assert "runner printed 0 values, expected file has 8" in one_problem(runner)


def test_unparsable_expected():
    assert "expected line 1: unparsable shape '[2, 4]'" in one_problem(RUNNER, "[2, 4]\n1 2\n")
    assert "expected line 1: unparsable shape '(2,4)'" in one_problem(RUNNER, "(2,4)\n1 2\n")
    assert "expected line 2: unparsable value 'x'" in one_problem(RUNNER, "[2,4]\n1 x 3\n")
    # float() accepts these, %.6g never prints them.
    assert "unparsable value '1_0'" in one_problem(RUNNER, "[2,4]\n1_0\n")


def test_unparsable_runner(tmp_path):
    bad_shape = RUNNER.replace("[2,4]", "[2,a]")
    assert one_problem(bad_shape) == \
        "runner line 2: unparsable shape '[2,a]' (want [d0,d1,...] with no spaces)"
    bad_value = RUNNER.replace(" 5 ", " 5.5.5 ")
    assert one_problem(bad_value).startswith("runner line 3: unparsable value '5.5.5'")
    bad_header = "output[0] shape=[2,4]\n1 2 3 4 5 6 7 8\n"
    assert "runner line 1: unparsable output header" in one_problem(bad_header)
    r = run_cli(tmp_path, bad_value)
    assert r.returncode == 1 and "FAIL runner line 3: unparsable value" in r.stdout


# NaN and infinities.

@pytest.mark.parametrize("actual, expected, ok", [
    ("nan", "nan", True),
    ("-nan", "nan", True),
    ("nan", "1", False),
    ("1", "nan", False),
    ("inf", "inf", True),
    ("-inf", "-inf", True),
    ("inf", "-inf", False),
    ("inf", "1e30", False),
    ("1e30", "inf", False),
])
def test_non_finite(actual, expected, ok):
    runner = f"output[0] shape=[2] dtype=Float\n{actual} 5\n"
    problems = verify(runner, f"[2]\n{expected} 5\n", 1e300)
    if ok:
        assert problems == []
    else:
        assert len(problems) == 1
        assert f"value[0]: actual {actual} expected {expected}" in problems[0]


def test_nan_message():
    problem = one_problem("output[0] shape=[1] dtype=Float\nnan\n", "[1]\n0\n")
    assert problem == "output[0] value[0]: actual nan expected 0 (NaN mismatch)"


# Usage errors.

@pytest.mark.parametrize("args, message", [
    ([], "the following arguments are required: --expected"),
    (["--expected", "/nonexistent/x.expected"],
     "cannot read expected file '/nonexistent/x.expected'"),
    (["--expected", "{expected}", "/nonexistent/runner.txt"], "cannot read runner output"),
    (["--expected", "{expected}", "--atol", "abc"], "invalid float value: 'abc'"),
    (["--expected", "{expected}", "--atol", "-1"], "--atol must be a non-negative number"),
    (["--expected", "{expected}", "--atol", "nan"], "--atol must be a non-negative number"),
    (["--expected", "{expected}", "--output", "-1"], "must be non-negative"),
])
def test_usage_errors(tmp_path, args, message):
    expected = tmp_path / "m.expected"
    expected.write_text(EXPECTED)
    args = [a.format(expected=expected) for a in args]
    r = subprocess.run([sys.executable, str(TOOLS / "kiln_verify.py"), *args], input=RUNNER,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2
    assert message in r.stderr


# Real fixture.

def test_real_fixture(tmp_path):
    assert FIXTURES.is_dir(), f"fixtures folder {FIXTURES} is missing"
    expected = FIXTURES / "cnn_small" / "ones.expected"
    shape, values = expected.read_text().splitlines()
    runner = (f"loaded model.pte\n# run 0\noutput[0] shape={shape} dtype=Float\n{values}\n"
              "latency 2 ms\n")
    r = subprocess.run([str(TOOLS / "kiln-verify"), "--expected", str(expected)], input=runner,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    assert r.stdout == f"kiln-verify: OK output[0] shape={shape} 8 values within atol=1e-05\n"
    # Perturbing one value by more than atol must fail on that value alone.
    tokens = values.split()
    tokens[3] = f"{float(tokens[3]) + 1e-3:.6g}"
    problems = verify(runner.replace(values, " ".join(tokens)), expected.read_text(), 1e-5)
    assert len(problems) == 1 and problems[0].startswith("output[0] value[3]: actual ")
