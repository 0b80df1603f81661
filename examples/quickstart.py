"""The main job: export a small PyTorch module with Kiln's partitioner, run the program with the
reference runner (kiln_runner) on the GPU, and check its answer against eager PyTorch with
kiln-verify. On a machine without a usable NVIDIA GPU it still exports and inspects the program,
then says why it could not run it there."""
from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]


class SmallMlp(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(64, 128)
        self.fc2 = torch.nn.Linear(128, 16)

    def forward(self, x):
        return self.fc2(torch.nn.functional.gelu(self.fc1(x)))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=REPO / "build" / "examples" / "quickstart")
    ap.add_argument("--precision", default="fp32", choices=["fp32", "tf32", "fp16", "bf16"])
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)

    import kiln_executorch.aot as kiln

    torch.manual_seed(0)
    model = SmallMlp().eval()
    x = torch.ones(4, 64)
    pte = kiln.export(model, (x,), args.out / "small_mlp.pte", precision=args.precision)
    delegates = [d for d in kiln.read_delegates(pte) if d.backend_id == "KilnBackend"]
    operators = {op for ops in kiln.read_operators(pte).values() for op in ops}
    copies = sorted(op for op in operators if op.startswith("et_copy::"))
    outside = sorted(operators - set(copies))
    print(f"exported {pte}: {len(delegates)} KilnBackend partition(s), operators left on the CPU: "
          f"{outside or 'none'}; host/device copies: {copies or 'none'}")

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
        if "KilnBackend is not available" in run.stderr or "no usable CUDA device" in run.stderr:
            print("quickstart: exported and inspected the program, but this machine cannot run "
                  "KilnBackend (reason above); run this command on a machine with an NVIDIA GPU of "
                  "compute capability 9.0 or newer.")
            return 0
        return run.returncode
    atol = 1e-4 if args.precision == "fp32" else 5e-2
    verify = subprocess.run([sys.executable, str(REPO / "tools" / "kiln_verify.py"), "--expected",
                             str(expected), "--atol", str(atol)], input=run.stdout, text=True)
    return verify.returncode


if __name__ == "__main__":
    sys.exit(main())
