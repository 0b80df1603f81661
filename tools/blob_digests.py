"""SHA-256 of every Kiln blob that KilnPartitioner makes for the fixture modules and the bench zoo.

A refactor of the builder, the format or the lowering that must not change behaviour is checked
by running this before and after and comparing the two files byte for byte:

    .venv/bin/python tools/blob_digests.py --out before.json   # on the old commit
    .venv/bin/python tools/blob_digests.py --out after.json    # on the new one
    cmp before.json after.json

Each program is exported in every precision and both I/O placements, plus the dynamic-batch MLP
(a variant set) and the KV-cache decoder (state); the digest covers the whole delegate payload.
"""
import argparse
import hashlib
import json
import sys
import tempfile
from pathlib import Path

import torch

root = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(root / "python"), str(root / "bench"), str(root / "tests" / "python")]

from kiln_executorch.aot import export, read_delegates  # noqa: E402

import model_zoo  # noqa: E402
import models  # noqa: E402

PRECISIONS = ("fp32", "tf32", "fp16", "bf16")


def programs():
    """(name, module, inputs, export kwargs) for every program whose blobs are compared."""
    for key in model_zoo.ZOO:
        module, inputs = model_zoo.build(key)
        yield key, module, inputs, {}
    kv = models.kv_cache_decode()
    yield "kv_cache_decode", kv.module, kv.inputs, {}
    mlp = models.mlp()
    batch = torch.export.Dim("batch", min=1, max=16)
    yield "dynamic_mlp", mlp.module, mlp.inputs, {"dynamic_shapes": ({0: batch},)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--keys", help="comma list of program names (default: all)")
    args = parser.parse_args()
    keys = set(args.keys.split(",")) if args.keys else None
    digests = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, module, inputs, extra in programs():
            if keys and name not in keys:
                continue
            for precision in PRECISIONS:
                for resident in (False, True):
                    label = f"{name}/{precision}/{'device' if resident else 'host'}"
                    path = Path(tmp) / "p.pte"
                    export(module, inputs, str(path), precision=precision, device_resident=resident,
                           **extra)
                    digests[label] = [hashlib.sha256(d.data).hexdigest() for d in read_delegates(path)]
                    print(label, len(digests[label]), "blob(s)", flush=True)
    args.out.write_text(json.dumps(digests, indent=1, sort_keys=True) + "\n")
    print(f"{len(digests)} programs, {sum(map(len, digests.values()))} blobs -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
