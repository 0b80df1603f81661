"""Packs a GPU-check staging folder into bundles that each fit one transfer to the GPU machine:

    bundle.py --stage DIR --prefix .gpu/stage [--limit-mib 60] [--max-keys 2]

The staging folder holds site/ (the install tree and runtime libraries: every bundle gets it),
models/ (programs, inputs and expected outputs of each model, and manifest.json) and the rest
(GPU test binaries, end-to-end and roofline programs: the first bundle only). Each part is
compressed once as its own xz stream of a tar archive; a bundle is the concatenation of streams,
which is itself a valid .tar.xz (read it with `tarfile.open(path, ignore_zeros=True)` or
`tar --ignore-zeros -xJf`). Models go into bundles whole (all their programs together), greedily
in manifest order, until the next would pass the size limit or the bundle holds --max-keys models
(each run on the GPU machine has a time limit too); each bundle gets a manifest of its own
models. One bundle is written as PREFIX.tar.xz, more as PREFIX-1.tar.xz, PREFIX-2.tar.xz, ...
Prints one line per bundle: its path, size and models.
"""
from __future__ import annotations

import argparse
import io
import json
import lzma
import sys
import tarfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

MIB = 2**20
# One xz stream with a dictionary larger than any program: the device-resident copy of a program
# (and the tf32 copy of an fp32 one) repeats its weights, and a window that reaches back to the
# first copy stores them once. Files go in name order, so the copies of a model sit together.
# (No larger than the input: a smaller window is much faster to set up.)
MAX_DICT = 192 * MIB


def xz_tar(files: list, root: Path, extra: dict | None = None) -> bytes:
    """One xz stream of a tar archive of `files` (paths under `root`, stored relative to it) and
    `extra` (archive name -> bytes)."""
    buf = io.BytesIO()
    total = sum(f.stat().st_size for f in files if f.is_file()) + sum(map(len, (extra or {}).values()))
    # Preset 3 with preset 6's binary-tree match finder and the longest nice length: on the
    # programs' tiled weights as small as preset 6 (80 MB -> 0.07 vs 0.06 MB) in 0.6x its time.
    filters = [{"id": lzma.FILTER_LZMA2, "preset": 3, "mf": lzma.MF_BT4, "nice_len": 273,
                "dict_size": max(MIB, min(MAX_DICT, total))}]
    with lzma.open(buf, "wb", format=lzma.FORMAT_XZ, filters=filters) as xz, \
            tarfile.open(fileobj=xz, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for f in sorted(files):
            tar.add(f, arcname=str(f.relative_to(root)), recursive=False)
        for name, data in (extra or {}).items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def _tree(path: Path) -> list:
    return [path] + sorted(path.rglob("*")) if path.exists() else []


def model_files(models: Path, key: str, manifest: list) -> list:
    """Every file of `key`'s manifest entries (programs, inputs, outputs)."""
    names = set()
    for e in manifest:
        if e["key"] == key:
            names.update(n for n in (e["pte"], e.get("pte_device_resident")) if n)
            names.update(s["file"] for s in e["inputs"] + e["outputs"])
    return [models / n for n in sorted(names)]


def plan(sizes: dict, fixed: int, first_extra: int, limit: int, max_keys: int) -> list:
    """Groups the keys of `sizes` (key -> compressed bytes, in order) into bundles: each bundle
    costs `fixed` (+ `first_extra` for the first) plus its keys. A key too large for any bundle
    gets one of its own (and the caller reports it)."""
    bundles, current, used = [], [], fixed + first_extra
    for key, size in sizes.items():
        if current and (used + size > limit or len(current) >= max_keys):
            bundles.append(current)
            current, used = [], fixed
        current.append(key)
        used += size
    if current or not bundles:
        bundles.append(current)
    return bundles


def pack(stage: Path, prefix: Path, limit: int, max_keys: int) -> list:
    """Writes the bundles; returns [(path, bytes, keys)]."""
    prefix.parent.mkdir(parents=True, exist_ok=True)
    models = stage / "models"
    manifest = json.loads((models / "manifest.json").read_text()) if (models / "manifest.json").exists() else []
    keys = list(dict.fromkeys(e["key"] for e in manifest))
    site = xz_tar(_tree(stage / "site"), stage)
    rest = [p for p in sorted(stage.iterdir()) if p.name not in ("site", "models")]
    extras = xz_tar([f for p in rest for f in _tree(p)], stage)
    # Two models at a time (lzma compresses outside the GIL): xz takes ~4 MB/s a core here.
    with ThreadPoolExecutor(2) as pool:
        packed = pool.map(lambda key: xz_tar(model_files(models, key, manifest), stage), keys)
        parts = {}
        for key, data in zip(keys, packed):
            parts[key] = data
            print(f"bundle: {key} packs to {len(data) / MIB:.1f} MiB", flush=True)
    groups = plan({k: len(v) for k, v in parts.items()}, len(site) + 4096, len(extras), limit, max_keys)
    for old in list(prefix.parent.glob(prefix.name + ".tar.xz")) + list(prefix.parent.glob(prefix.name + "-*.tar.xz")):
        old.unlink()
    written = []
    for i, group in enumerate(groups):
        path = prefix.with_name(prefix.name + (f"-{i + 1}" if len(groups) > 1 else "") + ".tar.xz")
        own = json.dumps([e for e in manifest if e["key"] in group], indent=1).encode()
        with open(path, "wb") as f:
            f.write(site)
            if i == 0:
                f.write(extras)
            for key in group:
                f.write(parts[key])
            f.write(xz_tar([], stage, {"models/manifest.json": own}))
        written.append((path, path.stat().st_size, group))
    return written


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--stage", type=Path, required=True)
    ap.add_argument("--prefix", type=Path, required=True, help="bundle path without .tar.xz")
    ap.add_argument("--limit-mib", type=float, default=60)
    ap.add_argument("--max-keys", type=int, default=1000)
    args = ap.parse_args()
    limit = int(args.limit_mib * MIB)
    status = 0
    for path, size, keys in pack(args.stage, args.prefix, limit, args.max_keys):
        over = size > limit
        status |= over
        print(f"{path} {size / MIB:.1f} MiB {','.join(keys) or '-'}"
              + (f"  OVER THE {args.limit_mib:g} MiB LIMIT" if over else ""))
    return status


if __name__ == "__main__":
    sys.exit(main())
