"""The main job: export a small PyTorch module with ExecuTorch, run it with kiln_runner, and check
the runner's answer against eager PyTorch with kiln-verify."""
from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import torch
from executorch.exir import to_edge_transform_and_lower

REPO = Path(__file__).resolve().parents[1]


class SmallMlp(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(64, 128)
        self.fc2 = torch.nn.Linear(128, 16)

    def forward(self, x):
        return self.fc2(torch.nn.functional.gelu(self.fc1(x)))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", type=Path, default=REPO / "build" / "examples" / "quickstart")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)

    torch.manual_seed(0)
    model = SmallMlp().eval()
    x = torch.ones(4, 64)
    program = to_edge_transform_and_lower(torch.export.export(model, (x,))).to_executorch()
    pte = args.out / "small_mlp.pte"
    pte.write_bytes(program.buffer)

    with torch.no_grad():
        y = model(x)
    expected = args.out / "small_mlp.expected"
    expected.write_text("[" + ",".join(map(str, y.shape)) + "]\n"
                        + " ".join(f"{v:.6g}" for v in y.flatten()[:8].tolist()) + "\n")

    runner = REPO / "build" / "runner" / "kiln_runner"
    run = subprocess.run([str(runner), str(pte)], capture_output=True, text=True)
    sys.stdout.write(run.stdout)
    if run.returncode != 0:
        sys.stderr.write(run.stderr)
        return run.returncode
    verify = subprocess.run([sys.executable, str(REPO / "tools" / "kiln_verify.py"), "--expected",
                             str(expected), "--atol", "1e-4"], input=run.stdout, text=True)
    return verify.returncode


if __name__ == "__main__":
    sys.exit(main())
