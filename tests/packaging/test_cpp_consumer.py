"""examples/cpp_consumer builds from the installed Kiln (three lines of CMake) and runs; its link
keeps the backend library although nothing in the app references it."""
from __future__ import annotations

import importlib.util
import subprocess
from pathlib import Path

import pytest

from conftest import REPO, build_example, run

ET_ROOT = Path(list(importlib.util.find_spec("executorch").submodule_search_locations)[0])
KILN_ROOT = ET_ROOT.parent / "kiln_executorch"


@pytest.fixture(scope="module")
def consumer(tmp_path_factory) -> Path:
    assert (KILN_ROOT / "lib" / "cmake" / "kiln_executorch").is_dir(), \
        f"{KILN_ROOT} has no CMake package: scripts/setup.sh installs the kiln_executorch wheel"
    build = build_example("cpp_consumer", tmp_path_factory.mktemp("consumer"), ET_ROOT.parent)
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
