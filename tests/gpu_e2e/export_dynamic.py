"""Exports the bounded-dynamic programs that check_dynamic.py runs on the GPU machine.

    export_dynamic.py --out DIR

Writes into DIR: mlp_fp32.pte and mlp_bf16.pte (the fixture MLP, Linear(256,512)-ReLU-Linear(512,10),
batch dynamic 1..16) and block_fp32.pte (a pre-norm attention + GELU MLP block, sequence dynamic
1..32), each entirely one Kiln delegate holding a variant set; for each program the input and the
eager PyTorch (CPU, float64 rounded to float32) output at the smallest, a middle and the largest
size, as raw little-endian float32 .bin files; and cases.json describing every run (program,
--shape, files, tolerance) plus one size past the bound per program, which must fail cleanly.
"""

import argparse
import copy
import json
import sys
from pathlib import Path

import torch
from torch import nn

from kiln_executorch.aot import export, read_delegates, read_operators

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python"))
import models  # noqa: E402  (tests/python/models.py)

Dim = torch.export.Dim


def mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 10)).eval()


def block():
    return models.PreNormBlock(32, 128)


# name: (module, example input, dynamic dim, bound, sizes checked, precision, tolerance)
PROGRAMS = {
    "mlp_fp32": (mlp, (4, 256), 0, (1, 16), (1, 7, 16), "fp32", {"atol": 1e-4, "rtol": 1e-4}),
    "mlp_bf16": (mlp, (4, 256), 0, (1, 16), (1, 7, 16), "bf16", {"atol": 0.0, "rel_max": 2e-2}),
    "block_fp32": (block, (1, 8, 32), 1, (1, 32), (1, 13, 32), "fp32",
                   {"atol": 1e-4, "rtol": 1e-4}),
}


def shape_at(example, dim, size):
    shape = list(example)
    shape[dim] = size
    return shape


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, type=Path)
    args = parser.parse_args()
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    cases = []
    for name, (make, example, dim, (low, high), sizes, precision, tol) in PROGRAMS.items():
        module = make()
        pte = out / f"{name}.pte"
        export(module, (torch.randn(*example),), pte, precision=precision,
               dynamic_shapes=({dim: Dim(f"{name}_d", min=low, max=high)},))
        delegates = read_delegates(pte)
        assert [d.backend_id for d in delegates] == ["KilnBackend"], delegates
        assert read_operators(pte, device_copies=False)["forward"] == [], read_operators(pte)
        reference = copy.deepcopy(module).double()
        for size in sizes:
            shape = shape_at(example, dim, size)
            x = torch.randn(*shape, generator=torch.Generator().manual_seed(size))
            with torch.no_grad():
                y = reference(x.double()).float()
            stem = f"{name}_{size}"
            (out / f"{stem}_input_0.bin").write_bytes(x.numpy().tobytes())
            (out / f"{stem}_expected_0.bin").write_bytes(y.numpy().tobytes())
            cases.append({"name": stem, "program": pte.name, "shape": shape,
                          "input": f"{stem}_input_0.bin", "expected": f"{stem}_expected_0.bin",
                          "expected_shape": list(y.shape), "tolerance": tol})
        past = shape_at(example, dim, high + 1)
        stem = f"{name}_past_bound"
        (out / f"{stem}_input_0.bin").write_bytes(torch.ones(*past).numpy().tobytes())
        cases.append({"name": stem, "program": pte.name, "shape": past,
                      "input": f"{stem}_input_0.bin", "must_fail": True})
    (out / "cases.json").write_text(json.dumps(cases, indent=1))
    print(f"wrote {len(PROGRAMS)} programs and {len(cases)} cases to {out}")


if __name__ == "__main__":
    main()
