"""Exports the program of the profile check: one forward with two Kiln delegates (a CPU cumsum
between them), each of several ops, so `kiln_runner --profile` has two engines to report.

    export_profile.py --out DIR

DIR gets model.pte, input_0.bin and expected_0.bin (raw little-endian float32, the expected one
from eager PyTorch on the CPU) and manifest.json. check_profile.py runs it on the GPU machine;
tests/gpu_e2e/test_export_profile.py checks what this writes.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from kiln_executorch.aot import export, read_delegates

SHAPE = (16, 64)


class TwoDelegates(torch.nn.Module):
    """layer_norm -> linear -> relu -> linear | cumsum (CPU) | linear -> tanh -> softmax."""

    def __init__(self):
        super().__init__()
        self.norm = torch.nn.LayerNorm(64)
        self.a = torch.nn.Linear(64, 256)
        self.b = torch.nn.Linear(256, 64)
        self.c = torch.nn.Linear(64, 32)

    def forward(self, x):
        y = self.b(torch.relu(self.a(self.norm(x))))
        y = torch.cumsum(y, dim=-1)
        return torch.softmax(torch.tanh(self.c(y)), dim=-1)


def write(t: torch.Tensor, path: Path) -> dict:
    path.write_bytes(t.detach().contiguous().numpy().tobytes())
    return {"file": path.name, "shape": list(t.shape), "dtype": str(t.dtype).replace("torch.", "")}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    module = TwoDelegates().eval()
    x = torch.randn(*SHAPE, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        y = module(x)
    pte = args.out / "model.pte"
    export(module, (torch.zeros(*SHAPE),), pte, precision="fp32",
           exclude_ops=[torch.ops.aten.cumsum.default])  # the CPU op between the two delegates
    kiln = [d for d in read_delegates(pte) if d.backend_id == "KilnBackend"]
    if len(kiln) != 2:
        print(f"export profile: {len(kiln)} Kiln delegates, want 2", file=sys.stderr)
        return 1
    manifest = {"pte": pte.name, "kiln_delegates": len(kiln),
                "input": write(x, args.out / "input_0.bin"),
                "expected": write(y, args.out / "expected_0.bin")}
    (args.out / "manifest.json").write_text(json.dumps(manifest, indent=1))
    print(f"export profile: {len(kiln)} Kiln delegates")
    return 0


if __name__ == "__main__":
    sys.exit(main())
