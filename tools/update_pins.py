#!/usr/bin/env python3
"""Moves pins.txt to the newest executorch release, with the torch and torchvision it pairs with.

Asks the package index (through the venv's pip: `pip index versions`) for the newest final
executorch release. When it is newer than the pinned one, rewrites the executorch, torch and
torchvision lines of pins.txt (and the version numbers in their comments), then runs
scripts/setup.sh and scripts/test.sh; when a check fails, pins.txt is put back as it was and the
exit status is non-zero. When nothing is newer, nothing changes and it says so.

Pairing (the rule, since the executorch wheel's metadata names no torch version today):
- torch: if the new executorch wheel's metadata (read with `pip install --dry-run --report`, which
  fetches only metadata) requires torch with an upper bound or an exact version, the newest torch
  release that satisfies it. Otherwise the newest torch release on the line ExecuTorch's release
  is built against: for executorch 1.x that is torch 2.(x + 9) (every pairing seen so far, from
  the 1.2 release to the 1.5 release, follows it); a lower-bound-only requirement must then also
  hold. Another executorch major has no rule: the tool stops and asks for the pin by hand.
- torchvision: the newest release of the line built for that torch, torchvision 0.(m + 15) for
  torch 2.m (the rule every torchvision release has followed since torch reached 2.x); when its
  metadata requires torch, the chosen torch must satisfy it.
Only final releases count (no rc, dev, post or local versions). A newer torch or torchvision
patch alone does not move anything: the executorch release drives the update.

Usage (with the project's venv, which has pip and packaging):
  .venv/bin/python tools/update_pins.py [--dry-run] [--no-check] [--pins PATH]
--dry-run prints what would change and changes nothing; --no-check rewrites pins.txt without
running setup and the tests. --fake-index FILE (JSON: {"versions": {package: [...]}, "requires":
{"package==version": ["torch>=...", ...]}}) answers the look-ups instead of the index, for tests.
"""
from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Callable, Optional

try:
    from packaging.requirements import Requirement
    from packaging.version import Version
except ImportError:  # the venv always has pip, which vendors packaging
    from pip._vendor.packaging.requirements import Requirement
    from pip._vendor.packaging.version import Version

REPO = Path(__file__).resolve().parents[1]
PINS = REPO / "pins.txt"
VENV_PYTHON = REPO / ".venv" / "bin" / "python"
PIN_LINE = re.compile(r"^(?P<name>[A-Za-z0-9_.\-]+)==(?P<version>[A-Za-z0-9_.+\-]+)(?P<rest>\s*(#.*)?)$")
RELEASE = re.compile(r"^\d+(\.\d+)*$")


class PinError(Exception):
    """The update cannot be planned; the message says why and what to do."""


# --- The package index ------------------------------------------------------------------------

class PipIndex:
    """Look-ups through the venv's pip: the index and find-links that setup.sh installs from."""

    def __init__(self, python: Path = VENV_PYTHON):
        self.python = python

    def versions(self, package: str) -> list[str]:
        out = subprocess.run([str(self.python), "-m", "pip", "index", "versions", package,
                              "--disable-pip-version-check"],
                             capture_output=True, text=True, timeout=300)
        m = re.search(r"^Available versions:\s*(.+)$", out.stdout, re.MULTILINE)
        if out.returncode != 0 or not m:
            raise PinError(f"`pip index versions {package}` failed: "
                           f"{(out.stderr or out.stdout).strip()[-500:]}")
        return [v.strip() for v in m.group(1).split(",") if v.strip()]

    def requires(self, package: str, version: str) -> list[str]:
        """Requires-Dist of package==version, from its metadata (no install)."""
        with tempfile.TemporaryDirectory() as tmp:
            report = Path(tmp) / "report.json"
            out = subprocess.run([str(self.python), "-m", "pip", "install", "--dry-run", "--no-deps",
                                  "--ignore-installed", "--quiet", "--disable-pip-version-check",
                                  "--report", str(report), f"{package}=={version}"],
                                 capture_output=True, text=True, timeout=600)
            if out.returncode != 0 or not report.is_file():
                raise PinError(f"cannot read the metadata of {package}=={version}: "
                               f"{out.stderr.strip()[-500:]}")
            items = json.loads(report.read_text()).get("install", [])
        return [r for item in items for r in item.get("metadata", {}).get("requires_dist", [])]


class FakeIndex:
    """Answers from a dict (tests): {"versions": {pkg: [...]}, "requires": {"pkg==v": [...]}}."""

    def __init__(self, data: dict):
        self.data = data

    def versions(self, package: str) -> list[str]:
        return list(self.data.get("versions", {}).get(package, []))

    def requires(self, package: str, version: str) -> list[str]:
        return list(self.data.get("requires", {}).get(f"{package}=={version}", []))


# --- Planning ---------------------------------------------------------------------------------

def releases(versions: list[str]) -> list[Version]:
    """Final releases only, newest first."""
    return sorted((Version(v) for v in versions if RELEASE.match(v)), reverse=True)


def requirement_on(requires: list[str], name: str) -> Optional[Requirement]:
    for raw in requires:
        req = Requirement(raw)
        if req.name.lower() == name and (req.marker is None or req.marker.evaluate({"extra": ""})):
            return req
    return None


def bounded_above(req: Requirement) -> bool:
    return any(s.operator in ("==", "===", "~=", "<", "<=") for s in req.specifier)


def pick_torch(executorch: Version, torch_versions: list[str], requires: list[str]) -> Version:
    candidates = releases(torch_versions)
    req = requirement_on(requires, "torch")
    if req is not None:
        candidates = [v for v in candidates if req.specifier.contains(v, prereleases=False)]
        if bounded_above(req):
            if not candidates:
                raise PinError(f"no torch release on the index satisfies executorch {executorch}'s "
                               f"requirement `{req}`")
            return candidates[0]
    if executorch.major != 1:
        raise PinError(f"executorch {executorch}: no pairing rule for major version "
                       f"{executorch.major}; pin torch by hand")
    minor = executorch.minor + 9
    line = [v for v in candidates if v.major == 2 and v.minor == minor]
    if not line:
        raise PinError(f"executorch {executorch} pairs with the torch 2.{minor} line, but the index "
                       f"has no such release{f' satisfying `{req}`' if req else ''}")
    return line[0]


def pick_torchvision(torch: Version, versions: list[str], requires_of) -> Version:
    minor = torch.minor + 15
    line = [v for v in releases(versions) if v.major == 0 and v.minor == minor]
    if torch.major != 2 or not line:
        raise PinError(f"torch {torch} pairs with the torchvision 0.{minor} line, but the index has "
                       "no such release")
    req = requirement_on(requires_of(line[0]), "torch")
    if req is not None and not req.specifier.contains(torch, prereleases=False):
        raise PinError(f"torchvision {line[0]} requires `{req}`, which torch {torch} does not meet")
    return line[0]


def plan(pins: dict[str, str], index) -> dict[str, tuple[str, str]]:
    """{package: (pinned, new)} for every pin that moves; {} when executorch has nothing newer."""
    if "executorch" not in pins:
        raise PinError("pins.txt has no executorch pin")
    available = releases(index.versions("executorch"))
    if not available:
        raise PinError("the index lists no executorch release")
    newest, pinned = available[0], Version(pins["executorch"])
    if newest <= pinned:
        return {}
    torch = pick_torch(newest, index.versions("torch"), index.requires("executorch", str(newest)))
    changes = {"executorch": (pins["executorch"], str(newest)), "torch": (pins.get("torch", ""), str(torch))}
    if "torchvision" in pins:
        tv = pick_torchvision(torch, index.versions("torchvision"),
                              lambda v: index.requires("torchvision", str(v)))
        changes["torchvision"] = (pins["torchvision"], str(tv))
    return {name: (old, new) for name, (old, new) in changes.items() if old != new}


def read_pins(text: str) -> dict[str, str]:
    pins = {}
    for line in text.splitlines():
        m = PIN_LINE.match(line.strip())
        if m:
            pins[m.group("name").lower()] = m.group("version")
    return pins


def rewrite(text: str, changes: dict[str, tuple[str, str]]) -> str:
    """The pin file with each changed `name==old` line moved to `name==new`, and the versions its
    comments state for those packages (`<name> X.Y.Z`, and `<name> X.Y` for the release line)
    moved with them."""
    out = []
    for line in text.splitlines(keepends=True):
        m = PIN_LINE.match(line.rstrip("\r\n"))
        if m and m.group("name").lower() in changes:
            _, new = changes[m.group("name").lower()]
            line = f"{m.group('name')}=={new}{m.group('rest')}" + line[len(line.rstrip("\r\n")):]
        elif line.lstrip().startswith("#"):
            for name, (old, new) in changes.items():
                if not old:
                    continue
                old_line, new_line = ".".join(old.split(".")[:2]), ".".join(new.split(".")[:2])
                line = re.sub(rf"\b{re.escape(name)} {re.escape(old)}(?![\d.]*\d)", f"{name} {new}", line)
                line = re.sub(rf"\b{re.escape(name)} {re.escape(old_line)}(?![.\d])", f"{name} {new_line}",
                              line)
        out.append(line)
    return "".join(out)


# --- Main -------------------------------------------------------------------------------------

def run_checks(repo: Path) -> Optional[str]:
    """None when scripts/setup.sh and scripts/test.sh pass; otherwise which one failed."""
    for script in ("scripts/setup.sh", "scripts/test.sh"):
        print(f"update_pins: running bash {script}", flush=True)
        if subprocess.run(["bash", script], cwd=repo).returncode != 0:
            return script
    return None


def main(argv: Optional[list[str]] = None, index=None,
         checks: Callable[[Path], Optional[str]] = run_checks) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dry-run", action="store_true", help="print what would change; change nothing")
    parser.add_argument("--no-check", action="store_true", help="do not run setup.sh and test.sh")
    parser.add_argument("--pins", type=Path, default=PINS, help="the pin file (default: pins.txt)")
    parser.add_argument("--fake-index", type=Path, help="JSON answers instead of the index (tests)")
    args = parser.parse_args(argv)
    if index is None:
        index = FakeIndex(json.loads(args.fake_index.read_text())) if args.fake_index else PipIndex()

    text = args.pins.read_text()
    try:
        changes = plan(read_pins(text), index)
    except PinError as e:
        print(f"update_pins: error: {e}", file=sys.stderr)
        return 1
    if not changes:
        print(f"update_pins: executorch {read_pins(text)['executorch']} is the newest release on the "
              f"index; {args.pins.name} unchanged")
        return 0
    for name, (old, new) in changes.items():
        print(f"update_pins: {name} {old or '(unpinned)'} -> {new}")
    if args.dry_run:
        print(f"update_pins: dry run; {args.pins.name} unchanged")
        return 0
    args.pins.write_text(rewrite(text, changes))
    print(f"update_pins: rewrote {args.pins}")
    if args.no_check:
        return 0
    failed = checks(args.pins.resolve().parent)
    if failed is not None:
        args.pins.write_text(text)
        print(f"update_pins: error: {failed} failed with the new pins; {args.pins.name} is restored. "
              "Run scripts/setup.sh to reinstall the pinned versions, and move the pins by hand "
              "once the failure is understood.", file=sys.stderr)
        return 1
    print("update_pins: setup and tests pass with the new pins")
    return 0


if __name__ == "__main__":
    sys.exit(main())
