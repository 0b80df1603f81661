"""`import kiln_executorch` registers KilnBackend with the executorch runtime of the process, on any
machine; the skip switch and every failed load behave as documented; the wheel installs into a
fresh virtual environment."""
from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path


from conftest import BUILD

REGISTERED = ("from executorch.runtime import Runtime; "
              "print(sorted(Runtime.get().backend_registry.registered_backend_names))")


def python(code: str, env_extra: dict | None = None, exe: str = sys.executable) -> subprocess.CompletedProcess:
    # No PYTHONPATH: the package under test is the wheel installed in the environment.
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "KILN_SKIP_DELEGATE_REGISTRATION",
                                                            "KILN_BACKEND_LIBRARY")}
    env.update(env_extra or {})
    return subprocess.run([exe, "-c", code], capture_output=True, text=True, env=env, cwd="/", timeout=300)


def wheel() -> Path:
    found = sorted((BUILD / "dist").glob("kiln_executorch-*.whl"))
    assert found, f"no wheel in {BUILD / 'dist'}: run scripts/setup.sh"
    return found[-1]


def test_import_registers_kiln_backend():
    r = python("import kiln_executorch; assert kiln_executorch.registered(); " + REGISTERED)
    assert r.returncode == 0, r.stderr
    assert "'KilnBackend'" in r.stdout, r.stdout


def test_import_uses_the_installed_wheel_and_matching_executorch():
    r = python("import kiln_executorch, executorch.version as v; print(kiln_executorch.__file__); "
               "print(kiln_executorch.built_against(), v.__version__)")
    assert r.returncode == 0, r.stderr
    path, versions = r.stdout.splitlines()[:2]
    assert "site-packages" in path, path
    built, have = versions.split()
    assert built.split("+")[0] == have.split("+")[0]


def test_skip_switch_imports_without_registering():
    r = python("import kiln_executorch; assert not kiln_executorch.registered(); " + REGISTERED,
               {"KILN_SKIP_DELEGATE_REGISTRATION": "1"})
    assert r.returncode == 0, r.stderr
    assert "KilnBackend" not in r.stdout


def test_missing_library_is_an_import_error_naming_it(tmp_path):
    r = python("import kiln_executorch", {"KILN_BACKEND_LIBRARY": str(tmp_path / "gone.so")})
    assert r.returncode != 0
    assert "ImportError" in r.stderr and "gone.so is missing" in r.stderr, r.stderr


def test_unloadable_library_is_an_import_error_with_the_loader_text(tmp_path):
    bad = tmp_path / "libkiln_executorch_backend.so"
    bad.write_bytes(b"not an ELF file" * 10)
    r = python("import kiln_executorch", {"KILN_BACKEND_LIBRARY": str(bad)})
    assert r.returncode != 0
    assert "ImportError" in r.stderr and "loading" in r.stderr and "failed" in r.stderr, r.stderr


def test_library_of_another_abi_is_an_import_error(tmp_path):
    # A library that needs a symbol this process's libexecutorch.so does not have.
    src = tmp_path / "other.cpp"
    src.write_text('extern "C" void executorch_symbol_from_another_version();\n'
                   'extern "C" void f() { executorch_symbol_from_another_version(); }\n')
    lib = tmp_path / "libother.so"
    subprocess.run(["g++", "-shared", "-fPIC", "-o", lib, src], check=True)
    r = python("import kiln_executorch", {"KILN_BACKEND_LIBRARY": str(lib)})
    assert r.returncode != 0
    assert "do not match the executorch runtime" in r.stderr and "undefined symbol" in r.stderr, r.stderr


def test_wheel_is_tagged_without_python_abi_and_carries_the_library_and_cmake_package():
    w = wheel()
    assert w.name.endswith("-py3-none-linux_x86_64.whl"), w.name
    names = zipfile.ZipFile(w).namelist()
    for want in ["kiln_executorch/__init__.py", "kiln_executorch/lib/libkiln_executorch_backend.so",
                 "kiln_executorch/lib/libkiln_device_copy_kernels.so",
                 "kiln_executorch/lib/libkiln_builder.so", "kiln_executorch/include/kiln/builder.h",
                 "kiln_executorch/include/kiln/executorch/stats.h",
                 "kiln_executorch/include/kiln/executorch/version.h",
                 "kiln_executorch/include/kiln/executorch/api.h",
                 "kiln_executorch/aot/builder.py",
                 "kiln_executorch/lib/cmake/kiln_executorch/kiln_executorch-config.cmake"]:
        assert want in names, f"{want} not in {w.name}"
    meta = zipfile.ZipFile(w).read(next(n for n in names if n.endswith("METADATA"))).decode()
    assert "Requires-Dist: executorch==" in meta


def test_wheel_ships_the_operator_table_but_not_the_test_helpers():
    whl = zipfile.ZipFile(wheel())
    names = whl.namelist()
    assert "kiln_executorch/aot/ops/__init__.py" in names
    # The reference interpreter and the Python blob reader (python/kiln_testing) are for tests and
    # tools only, and nothing shipped imports them.
    assert not [n for n in names if "kiln_testing" in n or n.endswith(("reference.py",
                                                                          "blob_reader.py"))]
    assert not [n for n in names if n.endswith(".py") and b"kiln_testing" in whl.read(n)]


def test_wheel_installs_into_a_fresh_venv_and_imports(tmp_path):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", venv], check=True)
    # The fresh environment sees executorch and torch from the project's environment through a .pth
    # file (installing them again would download gigabytes); kiln_executorch comes from the wheel.
    site = next((venv / "lib").glob("python3*/site-packages"))
    (site / "project.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    r = subprocess.run([venv / "bin" / "python", "-m", "pip", "install", "-q", "--no-deps", "--no-index",
                        "--ignore-installed", wheel()],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    r = python("import kiln_executorch; print(kiln_executorch.__file__); " + REGISTERED,
               exe=str(venv / "bin" / "python"))
    assert r.returncode == 0, r.stderr
    assert str(site) in r.stdout and "'KilnBackend'" in r.stdout, r.stdout


def test_executorch_runtime_runs_or_cleanly_refuses_a_kiln_program(tmp_path):
    # After the import, executorch.runtime sees KilnBackend: on a GPU machine the program runs and
    # matches eager; without a usable GPU the backend reports itself unavailable and loading the
    # method fails with an exception, never a crash.
    code = f"""
import torch, kiln_executorch
from kiln_executorch.aot import export
from executorch.runtime import Runtime
torch.manual_seed(0)
m = torch.nn.Sequential(torch.nn.Linear(16, 8), torch.nn.ReLU()).eval()
x = torch.randn(2, 16)
export(m, (x,), {str(tmp_path / 'lin.pte')!r})
rt = Runtime.get()
available = rt.backend_registry.is_available("KilnBackend")
print("available", available)
program = rt.load_program({str(tmp_path / 'lin.pte')!r})
try:
    y = program.load_method("forward").execute([x])[0]
    print("max_err", float((y - m(x)).abs().max()))
except Exception as e:
    print("refused", type(e).__name__)
"""
    r = python(code)
    assert r.returncode == 0, r.stderr
    if "available True" in r.stdout:
        err = float(r.stdout.split("max_err")[1])
        assert err < 1e-4, r.stdout
    else:
        assert "refused" in r.stdout, r.stdout
        assert "KilnBackend is not available" in r.stderr, r.stderr
