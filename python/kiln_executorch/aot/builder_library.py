"""Finding and loading libkiln_builder.so, the C++ AOT builder (builder/include/kiln/builder.h).

Separate from builder.py so that blob_format.py can read the format description from the same
library (kiln_builder_format_description) before anything else of the AOT side is imported.
The library is found at KILN_BUILDER_LIBRARY, else in the package's lib/ (installed wheel), else in
the source checkout's build tree (KILN_BUILD_DIR or <repo>/build). There is no Python fallback: a
missing library raises.
"""
from __future__ import annotations

import ctypes
import os
from pathlib import Path

from .. import _native_library

LIBRARY_NAME = "libkiln_builder.so"
API_VERSION = 2

_PACKAGE = Path(__file__).resolve().parents[1]


def library_path() -> Path:
    """KILN_BUILDER_LIBRARY, else the package's lib/ (installed wheel), else the source build tree
    (KILN_BUILD_DIR, default <repo>/build)."""
    build = Path(os.environ.get("KILN_BUILD_DIR") or _PACKAGE.parents[1] / "build")
    return _native_library(LIBRARY_NAME, "KILN_BUILDER_LIBRARY", build / "builder" / LIBRARY_NAME)


_lib = None


def load(use_cache: bool = True):
    """The loaded library, its functions typed; raises RuntimeError when it is missing.
    use_cache=False looks for it again (library_path() may have changed)."""
    global _lib
    if use_cache and _lib is not None:
        return _lib
    path = library_path()
    if not path.exists():
        where = ("KILN_BUILDER_LIBRARY points at it" if os.environ.get("KILN_BUILDER_LIBRARY")
                 else "the package's lib/ and the source build tree were searched")
        raise RuntimeError(
            f"kiln_executorch: the AOT builder library {path} is missing ({where}); reinstall "
            "the kiln_executorch wheel, or in a source checkout build it with "
            "`cmake --build build --target kiln_builder` (scripts/setup.sh builds everything)")
    try:
        # Its only dependency beyond libstdc++ is the executorch wheel's libexecutorch.so (the
        # blob reader's log), found through the library's RUNPATH.
        lib = ctypes.CDLL(str(path))
    except OSError as e:
        raise RuntimeError(f"kiln_executorch: loading the AOT builder {path} failed: {e}") from e
    lib.kiln_builder_api_version.restype = ctypes.c_uint32
    version = lib.kiln_builder_api_version()
    if version != API_VERSION:
        raise RuntimeError(f"kiln_executorch: {path} has builder API version {version}, this "
                           f"package needs {API_VERSION}; rebuild or reinstall them together")
    out = [ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_size_t), ctypes.c_char_p,
           ctypes.c_size_t]
    lib.kiln_builder_build_blob.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_uint32] + out
    lib.kiln_builder_build_blob.restype = ctypes.c_int
    lib.kiln_builder_build_variant_set.argtypes = [
        ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_size_t), ctypes.c_size_t,
        ctypes.c_uint32] + out
    lib.kiln_builder_build_variant_set.restype = ctypes.c_int
    lib.kiln_builder_format_description.argtypes = []
    lib.kiln_builder_format_description.restype = ctypes.c_char_p
    lib.kiln_builder_free.argtypes = [ctypes.c_void_p]
    lib.kiln_builder_free.restype = None
    _lib = lib
    return lib


def format_description() -> dict:
    """The engine blob format as the library defines it (kiln_builder_format_description)."""
    import json
    text = load().kiln_builder_format_description()
    if text is None:
        raise RuntimeError("kiln_executorch: the AOT builder could not describe its format")
    return json.loads(text.decode())
