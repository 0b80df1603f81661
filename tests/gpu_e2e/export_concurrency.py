"""Exports the programs of the concurrency check: two Kiln-delegated programs that
program_threads_gpu_test runs from two threads at once, and one whose forward holds several Kiln
delegates with a CPU operator between them.

    export_concurrency.py --out DIR

DIR gets, per program NAME, NAME.pte, NAME_case<c>_input_<i>.bin and NAME_case<c>_expected_<o>.bin
(raw little-endian tensors, the expected ones from eager PyTorch on the CPU in fp32), and
manifest.json describing all of it. check_concurrency.py runs the C++ test over DIR on the GPU
machine; tests/gpu_e2e/test_export_concurrency.py checks what this writes.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from kiln_executorch.aot import export, read_delegates, read_operators

CASES = 4  # input sets per program: threads cycle through them, so a stale output shows


class Mlp(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(64, 96), torch.nn.ReLU(), torch.nn.Linear(96, 32))

    def forward(self, x):
        return self.net(x)


class Norm(torch.nn.Module):
    """layer_norm -> linear -> tanh -> softmax: different kernels from Mlp's."""

    def __init__(self):
        super().__init__()
        self.norm = torch.nn.LayerNorm(48)
        self.proj = torch.nn.Linear(48, 48)

    def forward(self, x):
        return torch.softmax(torch.tanh(self.proj(self.norm(x))), dim=-1)


class SeveralDelegates(torch.nn.Module):
    """relu -> linear | cumsum (left to ExecuTorch's CPU kernel by exclude_ops) | linear -> cos."""

    def __init__(self):
        super().__init__()
        self.first = torch.nn.Linear(32, 32)
        self.second = torch.nn.Linear(32, 16)

    def forward(self, x):
        y = self.first(torch.relu(x))
        y = torch.cumsum(y, dim=-1)
        return torch.cos(self.second(y))


# name -> (module class, input shape, Kiln delegates its forward must hold)
PROGRAMS = {
    "mlp": (Mlp, (8, 64), 1),
    "norm": (Norm, (4, 16, 48), 1),
    "several_delegates": (SeveralDelegates, (8, 32), 2),
}


def write(t: torch.Tensor, path: Path) -> dict:
    path.write_bytes(t.detach().contiguous().numpy().tobytes())
    return {"file": path.name, "shape": list(t.shape), "dtype": str(t.dtype).replace("torch.", "")}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    manifest = []
    for index, (name, (cls, shape, want_delegates)) in enumerate(PROGRAMS.items()):
        torch.manual_seed(index)
        module = cls().eval()
        cases = []
        for c in range(CASES):
            g = torch.Generator().manual_seed(100 * index + c)
            x = torch.randn(*shape, generator=g)
            with torch.no_grad():
                y = module(x)
            cases.append({"inputs": [write(x, args.out / f"{name}_case{c}_input_0.bin")],
                          "expected": [write(y, args.out / f"{name}_case{c}_expected_0.bin")]})
        pte = args.out / f"{name}.pte"
        export(module, (torch.zeros(*shape),), pte, precision="fp32",
               exclude_ops=[torch.ops.aten.cumsum.default])
        kiln = [d for d in read_delegates(pte) if d.backend_id == "KilnBackend"]
        outside = sorted(set(op for ops in read_operators(pte).values() for op in ops))
        if len(kiln) != want_delegates:
            print(f"export {name}: {len(kiln)} Kiln delegates, want {want_delegates}", file=sys.stderr)
            return 1
        manifest.append({"name": name, "pte": pte.name, "method": "forward", "kiln_delegates": len(kiln),
                         "ops_outside": outside, "cases": cases})
        print(f"export {name}: {len(kiln)} Kiln delegate(s), outside: {outside or '-'}, {CASES} cases")
    (args.out / "manifest.json").write_text(json.dumps(manifest, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
