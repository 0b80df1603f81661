"""The shipped artifacts have the shape a user's process needs, read off the built files
(readelf/nm), printing what was seen when a check fails."""
from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from conftest import BUILD, REPO, require

INSTALL = BUILD / "install" / "kiln_executorch"
LIBS = ["libkiln_executorch_backend.so", "libkiln_device_copy_kernels.so", "libkiln_builder.so"]


def sh(*cmd) -> str:
    return subprocess.run([str(c) for c in cmd], capture_output=True, text=True, check=True).stdout


def dynamic(lib: Path) -> str:
    return sh("readelf", "-d", "-W", lib)


def executorch_lib_dir() -> Path:
    import importlib.util

    return Path(list(importlib.util.find_spec("executorch").submodule_search_locations)[0]) / "lib"


def max_versions(lib: Path) -> dict[str, tuple]:
    """Highest GLIBCXX_ / CXXABI_ version a library requires from libstdc++."""
    out = sh("readelf", "-V", "-W", lib)
    best: dict[str, tuple] = {}
    for prefix, ver in re.findall(r"\b(GLIBCXX|CXXABI)_(\d+(?:\.\d+)*)\b", out):
        v = tuple(int(x) for x in ver.split("."))
        best[prefix] = max(best.get(prefix, ()), v)
    return best


@pytest.fixture(scope="module", params=LIBS)
def lib(request) -> Path:
    return require(INSTALL / "lib" / request.param, "run scripts/setup.sh (it installs the build there)")


def test_soname_is_the_file_name(lib):
    d = dynamic(lib)
    assert f"Library soname: [{lib.name}]" in d, d


def test_runpath_not_rpath_and_origin_relative(lib):
    d = dynamic(lib)
    assert "(RPATH)" not in d, f"DT_RPATH present:\n{d}"
    m = re.search(r"\(RUNPATH\)\s+Library runpath: \[(.*)\]", d)
    assert m, f"no DT_RUNPATH:\n{d}"
    entries = m.group(1).split(":")
    assert all(e.startswith("$ORIGIN") for e in entries), f"non-relative RUNPATH entries: {entries}"
    assert "$ORIGIN/../../executorch/lib" in entries, entries


def test_no_python_extension_symbols(lib):
    defined = sh("nm", "-D", "--defined-only", lib)
    assert "PyInit_" not in defined


def test_libstdcxx_dynamic_and_not_newer_than_executorch(lib):
    assert "Shared library: [libstdc++.so.6]" in dynamic(lib) or "GLIBCXX" not in sh("readelf", "-V", "-W", lib)
    ours, theirs = max_versions(lib), max_versions(executorch_lib_dir() / "libexecutorch.so")
    for prefix, v in ours.items():
        assert v <= theirs.get(prefix, ()), (f"{lib.name} needs {prefix}_{'.'.join(map(str, v))}, "
                                             f"libexecutorch.so only {prefix}_{'.'.join(map(str, theirs.get(prefix, ())))}")


def test_executorch_runtime_is_imported_not_defined():
    lib = require(INSTALL / "lib" / LIBS[0], "run scripts/setup.sh")
    undefined = sh("nm", "-D", "-C", "--undefined-only", lib)
    defined = sh("nm", "-D", "-C", "--defined-only", lib)
    assert "executorch::runtime::register_backend" in undefined, undefined[:2000]
    assert "executorch::runtime::" not in defined, [l for l in defined.splitlines() if "executorch::runtime" in l][:10]
    assert "Shared library: [libexecutorch.so]" in dynamic(lib)


def test_backend_exports_only_its_c_api():
    lib = require(INSTALL / "lib" / LIBS[0], "run scripts/setup.sh")
    names = {l.split()[-1] for l in sh("nm", "-D", "--defined-only", lib).splitlines() if " T " in l}
    assert names == {"kiln_executorch_backend_registered", "kiln_executorch_version",
                     "kiln_executorch_built_against", "kiln_executorch_weight_bytes",
                     "kiln_executorch_weight_allocated_bytes",
                     "kiln_executorch_weight_requested_bytes",
                     "kiln_executorch_activation_bytes", "kiln_executorch_set_stream",
                     "kiln_executorch_current_stream", "kiln_executorch_copy_counters",
                     "kiln_executorch_set_profiling", "kiln_executorch_reset_profile",
                     "kiln_executorch_profile_report", "kiln_executorch_profile_total_ms"}, names


def test_builder_exports_only_its_c_api_and_needs_no_cuda():
    lib = require(INSTALL / "lib" / "libkiln_builder.so", "run scripts/setup.sh")
    names = {l.split()[-1] for l in sh("nm", "-D", "--defined-only", lib).splitlines() if " T " in l}
    assert names == {"kiln_builder_api_version", "kiln_builder_build_blob",
                     "kiln_builder_build_variant_set", "kiln_builder_format_description",
                     "kiln_builder_free"}, names
    needed = re.findall(r"\(NEEDED\)\s+Shared library: \[(.*)\]", dynamic(lib))
    assert "libexecutorch.so" in needed, needed
    assert not [n for n in needed if re.search(r"cuda|cublas|cudnn|nvrtc", n)], needed
    defined = sh("nm", "-D", "-C", "--defined-only", lib)
    assert "executorch::runtime::" not in defined


def test_installed_layout_and_cmake_package():
    for rel in ["lib/libkiln_executorch_backend.so", "lib/libkiln_device_copy_kernels.so", "bin/kiln_runner",
                "lib/libkiln_builder.so", "include/kiln/builder.h",
                "lib/cmake/kiln_executorch/kiln_executorch-config.cmake",
                "lib/cmake/kiln_executorch/kiln_executorch-config-version.cmake",
                "include/kiln/executorch/stream.h", "include/kiln/executorch/stats.h",
                "include/kiln/executorch/version.h", "include/kiln/executorch/api.h"]:
        require(INSTALL / rel, "run scripts/setup.sh")
    for f in (INSTALL / "lib" / "cmake" / "kiln_executorch").iterdir():
        text = f.read_text()
        assert str(REPO) not in text and str(BUILD) not in text, f"{f} holds an absolute build path"


def test_runpath_resolves_in_the_installed_venv_layout():
    site = executorch_lib_dir().parents[1]
    lib = require(site / "kiln_executorch" / "lib" / LIBS[0], "setup.sh installs the wheel into .venv")
    out = sh("ldd", lib)
    m = re.search(r"libexecutorch\.so => (\S+)", out)
    assert m and Path(m.group(1)).resolve() == (executorch_lib_dir() / "libexecutorch.so").resolve(), out


def test_installed_runner_links_the_xnnpack_delegate_with_relative_runpath():
    # kiln_runner keeps the wheel's XNNPACK delegate (nothing references it: --no-as-needed) and
    # finds it where it finds libexecutorch.so, through the same $ORIGIN-relative RUNPATH.
    exe = require(INSTALL / "bin" / "kiln_runner", "run scripts/setup.sh")
    d = dynamic(exe)
    needed = re.findall(r"\(NEEDED\)\s+Shared library: \[(.*)\]", d)
    for lib in ["libexecutorch.so", "libexecutorch_kernels_optimized.so", "libexecutorch_backend_xnnpack.so",
                "libkiln_executorch_backend.so"]:
        assert lib in needed, f"{lib} not NEEDED by kiln_runner: {needed}"
    assert "(RPATH)" not in d, f"DT_RPATH present:\n{d}"
    m = re.search(r"\(RUNPATH\)\s+Library runpath: \[(.*)\]", d)
    assert m, f"no DT_RUNPATH:\n{d}"
    entries = m.group(1).split(":")
    assert all(e.startswith("$ORIGIN") for e in entries), f"non-relative RUNPATH entries: {entries}"
    assert "$ORIGIN/../lib" in entries and "$ORIGIN/../../executorch/lib" in entries, entries


def test_installed_runner_resolves_every_library_in_the_wheel_layout(tmp_path):
    # The install tree placed beside the executorch (and nvidia) packages, as the wheel installs it:
    # every NEEDED library of the runner resolves, the executorch ones from the executorch package.
    site = executorch_lib_dir().parents[1]
    exe = require(INSTALL / "bin" / "kiln_runner", "run scripts/setup.sh")
    root = tmp_path / "kiln_executorch"
    (root / "bin").mkdir(parents=True)
    (root / "lib").mkdir()
    (root / "bin" / "kiln_runner").write_bytes(exe.read_bytes())
    (root / "bin" / "kiln_runner").chmod(0o755)
    for lib in LIBS:
        (root / "lib" / lib).write_bytes((INSTALL / "lib" / lib).read_bytes())
    for pkg in ["executorch", "nvidia"]:
        if (site / pkg).exists():
            (tmp_path / pkg).symlink_to(site / pkg)
    out = sh("ldd", root / "bin" / "kiln_runner")
    assert "not found" not in out, out
    for lib in ["libexecutorch.so", "libexecutorch_backend_xnnpack.so", "libexecutorch_kernels_optimized.so"]:
        m = re.search(rf"{re.escape(lib)} => (\S+)", out)
        assert m and Path(m.group(1)).resolve() == (executorch_lib_dir() / lib).resolve(), out
    m = re.search(r"libkiln_executorch_backend\.so => (\S+)", out)
    assert m and Path(m.group(1)).resolve().parent == (root / "lib").resolve(), out
