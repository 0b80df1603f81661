"""Shared paths and helpers for the pytest suites. Everything a test needs must be there: a missing
build, fixture folder or tool is a failure that says how to get it, never a skip."""
from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
BUILD = Path(os.environ.get("KILN_BUILD_DIR", REPO / "build"))
FIXTURES = Path(os.environ.get("KILN_FIXTURES", REPO.parent / "shared" / "fixtures"))
TOOLS = REPO / "tools"
INSTALL = BUILD / "install" / "kiln_executorch"
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


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """The installed tree in the wheel's layout: kiln_executorch beside executorch (and the
    nvidia-* libraries), so the library's RUNPATH resolves."""
    require(INSTALL / "include" / "kiln" / "executorch" / "stream.h",
            "cmake --install build --prefix build/install/kiln_executorch (scripts/setup.sh does it)")
    packages = Path(list(importlib.util.find_spec("executorch").submodule_search_locations)[0]).parent
    root = tmp_path_factory.mktemp("site")
    shutil.copytree(INSTALL, root / "kiln_executorch", symlinks=True)
    for name in ("executorch", "nvidia"):
        if (packages / name).exists():
            (root / name).symlink_to(packages / name)
    return root


def run(cmd: list, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([str(c) for c in cmd], capture_output=True, text=True, errors="replace", timeout=300, **kw)


CMAKE = Path(shutil.which("cmake", path=str(REPO / ".venv" / "bin")) or "cmake")


def build_example(name: str, build_dir: Path, site: Path) -> Path:
    """Configures and builds examples/<name> as an application would: against the
    kiln_executorch and executorch packages installed side by side in `site`. Fails the test
    with CMake's output if either step fails; returns `build_dir`."""
    prefix = f"{site / 'kiln_executorch'};{site / 'executorch' / 'lib' / 'cmake' / 'executorch'}"
    cfg = run([CMAKE, "-S", REPO / "examples" / name, "-B", build_dir, "-G", "Ninja",
               f"-DCMAKE_MAKE_PROGRAM={REPO / '.venv' / 'bin' / 'ninja'}", f"-DCMAKE_PREFIX_PATH={prefix}"])
    assert cfg.returncode == 0, cfg.stdout + cfg.stderr
    b = run([CMAKE, "--build", build_dir])
    assert b.returncode == 0, b.stdout + b.stderr
    return build_dir
