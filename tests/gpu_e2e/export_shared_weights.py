"""Exports a two-method program whose methods share one nn.Linear, for check_shared_weights.py.

`forward(x) = gelu(shared(x))` and `encode(x) = proj(tanh(shared(x)))` are lowered together with
KilnPartitioner, so each method gets its own Kiln delegate and each blob carries its own copy of
`shared`'s weight and bias. At run time Kiln's device weight cache should keep one copy.

Writes into --out DIR:
  shared_weights.pte     the program
  x.bin                  the input of both methods (float32, little-endian, row-major)
  forward.expected.bin   eager outputs (float32)
  encode.expected.bin
  weights.txt            the same weight numbers as `name bytes` lines, for the C++ test
  meta.json              shapes, and the weight bytes Kiln should hold on the device: `expected`
                         (each distinct weight tensor of both blobs once) and `unshared` (the sum
                         over both blobs, what Kiln would hold without sharing)
"""

import argparse
import hashlib
import json
import os
from pathlib import Path

os.environ.setdefault("KILN_SKIP_DELEGATE_REGISTRATION", "1")  # exporting needs no GPU

import torch  # noqa: E402

from kiln_executorch.aot import export, read_delegates  # noqa: E402
from kiln_executorch.aot.blob_format import Storage  # noqa: E402
from kiln_testing.blob_reader import read_blob  # noqa: E402

IN_FEATURES, HIDDEN, OUT_FEATURES, BATCH = 512, 1024, 128, 4


class Forward(torch.nn.Module):
    def __init__(self, shared):
        super().__init__()
        self.shared = shared

    def forward(self, x):
        return torch.nn.functional.gelu(self.shared(x))


class Encode(torch.nn.Module):
    def __init__(self, shared, proj):
        super().__init__()
        self.shared = shared
        self.proj = proj

    def forward(self, x):
        return self.proj(torch.tanh(self.shared(x)))


def build():
    torch.manual_seed(0)
    shared = torch.nn.Linear(IN_FEATURES, HIDDEN)
    proj = torch.nn.Linear(HIDDEN, OUT_FEATURES)
    methods = {"forward": Forward(shared).eval(), "encode": Encode(shared, proj).eval()}
    x = torch.randn(BATCH, IN_FEATURES)
    return methods, x, shared, proj


def param_bytes(module):
    return sum(p.numel() * p.element_size() for p in module.parameters())


def weight_tensors(pte_path):
    """{method: [(sha256, nbytes) of each kWeight tensor of its Kiln delegates]}"""
    found = {}
    for d in read_delegates(pte_path):
        if d.backend_id != "KilnBackend":
            continue
        graph = read_blob(d.data)
        found.setdefault(d.method, []).extend(
            (hashlib.sha256(t.data.contiguous().view(torch.uint8).numpy().tobytes()).hexdigest(),
             t.nbytes)
            for t in graph.tensors if t.storage == Storage.WEIGHT and t.nbytes > 0)
    return found


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, type=Path)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)

    methods, x, shared, proj = build()
    pte = args.out / "shared_weights.pte"
    export(methods, {"forward": (x,), "encode": (x,)}, pte, precision="fp32")
    with torch.no_grad():
        expected = {name: m(x) for name, m in methods.items()}
    (args.out / "x.bin").write_bytes(x.numpy().tobytes())
    for name, y in expected.items():
        (args.out / f"{name}.expected.bin").write_bytes(y.contiguous().numpy().tobytes())

    tensors = weight_tensors(pte)
    distinct = {digest: n for per_method in tensors.values() for digest, n in per_method}
    meta = {
        "pte": pte.name,
        "input": {"file": "x.bin", "shape": list(x.shape), "dtype": "float32"},
        "methods": {name: {"expected": f"{name}.expected.bin", "shape": list(y.shape)}
                    for name, y in expected.items()},
        "weight_bytes": {
            "expected": sum(distinct.values()),
            "forward_only": sum(dict(tensors["forward"]).values()),
            "unshared": sum(n for per_method in tensors.values() for _, n in per_method),
            "shared_linear": param_bytes(shared),
            "proj": param_bytes(proj),
        },
        "pte_bytes": pte.stat().st_size,
    }
    (args.out / "weights.txt").write_text(
        "".join(f"{k} {v}\n" for k, v in meta["weight_bytes"].items()))
    (args.out / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")
    print(json.dumps(meta["weight_bytes"]), f"pte {meta['pte_bytes']} bytes")


if __name__ == "__main__":
    main()
