"""Exports every model of bench/model_zoo.py with KilnPartitioner (fp32 and bf16) into a staging
folder for the GPU machine, each both with host inputs and outputs (the default) and
device-resident, with its inputs, eager CPU fp32 outputs and a manifest:

    export_models.py --out .gpu/models [--keys mlp,resnet18] [--precisions fp32,bf16]

--keys real stands for the real models of bench/real_models.py (resnet50 ... llama_prefill),
--keys zoo for the zoo's; each real model's manifest entries carry its weights' SHA-256 (the GPU
side rebuilds the model from the seed and must get the same) and its error tolerance.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

from model_zoo import ZOO, build, weights_checksum
from real_models import REAL, weights_digest
from kiln_executorch.aot import export, read_delegates, read_operators

DTYPE_NAMES = {torch.float32: "Float", torch.int64: "Long", torch.bfloat16: "BFloat16"}
KEY_SETS = {"zoo": list(ZOO), "real": list(REAL)}
# Real models: largest |Kiln - eager CPU fp32| allowed, relative to the output's largest magnitude.
TOLERANCE = {"fp32": 1e-4, "tf32": 1e-2, "bf16": 3e-2}


def save(t: torch.Tensor, path: Path) -> dict:
    path.write_bytes(t.contiguous().numpy().tobytes())
    return {"file": path.name, "shape": list(t.shape), "dtype": DTYPE_NAMES[t.dtype]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--keys", default=",".join(ZOO))
    ap.add_argument("--precisions", default="fp32,bf16")
    ap.add_argument("--layout", default="channels_last", choices=("channels_last", "nchw"),
                    help="KilnPartitioner's layout for conv nets (to compare the two)")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    manifest, failures = [], 0
    keys = [k for name in args.keys.split(",") for k in KEY_SETS.get(name, [name])]
    for key in keys:
        t_build = time.time()
        module, inputs = build(key)
        with torch.no_grad():
            outputs = module(*inputs)
        outputs = outputs if isinstance(outputs, tuple) else (outputs,)
        # Weights do not travel (they would not fit the transfer): the GPU side rebuilds the module
        # from the same seed and checks this checksum before timing it.
        checksum = weights_checksum(module)
        real = {"suite": "real", "weights_digest": weights_digest(module)} if key in REAL else {}
        print(f"built {key} with eager outputs in {time.time() - t_build:.1f} s", flush=True)
        ins = [save(t, args.out / f"{key}_input_{i}.bin") for i, t in enumerate(inputs)]
        outs = [save(t, args.out / f"{key}_expected_{i}.bin") for i, t in enumerate(outputs)]
        for precision in args.precisions.split(","):
            pte = args.out / f"{key}_{precision}.pte"
            t0 = time.time()
            try:
                export(module, inputs, pte, precision=precision, layout=args.layout)
            except Exception as e:  # noqa: BLE001 - one model's failure is reported, the rest go on
                failures += 1
                print(f"export {key} {precision}: FAILED: {type(e).__name__}: {e}", file=sys.stderr)
                continue
            delegates = [d for d in read_delegates(pte) if d.backend_id == "KilnBackend"]
            # et_copy operators only move data across the delegate boundary: not CPU compute.
            outside = sorted(set(op for ops in read_operators(pte).values() for op in ops
                                 if not op.startswith("et_copy::")))
            # The same program exported device-resident (inputs and outputs stay CUDA tensors,
            # no et_copy): Kiln's execute-only latency, comparable to torch on device tensors.
            # Programs with CPU operators between partitions have no device-resident form.
            dr = None
            if not outside:
                dr = args.out / f"{key}_{precision}_device.pte"
                try:
                    export(module, inputs, dr, precision=precision, device_resident=True,
                           layout=args.layout)
                except Exception as e:  # noqa: BLE001
                    failures += 1
                    print(f"export {key} {precision} device-resident: FAILED: {type(e).__name__}: {e}",
                          file=sys.stderr)
                    dr = None
            if real:
                real["tolerance"] = TOLERANCE[precision]
            manifest.append({**real, "key": key, "precision": precision, "pte": pte.name,
                             "pte_device_resident": dr.name if dr else None, "inputs": ins,
                             "outputs": outs, "weights_checksum": checksum, "kiln_partitions": len(delegates),
                             "ops_outside": outside, "export_s": round(time.time() - t0, 2),
                             "pte_bytes": pte.stat().st_size})
            print(f"export {key:22s} {precision}: {len(delegates)} Kiln partition(s), "
                  f"outside: {outside or '-'}, {time.time() - t0:.0f} s", flush=True)
        (args.out / "manifest.json").write_text(json.dumps(manifest, indent=1))  # after each model
    (args.out / "manifest.json").write_text(json.dumps(manifest, indent=1))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
