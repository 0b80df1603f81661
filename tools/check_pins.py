#!/usr/bin/env python3
"""Checks that the installed packages are exactly the ones pins.txt names.

Run by scripts/setup.sh after installing and by the tests. For executorch it also compares the
version the wheel recorded in its own sources (executorch.version.__version__, local label such as
"+cpu" dropped) so a wheel rebuilt from other sources under the same name is caught.
"""
from __future__ import annotations

import importlib.metadata as md
import re
import sys
from pathlib import Path

PINS = Path(__file__).resolve().parents[1] / "pins.txt"


def read_pins(path: Path = PINS) -> dict[str, str]:
    """Returns {package: version} for every `name==version` line of the pin file."""
    pins = {}
    for raw in path.read_text().splitlines():
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        m = re.fullmatch(r"([A-Za-z0-9_.\-]+)==([A-Za-z0-9_.+\-]+)", line)
        if not m:
            raise ValueError(f"{path}: not an exact pin (name==version): {raw!r}")
        pins[m.group(1).lower()] = m.group(2)
    return pins


HEADERS_ONLY = "# headers-only"


def header_only_pins(path: Path = PINS) -> dict[str, str]:
    """The pins whose line ends in `# headers-only`: packages used only for their C/C++ headers,
    installed without their Python dependencies into .venv/opt/<name> (header_dir)."""
    pins = read_pins(path)
    names = [raw.split("==", 1)[0].strip().lower() for raw in path.read_text().splitlines()
             if raw.split("#", 1)[0].strip() and HEADERS_ONLY in raw]
    return {n: pins[n] for n in names}


def header_dir(name: str, venv: Path = PINS.parent / ".venv") -> Path:
    return venv / "opt" / name


def installed_version(name: str, headers_only: bool) -> str:
    """Raises PackageNotFoundError when the package is absent."""
    if not headers_only:
        return md.version(name)
    for dist in md.distributions(path=[str(header_dir(name))]):
        if (dist.metadata["Name"] or "").lower() == name:
            return dist.version
    raise md.PackageNotFoundError(name)


def problems(pins: dict[str, str]) -> list[str]:
    found = []
    headers = header_only_pins()
    for name, want in pins.items():
        try:
            have = installed_version(name, name in headers)
        except md.PackageNotFoundError:
            found.append(f"{name}: not installed (pins.txt wants {want}); run scripts/setup.sh")
            continue
        if have.split("+")[0] != want:
            found.append(f"{name}: installed {have}, pins.txt wants {want}; run scripts/setup.sh")
    if "executorch" in pins:
        try:
            from executorch import version as et_version
            recorded = et_version.__version__.split("+")[0]
            if recorded != pins["executorch"]:
                found.append(f"executorch: the wheel records source version {et_version.__version__}, "
                             f"pins.txt wants {pins['executorch']}")
        except ImportError as e:
            found.append(f"executorch: cannot read executorch.version ({e})")
    return found


# A version stated for one of the pinned runtime packages anywhere but pins.txt: the package name
# followed by a comparison operator or a space and then a dotted version number.
STRAY = re.compile(r"\b(executorch|torch)\s*(==|>=|<=|~=|!=|\s)\s*v?\d+\.\d+", re.IGNORECASE)


def stray_pins(root: Path, files: list[Path]) -> list[str]:
    """Lines outside pins.txt that state an executorch or torch version."""
    found = []
    for f in files:
        if f.resolve() == (root / "pins.txt").resolve() or not f.is_file():
            continue
        try:
            text = f.read_text()
        except (UnicodeDecodeError, OSError):
            continue
        for n, line in enumerate(text.splitlines(), 1):
            if STRAY.search(line):
                found.append(f"{f.relative_to(root)}:{n}: {line.strip()}")
    return found


def main() -> int:
    bad = problems(read_pins())
    for p in bad:
        print(f"check_pins: {p}", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
