"""Kiln, a GPU delegate for ExecuTorch.

Importing this package registers KilnBackend with the ExecuTorch runtime the Python process uses
(the pinned executorch wheel's ``libexecutorch.so``): it loads ``lib/libkiln_executorch_backend.so``
with RTLD_GLOBAL, whose static initializer does the registration. There is nothing to call.

``KILN_SKIP_DELEGATE_REGISTRATION=1`` imports the package without loading the library (for
exporting on a machine that will not run programs). A load that cannot complete raises ImportError
naming the cause; a machine without a GPU is not one (KilnBackend then reports itself unavailable
and programs that use it fail to load with a log line saying why).
"""
from __future__ import annotations

import ctypes
import importlib.metadata
import os
from pathlib import Path

__all__ = ["library_path", "registered", "__version__", "built_against", "device_memory"]

_PACKAGE = Path(__file__).resolve().parent
_LIBRARY_NAME = "libkiln_executorch_backend.so"
_library: ctypes.CDLL | None = None


def _native_library(name: str, override_env: str, source_build: Path) -> Path:
    """One of Kiln's native libraries: `override_env` when set, else inside the package (installed
    wheel), else `source_build` when it exists (a source checkout), else the packaged path (whose
    absence the caller reports)."""
    override = os.environ.get(override_env)
    if override:
        return Path(override)
    packaged = _PACKAGE / "lib" / name
    if packaged.exists() or not source_build.exists():
        return packaged
    return source_build


def library_path() -> Path:
    """Where the backend library is: inside the package (installed wheel), or, when running from a
    source checkout, the build tree (KILN_BACKEND_LIBRARY overrides both)."""
    return _native_library(_LIBRARY_NAME, "KILN_BACKEND_LIBRARY",
                           _PACKAGE.parents[1] / "build" / "runtime" / "backend" / _LIBRARY_NAME)


def _executorch_version() -> str:
    try:
        from executorch import version

        return version.__version__
    except ImportError:
        return importlib.metadata.version("executorch")


def _load() -> ctypes.CDLL:
    path = library_path()
    if not path.exists():
        raise ImportError(f"kiln_executorch: the backend library {path} is missing; reinstall the "
                          "kiln_executorch wheel (or build the source tree with scripts/setup.sh)")
    try:
        # executorch's runtime first, so libexecutorch.so is the one already in the process and
        # the backend registers with it rather than with a second copy.
        import executorch.runtime  # noqa: F401
    except ImportError as e:
        raise ImportError(f"kiln_executorch: cannot import executorch.runtime ({e}); install the "
                          "executorch version Kiln was built against") from e
    try:
        lib = ctypes.CDLL(str(path), mode=os.RTLD_NOW | os.RTLD_GLOBAL)
    except OSError as e:
        text = str(e)
        if "libexecutorch" in text:
            cause = "libexecutorch.so was not found next to the executorch package"
        elif "undefined symbol" in text or "version" in text:
            cause = ("its symbols do not match the executorch runtime in this process (another "
                     "executorch version or an ABI mismatch)")
        else:
            cause = "the dynamic loader refused it"
        raise ImportError(f"kiln_executorch: loading {path} failed: {cause}: {text}") from e
    lib.kiln_executorch_built_against.restype = ctypes.c_char_p
    lib.kiln_executorch_version.restype = ctypes.c_char_p
    built = lib.kiln_executorch_built_against().decode()
    have = _executorch_version()
    if built.split("+")[0] != have.split("+")[0]:
        raise ImportError(f"kiln_executorch: {path.name} was built against executorch {built}, but "
                          f"executorch {have} is installed; install executorch {built.split('+')[0]} "
                          "or a Kiln built for this version")
    if lib.kiln_executorch_backend_registered() != 1:
        raise ImportError(f"kiln_executorch: {path.name} loaded but KilnBackend did not register "
                          "(see the log above: is a second copy of the library loaded?)")
    return lib


def registered() -> bool:
    """True when this process has loaded the backend library and KilnBackend is registered."""
    return _library is not None


def built_against() -> str | None:
    """The executorch version the loaded backend library was compiled against."""
    return _library.kiln_executorch_built_against().decode() if _library else None


_MEMORY_COUNTERS = ("weight_bytes", "weight_allocated_bytes", "weight_requested_bytes",
                    "activation_bytes")


def device_memory() -> dict | None:
    """Device memory Kiln holds in this process, in bytes (see runtime/backend/version.h):
    weight_bytes (each weight tensor once, however many methods or programs share it),
    weight_allocated_bytes, weight_requested_bytes (what the delegates would hold without
    sharing) and activation_bytes. None when the backend library is not loaded."""
    if _library is None:
        return None
    counters = {}
    for name in _MEMORY_COUNTERS:
        fn = getattr(_library, f"kiln_executorch_{name}")
        fn.restype = ctypes.c_uint64
        counters[name] = int(fn())
    return counters


__version__ = "0.1.0"

if os.environ.get("KILN_SKIP_DELEGATE_REGISTRATION", "") not in ("1", "true", "yes"):
    _library = _load()
