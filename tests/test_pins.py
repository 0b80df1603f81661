"""The installed packages are the pinned ones, and no file but pins.txt states a version of them."""
from __future__ import annotations

import subprocess

import check_pins
from conftest import REPO


def test_pin_file_names_executorch_and_torch():
    pins = check_pins.read_pins()
    assert set(pins) >= {"executorch", "torch"}, pins


def test_installed_packages_match_the_pins():
    assert check_pins.problems(check_pins.read_pins()) == []


def test_installed_executorch_records_the_pinned_source_version():
    from executorch import version

    assert version.__version__.split("+")[0] == check_pins.read_pins()["executorch"]
    assert version.git_version, "the executorch wheel records no source revision"


def tracked_files():
    out = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=REPO, capture_output=True,
                         text=True, check=True).stdout.split()
    return [REPO / f for f in out]


def test_no_second_pin_in_the_repository():
    files = tracked_files()
    assert len(files) > 10, "git ls-files found almost nothing: is this a checkout?"
    assert check_pins.stray_pins(REPO, files) == []


def test_a_planted_second_pin_is_found(tmp_path):
    # Built from pieces so that this file does not itself hold a second pin.
    et, th = "executor" + "ch", "to" + "rch"
    (tmp_path / "pins.txt").write_text(f"{et}==9.9.9\n")
    planted = [tmp_path / "requirements.txt", tmp_path / "setup.sh", tmp_path / "README.md"]
    planted[0].write_text(f"numpy\n{th}>=2.1\n")
    planted[1].write_text(f"pip install {et}==1.4.0\n")
    planted[2].write_text(f"Works with {th} 2.13 and later.\n")
    found = check_pins.stray_pins(tmp_path, [tmp_path / "pins.txt", *planted])
    assert [f.split(":")[0] for f in found] == ["requirements.txt", "setup.sh", "README.md"], found


def test_malformed_pin_is_rejected(tmp_path):
    bad = tmp_path / "pins.txt"
    bad.write_text("executor" + "ch>=1.0\n")
    try:
        check_pins.read_pins(bad)
    except ValueError as e:
        assert "not an exact pin" in str(e)
    else:
        raise AssertionError("a range was accepted as a pin")
