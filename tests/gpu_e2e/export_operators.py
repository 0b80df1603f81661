"""Exports every operator case of tests/python/aot/test_operators.py (CASES: the same list the CPU
reference test runs) for check_operators.py, which runs them on the GPU machine, so one case is
an operator's CPU reference test and its GPU test at once.

    export_operators.py --out DIR [--cases NAME,...]

Writes into DIR, per case: NAME.pte (exported with KilnPartitioner, fp32, host I/O; the export
fails unless the program is one Kiln delegate with no operator left to ExecuTorch),
NAME_input_I.bin (raw little-endian inputs) and NAME_expected_J.bin (eager PyTorch's outputs; a
case with quantized weights: eager on its dequantized weights), and
manifest.json listing every case with its inputs' and outputs' dtypes and shapes.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from kiln_executorch.aot import export, read_delegates, read_operators

TESTS = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(TESTS / "python" / "aot"))
import test_operators  # noqa: E402  (CASES and build)

# numpy dtype names, for the check on a machine with numpy only; bfloat16 (which numpy lacks) is
# stored as its raw 16 bits and widened there.
NUMPY = {torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16",
         torch.int64: "int64", torch.int32: "int32", torch.int8: "int8", torch.uint8: "uint8",
         torch.bool: "bool"}


def save(t: torch.Tensor, path: Path) -> dict:
    t = t.detach().contiguous()
    if t.dtype not in NUMPY:
        raise SystemExit(f"export_operators: {path.name}: dtype {t.dtype} has no raw format here")
    raw = t.view(torch.int16) if t.dtype == torch.bfloat16 else t
    path.write_bytes(raw.numpy().tobytes())
    return {"file": path.name, "dtype": NUMPY[t.dtype], "shape": list(t.shape)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--cases", help="comma list of case names (default: all)")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    names = args.cases.split(",") if args.cases else list(test_operators.CASES)
    manifest = []
    for name in names:
        module, inputs = test_operators.build(name)
        options = test_operators.case_options(name)   # e.g. weights="int8"
        pte = args.out / f"{name}.pte"
        export(module, inputs, str(pte), precision="fp32", **options)
        delegates = [d.backend_id for d in read_delegates(pte)]
        outside = read_operators(pte, device_copies=False)["forward"]
        if delegates != ["KilnBackend"] or outside:
            raise SystemExit(f"export_operators: {name} has delegates {delegates} and leaves "
                             f"{outside} to ExecuTorch; expected one KilnBackend delegate")
        with torch.no_grad():
            expected = test_operators.reference_module(module, options)(*inputs)
        expected = expected if isinstance(expected, (tuple, list)) else (expected,)
        manifest.append({
            "case": name, "program": pte.name,
            "inputs": [save(x, args.out / f"{name}_input_{i}.bin") for i, x in enumerate(inputs)],
            "expected": [save(y, args.out / f"{name}_expected_{j}.bin")
                         for j, y in enumerate(expected)]})
        print(f"export_operators: {name}", flush=True)
    (args.out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    print(f"export_operators: {len(manifest)} cases -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
