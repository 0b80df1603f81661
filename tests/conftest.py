"""Shared paths and helpers for the pytest suites. Everything a test needs must be there: a missing
build, fixture folder or tool is a failure that says how to get it, never a skip."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
BUILD = Path(os.environ.get("KILN_BUILD_DIR", REPO / "build"))
FIXTURES = Path(os.environ.get("KILN_FIXTURES", REPO.parent / "shared" / "fixtures"))
TOOLS = REPO / "tools"
sys.path.insert(0, str(TOOLS))


def require(path: Path, how: str) -> Path:
    if not path.exists():
        pytest.fail(f"{path} is missing: {how}")
    return path


@pytest.fixture(scope="session")
def runner() -> Path:
    return require(BUILD / "runner" / "kiln_runner", "run scripts/setup.sh to build it")


@pytest.fixture(scope="session")
def fixtures() -> Path:
    return require(FIXTURES, "the shared fixtures folder must sit beside the repository (../shared/fixtures)")


def run(cmd: list, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([str(c) for c in cmd], capture_output=True, text=True, errors="replace", timeout=300, **kw)
