"""How close Kiln gets to the GPU's limits on the feed-forward block of a transformer,
Linear(1024, 4096) -> GELU -> Linear(4096, 1024), in bf16, device-resident:

- memory-bound batches (64 .. 1024): the bytes the block must move at least (weights, input,
  output, the hidden activation written and read once) over Kiln's time per execute, against the
  device-to-device copy bandwidth measured in the same run;
- compute-bound batch (8192): its matrix FLOPs over Kiln's time, against the bf16 matrix rate
  torch.matmul reaches on 8192^3 in the same run.

    roofline.py export --out DIR                                  (here, no GPU: the programs)
    roofline.py run --models DIR --runner kiln_runner --out DIR   (the GPU machine)

Kiln's time per execute is `kiln_runner --device-timing`: the GPU span between CUDA events around
one execute on the caller's stream. Each program's output (all-ones input) is checked against the
same module in torch on the GPU. Writes DIR/roofline.json and prints the table.
"""
from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_run import time_cuda  # noqa: E402  (the same CUDA-event timing as the zoo's references)

D_MODEL, HIDDEN = 1024, 4096
MEMORY_BOUND = [64, 256, 1024]
COMPUTE_BOUND = [8192]


def ffn() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(D_MODEL, HIDDEN), nn.GELU(), nn.Linear(HIDDEN, D_MODEL)).eval()


def export(out: Path) -> int:
    from kiln_executorch.aot import export as kiln_export

    out.mkdir(parents=True, exist_ok=True)
    module = ffn().to(torch.bfloat16)
    for batch in MEMORY_BOUND + COMPUTE_BOUND:
        x = torch.ones(batch, D_MODEL, dtype=torch.bfloat16)
        path = out / f"ffn_b{batch}.pte"
        kiln_export(module, (x,), path, precision="bf16", device_resident=True)
        print(f"export {path.name}: {path.stat().st_size} bytes")
    return 0


def run(models: Path, runner: Path, out: Path, iterations: int) -> int:
    dev = torch.device("cuda")
    n = 1 << 30
    src, dst = torch.empty(n, dtype=torch.uint8, device=dev), torch.empty(n, dtype=torch.uint8, device=dev)
    copy_ms = time_cuda(lambda: dst.copy_(src), 20)
    bandwidth = 2 * n / (copy_ms * 1e-3)  # bytes read + written per second
    del src, dst
    a = torch.randn(8192, 8192, dtype=torch.bfloat16, device=dev)
    b = torch.randn(8192, 8192, dtype=torch.bfloat16, device=dev)
    mm_ms = time_cuda(lambda: a @ b, 20)
    matrix_rate = 2 * 8192 ** 3 / (mm_ms * 1e-3)
    del a, b
    print(f"device-to-device copy: {bandwidth / 1e12:.3f} TB/s; bf16 matrix rate (8192^3): "
          f"{matrix_rate / 1e12:.1f} TFLOP/s")

    module = ffn().to(dev, torch.bfloat16)
    weight_bytes = sum(p.numel() * p.element_size() for p in module.parameters())
    rows, failed = [], 0
    for batch in MEMORY_BOUND + COMPUTE_BOUND:
        pte = models / f"ffn_b{batch}.pte"
        with tempfile.TemporaryDirectory() as tmp:
            r = subprocess.run([str(runner), str(pte), "--iterations", "5", "--device-timing", str(iterations),
                                "--output-dir", tmp, "--values", "0"],
                               capture_output=True, text=True, errors="replace", timeout=300)
            if r.returncode != 0:
                print(f"ffn batch {batch}: kiln_runner failed:\n{(r.stderr or r.stdout)[-2000:]}")
                failed += 1
                continue
            got = torch.frombuffer(bytearray((Path(tmp) / "output_0.bin").read_bytes()),
                                   dtype=torch.bfloat16).reshape(batch, D_MODEL).float()
        span = float(re.search(r"event_span_ms median=([\d.]+)", r.stdout).group(1))
        b2b = float(re.search(r"back_to_back_ms_per_execute=([\d.]+)", r.stdout).group(1))
        x = torch.ones(batch, D_MODEL, dtype=torch.bfloat16, device=dev)
        with torch.inference_mode():
            want = module(x).float().cpu()
            eager_ms = time_cuda(lambda: module(x), 50)
        rel = float((got - want).abs().max() / want.abs().max())
        ok = rel <= 2e-2
        failed += not ok
        moved = weight_bytes + 2 * batch * D_MODEL * 2 + 2 * batch * HIDDEN * 2
        flops = 2 * batch * D_MODEL * HIDDEN * 2
        row = {"batch": batch, "kiln_ms": span, "kiln_back_to_back_ms": b2b, "torch_eager_ms": eager_ms,
               "max_rel_error": rel, "pass": ok, "bytes": moved, "flops": flops,
               "bandwidth_share": moved / (span * 1e-3) / bandwidth,
               "matrix_rate_share": flops / (span * 1e-3) / matrix_rate,
               "bound": "memory" if batch in MEMORY_BOUND else "compute"}
        row["target_met"] = (row["bandwidth_share"] >= 0.70 if row["bound"] == "memory"
                             else row["matrix_rate_share"] >= 0.60)
        rows.append(row)
    out.mkdir(parents=True, exist_ok=True)
    (out / "roofline.json").write_text(json.dumps(
        {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
         "copy_bandwidth_bytes_per_s": bandwidth, "bf16_matrix_flops_per_s": matrix_rate,
         "rows": rows}, indent=1))
    print("\nbatch  bound    kiln_ms  torch_eager_ms  max_rel_err  share_of_copy_bw  share_of_bf16_rate  target")
    for r in rows:
        target = ">= 70% of copy bandwidth" if r["bound"] == "memory" else ">= 60% of matrix rate"
        print(f"{r['batch']:5d}  {r['bound']:7s} {r['kiln_ms']:8.4f}  {r['torch_eager_ms']:14.4f}  "
              f"{r['max_rel_error']:11.2e}  {100 * r['bandwidth_share']:15.1f}%  "
              f"{100 * r['matrix_rate_share']:17.1f}%  {target}: {'met' if r['target_met'] else 'NOT met'}")
    return 1 if failed else 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    e = sub.add_parser("export")
    e.add_argument("--out", type=Path, required=True)
    r = sub.add_parser("run")
    r.add_argument("--models", type=Path, required=True)
    r.add_argument("--runner", type=Path, required=True)
    r.add_argument("--out", type=Path, required=True)
    r.add_argument("--iterations", type=int, default=200)
    args = ap.parse_args()
    if args.cmd == "export":
        return export(args.out)
    return run(args.models, args.runner, args.out, args.iterations)


if __name__ == "__main__":
    sys.exit(main())
