#!/usr/bin/env python3
"""Builds the kiln_executorch wheel from the Python sources and a `cmake --install` tree.

The wheel is tagged py3-none-linux_x86_64: it carries no Python extension, only the backend
library (loaded with ctypes), the device-copy kernels library, the reference runner and the CMake
package, laid out as site-packages/kiln_executorch/{lib,lib/cmake/kiln_executorch,bin}. Its
dependency on executorch is the exact version pins.txt names.

    build_wheel.py --install-dir build/install/kiln_executorch --out dist
"""
from __future__ import annotations

import argparse
import base64
import hashlib
import sys
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tools"))
import check_pins  # noqa: E402

TAG = "py3-none-linux_x86_64"


def version() -> str:
    for line in (REPO / "python" / "kiln_executorch" / "__init__.py").read_text().splitlines():
        if line.startswith("__version__"):
            return line.split("=", 1)[1].strip().strip('"')
    raise SystemExit("build_wheel: no __version__ in python/kiln_executorch/__init__.py")


def record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--install-dir", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    for name in ("libkiln_executorch_backend.so", "libkiln_builder.so"):
        lib = args.install_dir / "lib" / name
        if not lib.exists():
            raise SystemExit(f"build_wheel: {lib} is missing; run cmake --install first")

    ver = version()
    et_pin = check_pins.read_pins()["executorch"]
    dist_info = f"kiln_executorch-{ver}.dist-info"
    files: dict[str, bytes] = {}
    for src in sorted((REPO / "python" / "kiln_executorch").rglob("*.py")):
        files[f"kiln_executorch/{src.relative_to(REPO / 'python' / 'kiln_executorch')}"] = src.read_bytes()
    modes: dict[str, int] = {}
    for src in sorted(p for p in args.install_dir.rglob("*") if p.is_file()):
        name = f"kiln_executorch/{src.relative_to(args.install_dir)}"
        files[name] = src.read_bytes()
        modes[name] = src.stat().st_mode & 0o777
    files[f"{dist_info}/METADATA"] = (
        f"Metadata-Version: 2.1\nName: kiln_executorch\nVersion: {ver}\n"
        "Summary: Kiln, a GPU delegate for ExecuTorch\n"
        f"Requires-Python: >=3.10\nRequires-Dist: executorch=={et_pin}\n").encode()
    files[f"{dist_info}/WHEEL"] = (
        f"Wheel-Version: 1.0\nGenerator: kiln build_wheel.py\nRoot-Is-Purelib: false\nTag: {TAG}\n").encode()
    record = [record_line(n, d) for n, d in files.items()] + [f"{dist_info}/RECORD,,"]
    files[f"{dist_info}/RECORD"] = ("\n".join(record) + "\n").encode()

    args.out.mkdir(parents=True, exist_ok=True)
    wheel = args.out / f"kiln_executorch-{ver}-{TAG}.whl"
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as z:
        for name, data in files.items():
            info = zipfile.ZipInfo(name, date_time=(2020, 1, 1, 0, 0, 0))
            info.external_attr = (modes.get(name, 0o644) | 0o100000) << 16
            info.compress_type = zipfile.ZIP_DEFLATED
            z.writestr(info, data)
    print(wheel)
    return 0


if __name__ == "__main__":
    sys.exit(main())
