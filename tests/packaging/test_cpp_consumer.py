"""examples/cpp_consumer builds from the installed Kiln (three lines of CMake) and runs; its link
keeps the backend library although nothing in the app references it."""
from __future__ import annotations

import importlib.util
import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import REPO, run

ET_ROOT = Path(list(importlib.util.find_spec("executorch").submodule_search_locations)[0])
KILN_ROOT = ET_ROOT.parent / "kiln_executorch"
CMAKE = Path(shutil.which("cmake", path=str(REPO / ".venv" / "bin")) or "cmake")


@pytest.fixture(scope="module")
def consumer(tmp_path_factory) -> Path:
    assert (KILN_ROOT / "lib" / "cmake" / "kiln_executorch").is_dir(), \
        f"{KILN_ROOT} has no CMake package: scripts/setup.sh installs the kiln_executorch wheel"
    build = tmp_path_factory.mktemp("consumer")
    prefix = f"{KILN_ROOT};{ET_ROOT / 'lib' / 'cmake' / 'executorch'}"
    cfg = run([CMAKE, "-S", REPO / "examples" / "cpp_consumer", "-B", build, "-G", "Ninja",
               f"-DCMAKE_MAKE_PROGRAM={REPO / '.venv' / 'bin' / 'ninja'}", f"-DCMAKE_PREFIX_PATH={prefix}"])
    assert cfg.returncode == 0, cfg.stdout + cfg.stderr
    b = run([CMAKE, "--build", build])
    assert b.returncode == 0, b.stdout + b.stderr
    return build / "consumer"


def test_cmakelists_is_three_lines_of_kiln(consumer):
    text = (REPO / "examples" / "cpp_consumer" / "CMakeLists.txt").read_text()
    assert "find_package(executorch CONFIG REQUIRED)" in text
    assert "find_package(kiln_executorch CONFIG REQUIRED)" in text
    assert text.count("target_link_libraries") == 1


def test_backend_is_registered_in_the_app(consumer):
    r = run([consumer, "--check"])
    assert r.returncode == 0 and "KilnBackend registered: yes" in r.stdout, r.stdout + r.stderr


def test_app_runs_a_program(consumer, fixtures):
    r = run([consumer, fixtures / "add_one" / "model.pte"])
    assert r.returncode == 0, r.stderr
    assert "first=2 2 2 2 2 2 2 2" in r.stdout, r.stdout


def test_backend_library_survives_the_link(consumer):
    needed = subprocess.run(["readelf", "-d", consumer], capture_output=True, text=True).stdout
    assert "[libkiln_executorch_backend.so]" in needed, needed


def test_plain_as_needed_link_would_drop_the_backend(tmp_path):
    # The negative control for the wrapping: an app that references no Kiln symbol, linked the
    # default way with --as-needed, loses the library (and with it the registration).
    main = tmp_path / "main.cpp"
    main.write_text("int main() { return 0; }\n")
    lib = KILN_ROOT / "lib" / "libkiln_executorch_backend.so"
    plain, wrapped = tmp_path / "plain", tmp_path / "wrapped"
    subprocess.run(["g++", main, "-o", plain, "-Wl,--as-needed", lib], check=True)
    subprocess.run(["g++", main, "-o", wrapped, f"-Wl,--push-state,--no-as-needed,{lib},--pop-state"], check=True)
    needed = lambda exe: subprocess.run(["readelf", "-d", exe], capture_output=True, text=True).stdout
    assert "libkiln_executorch_backend.so" not in needed(plain)
    assert "libkiln_executorch_backend.so" in needed(wrapped)
