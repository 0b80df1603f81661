"""Exports the programs check_erfinv.py runs on the GPU machine: Kiln's GPU erfinv over the whole
domain, and the coalesced fixture, cos(erfinv(tanh(x))), as one Kiln partition.

    export_erfinv.py --out DIR

Writes into DIR:
  erfinv.pte             torch.erfinv over the inputs of tests/e2e/erfinv_domain.py (fp32), one
                         Kiln delegate and nothing left to ExecuTorch's kernels; erfinv_x.bin holds
                         the inputs (raw float32).
  coalesced_<p>.pte      the coalesced fixture module exported with the default KilnPartitioner at
                         precision p (fp32, bf16, fp16): one Kiln delegate, no CPU operator.
  coalesced_fixture_input.bin / _expected.bin   the fixture's input and recorded eager output.
  coalesced_linspace_input.bin / _expected.bin  x = linspace(-6, 6) over [64, 64], where bf16 would
                         round tanh(x) to 1 (erfinv inf, cos NaN) if erfinv's operand were not kept
                         float32, and eager fp32's output for it.
  manifest.json          every run: program, input, expected output, tolerance, what it shows.
Each program's partitioning is checked from the saved file; a different one fails the export.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch

from kiln_executorch.aot import export, read_delegates, read_operators

TESTS = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(TESTS / "python"))
sys.path.insert(0, str(TESTS / "e2e"))
import models  # noqa: E402  (tests/python/models.py)
from erfinv_domain import NEAR_ONE, domain_inputs  # noqa: E402

# fp32: the GPU check's usual 1e-4 (scaled by the output's magnitude past 1). Low precision: 2e-2
# of the output's largest magnitude. linspace at fp32: 1e-3, since near |x| = 6 cos(erfinv(tanh))
# moves about 3e-5 per ulp of tanh and the GPU's tanhf and the CPU's may differ by a few ulp.
TOLERANCES = {"fixture": {"fp32": {"abs_scaled": 1e-4}, "low": {"rel_max": 2e-2}},
              "linspace": {"fp32": {"abs_scaled": 1e-3}, "low": {"rel_max": 2e-2}}}
PRECISIONS = ("fp32", "bf16", "fp16")


class Erfinv(torch.nn.Module):
    def forward(self, x):
        return torch.erfinv(x)


def one_kiln_partition(pte: Path) -> list:
    delegates = [d.backend_id for d in read_delegates(pte)]
    outside = read_operators(pte, device_copies=False)["forward"]
    if delegates != ["KilnBackend"] or outside:
        raise SystemExit(f"export_erfinv: {pte} has delegates {delegates} and leaves {outside} to "
                         "ExecuTorch; expected one KilnBackend delegate and nothing else")
    return delegates


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    out = ap.parse_args().out
    out.mkdir(parents=True, exist_ok=True)
    runs = []

    x = domain_inputs()
    export(Erfinv().eval(), (torch.from_numpy(x),), out / "erfinv.pte")
    one_kiln_partition(out / "erfinv.pte")
    x.tofile(out / "erfinv_x.bin")
    kernel = {"program": "erfinv.pte", "input": "erfinv_x.bin", "count": int(x.size),
              "near_one": NEAR_ONE}

    fixture = models.coalesced()
    linspace = torch.linspace(-6, 6, 64 * 64).reshape(64, 64)
    with torch.no_grad():
        linspace_eager = fixture.module(linspace)
    inputs = {"fixture": (fixture.inputs[0], fixture.expected[0]), "linspace": (linspace, linspace_eager)}
    for name, (xi, yi) in inputs.items():
        xi.numpy().tofile(out / f"coalesced_{name}_input.bin")
        yi.numpy().tofile(out / f"coalesced_{name}_expected.bin")
    for precision in PRECISIONS:
        pte = out / f"coalesced_{precision}.pte"
        export(fixture.module, fixture.inputs, pte, precision=precision)
        one_kiln_partition(pte)
        for name in inputs:
            runs.append({"name": f"coalesced_{precision}_{name}", "program": pte.name,
                         "input": f"coalesced_{name}_input.bin",
                         "expected": f"coalesced_{name}_expected.bin",
                         "tolerance": TOLERANCES[name]["fp32" if precision == "fp32" else "low"]})
    manifest = {"kernel": kernel, "coalesced": runs}
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
    print(f"export_erfinv: erfinv.pte over {x.size} inputs; coalesced at {', '.join(PRECISIONS)}, "
          f"one Kiln partition each; {len(runs)} coalesced runs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
