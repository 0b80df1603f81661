"""Stages the coverage report's models (bench/coverage_models.py) for the GPU check: each is
exported with KilnPartitioner (fp32, default settings) into one .pte with its inputs and eager
PyTorch's outputs, in the layout tests/gpu_e2e/check_operators.py runs through kiln_runner on the
GPU machine; its --json gives coverage.py --gpu the relative error of every model.

    export_coverage.py --out DIR --models hf_bert,resnet18 | --models all [--max-params 30e6]
                       [--timeout 900]

Weights are real_models.regenerate's seeded grid values (a few magnitudes times a sign, repeated
in tiles), which xz packs to a few bits a value: the programs embed them and must travel to the
GPU machine. Each model is exported in a process of its own (a failure or --timeout is reported
and the others go on); DIR/manifest.json lists every model staged so far, so a run cut short is
resumed by running it again. --max-params leaves out the models with more parameters.
"""
from __future__ import annotations

import argparse
import json
import multiprocessing
import sys
from pathlib import Path

import coverage_models  # bench/coverage_models.py, beside this script
import real_models

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "gpu_e2e"))
from export_operators import save  # noqa: E402  (the staged file format)


def stage(name: str, out: Path, max_params: float | None) -> dict | int:
    """Exports one model into `out` and returns its manifest entry, or its parameter count when
    that is over max_params (raises on any failure)."""
    import torch

    from kiln_executorch.aot import export, read_delegates, read_operators

    torch.manual_seed(0)
    module, inputs = coverage_models.all_models()[name]()
    params = sum(p.numel() for p in module.parameters())
    if max_params is not None and params > max_params:
        return params
    module.eval()
    real_models.regenerate(module)
    pte = out / f"{name}.pte"
    export(module, inputs, str(pte), precision="fp32")
    delegates = [d.backend_id for d in read_delegates(pte)]
    outside = read_operators(pte, device_copies=False)["forward"]
    if delegates != ["KilnBackend"] or outside:
        raise RuntimeError(f"{name} has delegates {delegates} and leaves {outside} to ExecuTorch")
    with torch.no_grad():
        expected = module(*inputs)
    expected = expected if isinstance(expected, (tuple, list)) else (expected,)
    return {"case": name, "program": pte.name, "params": params,
            "inputs": [save(x, out / f"{name}_input_{i}.bin") for i, x in enumerate(inputs)],
            "expected": [save(y, out / f"{name}_expected_{j}.bin")
                         for j, y in enumerate(expected)]}


def _child(name, out, max_params, queue):
    try:
        staged = stage(name, out, max_params)
        queue.put(("ok", staged) if isinstance(staged, dict) else ("too large", staged))
    except Exception as e:  # reported by the parent, which goes on with the next model
        queue.put(("error", f"{type(e).__name__}: {str(e).strip()[:300]}"))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--models", required=True, help="comma list of model names, or all")
    ap.add_argument("--max-params", type=float, default=None)
    ap.add_argument("--timeout", type=float, default=900)
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    known = coverage_models.all_models()
    names = list(known) if args.models == "all" else args.models.split(",")
    unknown = [n for n in names if n not in known]
    if unknown:
        raise SystemExit(f"export_coverage: unknown models {unknown}")
    path = args.out / "manifest.json"
    manifest = json.loads(path.read_text()) if path.exists() else []
    done = {entry["case"] for entry in manifest}
    failed = []
    context = multiprocessing.get_context("spawn")
    for name in names:
        if name in done:
            continue
        queue = context.Queue()
        child = context.Process(target=_child, args=(name, args.out, args.max_params, queue))
        child.start()
        child.join(args.timeout)
        if child.is_alive():
            child.kill()
            failed.append(name)
            print(f"export_coverage: {name}: FAIL over {args.timeout:.0f} s", flush=True)
            continue
        status, value = queue.get() if not queue.empty() else ("error", f"exit {child.exitcode}")
        if status == "too large":
            print(f"export_coverage: {name}: {value / 1e6:.1f} M parameters, over "
                  f"{args.max_params:.3g}: left out", flush=True)
            continue
        if status != "ok":
            failed.append(name)
            print(f"export_coverage: {name}: FAIL {value}", flush=True)
            continue
        manifest.append(value)
        path.write_text(json.dumps(manifest, indent=1) + "\n")
        print(f"export_coverage: {name} ({value['params'] / 1e6:.1f} M parameters)", flush=True)
    print(f"export_coverage: {len(manifest)} models staged in {args.out}, {len(failed)} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
