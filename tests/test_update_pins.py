"""tools/update_pins.py against a fake package index: a newer executorch release moves the pins of a
temporary copy of pins.txt (and only them), a day with nothing new leaves it byte for byte, and a
failing check puts it back. No network: every look-up is answered by the fake index."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

import check_pins
import update_pins
from conftest import REPO

# Package names built from pieces so that this file does not itself hold a second pin.
ET, TORCH, TV = "executor" + "ch", "to" + "rch", "to" + "rchvision"


def current():
    pins = check_pins.read_pins()
    return pins[ET], pins[TORCH], pins.get(TV)


def bump(version, minor_step=1):
    major, minor = (int(p) for p in version.split(".")[:2])
    return major, minor + minor_step


def fake_index(et_versions, torch_versions, tv_versions, requires=None):
    return {"versions": {ET: et_versions, TORCH: torch_versions, TV: tv_versions},
            "requires": requires or {}}


def newer_release_index():
    """An index one executorch minor release ahead, with its torch and torchvision lines."""
    et, torch, tv = current()
    et_major, et_minor = bump(et)
    t_minor = et_minor + 9
    new_et = f"{et_major}.{et_minor}.0"
    new_torch = f"2.{t_minor}.1"
    new_tv = f"0.{t_minor + 15}.1"
    index = fake_index(
        [et, new_et, f"{et_major}.{et_minor + 1}.0rc1"],               # the rc is ignored
        [torch, f"2.{t_minor}.0", new_torch, f"2.{t_minor + 1}.0"],    # the next line is not ours
        [tv, f"0.{t_minor + 15}.0", new_tv, f"0.{t_minor + 16}.0"])
    return index, (new_et, new_torch, new_tv)


@pytest.fixture
def pins_copy(tmp_path):
    path = tmp_path / "pins.txt"
    path.write_bytes((REPO / "pins.txt").read_bytes())
    return path


def run_tool(tmp_path, pins, index, *flags):
    fake = tmp_path / "index.json"
    fake.write_text(json.dumps(index))
    return subprocess.run([sys.executable, str(REPO / "tools" / "update_pins.py"), "--pins", str(pins),
                           "--fake-index", str(fake), *flags],
                          capture_output=True, text=True, timeout=60)


def test_a_newer_release_moves_executorch_torch_and_torchvision(tmp_path, pins_copy):
    index, (new_et, new_torch, new_tv) = newer_release_index()
    before = pins_copy.read_text()
    r = run_tool(tmp_path, pins_copy, index, "--no-check")
    assert r.returncode == 0, r.stderr
    after = pins_copy.read_text()
    assert check_pins.read_pins(pins_copy) == {**check_pins.read_pins(REPO / "pins.txt"),
                                               ET: new_et, TORCH: new_torch, TV: new_tv}
    # Only the three pin lines and the comments that state their versions change.
    et, torch, tv = current()
    changed = [(a, b) for a, b in zip(before.splitlines(), after.splitlines()) if a != b]
    assert len(before.splitlines()) == len(after.splitlines())
    for old_line, new_line in changed:
        assert old_line.startswith("#") or "==" in old_line, (old_line, new_line)
    assert f"{ET}=={new_et}" in after and f"{TORCH}=={new_torch}" in after
    for old in (f"{ET} {et}", f"{TORCH} {torch}", f"{ET} {'.'.join(et.split('.')[:2])} "):
        assert old not in after, f"a comment still states {old!r}"
    assert f"{ET} {et} -> {new_et}" in r.stdout, r.stdout


def test_nothing_new_changes_nothing_byte_for_byte(tmp_path, pins_copy):
    et, torch, tv = current()
    before = pins_copy.read_bytes()
    older = f"{bump(et, -1)[0]}.{bump(et, -1)[1]}.0"
    r = run_tool(tmp_path, pins_copy, fake_index([older, et], [torch], [tv]))
    assert r.returncode == 0, r.stderr
    assert pins_copy.read_bytes() == before
    assert "unchanged" in r.stdout and "newest release" in r.stdout, r.stdout


def test_dry_run_prints_the_plan_and_changes_nothing(tmp_path, pins_copy):
    index, (new_et, new_torch, _) = newer_release_index()
    before = pins_copy.read_bytes()
    r = run_tool(tmp_path, pins_copy, index, "--dry-run")
    assert r.returncode == 0, r.stderr
    assert pins_copy.read_bytes() == before
    assert new_et in r.stdout and new_torch in r.stdout and "dry run" in r.stdout, r.stdout


def test_a_torch_requirement_in_the_wheel_metadata_decides(tmp_path, pins_copy):
    index, (new_et, _, _) = newer_release_index()
    t_minor = int(new_et.split(".")[1]) + 9
    # The metadata pins an older patch of the line: that one, not the newest, is chosen.
    index["requires"] = {f"{ET}=={new_et}": [f"{TORCH}==2.{t_minor}.0", "numpy"]}
    r = run_tool(tmp_path, pins_copy, index, "--no-check")
    assert r.returncode == 0, r.stderr
    assert check_pins.read_pins(pins_copy)[TORCH] == f"2.{t_minor}.0"


def test_a_missing_torch_line_fails_and_changes_nothing(tmp_path, pins_copy):
    index, _ = newer_release_index()
    et, torch, tv = current()
    index["versions"][TORCH] = [torch]          # the paired line is not on the index yet
    before = pins_copy.read_bytes()
    r = run_tool(tmp_path, pins_copy, index, "--no-check")
    assert r.returncode != 0
    assert "line" in r.stderr and "no such release" in r.stderr, r.stderr
    assert pins_copy.read_bytes() == before


def test_torchvision_that_rejects_the_torch_fails(tmp_path, pins_copy):
    index, (_, new_torch, new_tv) = newer_release_index()
    index["requires"] = {f"{TV}=={new_tv}": [f"{TORCH}<2.0"]}
    r = run_tool(tmp_path, pins_copy, index, "--no-check")
    assert r.returncode != 0 and "does not meet" in r.stderr, r.stderr


def test_failing_checks_restore_the_pins(pins_copy):
    index, _ = newer_release_index()
    before = pins_copy.read_bytes()
    seen = []

    def failing_checks(repo):
        seen.append((repo, pins_copy.read_text()))
        return "scripts/test.sh"

    rc = update_pins.main(["--pins", str(pins_copy)], index=update_pins.FakeIndex(index),
                          checks=failing_checks)
    assert rc == 1
    assert pins_copy.read_bytes() == before
    (repo, during), = seen
    assert repo == pins_copy.parent and during.encode() != before, "checks ran on the old pins"


def test_passing_checks_keep_the_new_pins(pins_copy):
    index, (new_et, _, _) = newer_release_index()
    rc = update_pins.main(["--pins", str(pins_copy)], index=update_pins.FakeIndex(index),
                          checks=lambda repo: None)
    assert rc == 0
    assert check_pins.read_pins(pins_copy)[ET] == new_et


def test_the_tool_reads_pins_as_check_pins_does():
    assert update_pins.read_pins((REPO / "pins.txt").read_text()) == check_pins.read_pins()


def test_the_real_checks_are_setup_then_test(monkeypatch, tmp_path):
    calls = []

    def fake_run(cmd, cwd):
        calls.append(cmd)
        return subprocess.CompletedProcess(cmd, 1 if cmd[-1] == "scripts/test.sh" else 0)

    monkeypatch.setattr(update_pins.subprocess, "run", fake_run)
    assert update_pins.run_checks(tmp_path) == "scripts/test.sh"
    assert calls == [["bash", "scripts/setup.sh"], ["bash", "scripts/test.sh"]]
