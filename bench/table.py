"""The README's results tables, in Markdown, from gpu_run.py's JSON files:

    table.py bench/results/h200_fixtures_and_zoo.json bench/results/h200_resnet18_*.json
    table.py --real bench/results/h200_real_*.json

--real: the real models (bench/real_models.py), Kiln's device-resident span against torch eager,
torch.compile default and reduce-overhead on device tensors, each precision against its torch
setting (fp32: TF32 off; tf32: torch's default fp32; bf16).
"""
from __future__ import annotations

import json
import sys

NAN = float("nan")


def fmt(v: float, digits: int = 3) -> str:
    return "-" if v != v else f"{v:.{digits}f}"


def real_table(results: list) -> list:
    """Markdown rows for the real models of `results` (gpu_run.py's result entries)."""
    setting = {"fp32": "fp32, TF32 off", "tf32": "default fp32", "bf16": "bf16"}
    lines = ["| model | prec. | torch | Kiln partitions | CPU ops | Kiln err / max | torch err / max | "
             "Kiln (ms) | eager | compile default | reduce-overhead | Kiln / eager | Kiln / default | "
             "Kiln / reduce-overhead |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        if r.get("suite") != "real":
            continue
        k, t = r["kiln"], r["torch"]
        errs = k.get("errors", []) + k.get("device_io", {}).get("errors", [])
        scale = max((e["ref_max_abs"] for e in errs), default=NAN)
        err = max((e["max_abs"] for e in errs), default=NAN) / scale
        dev = k.get("device_io", {}).get("event_span_ms", NAN)
        best = dev if dev == dev else k.get("median_ms", NAN)
        ms = [t.get(f"{name}_device_ms", NAN) for name in ("eager", "compile_default", "compile_reduce-overhead")]
        lines.append(f"| {r['key']} | {r['precision']} | {setting.get(r['precision'], '-')} | "
                     f"{r['kiln_partitions']} | {len(r['ops_outside'])} | {err:.2g} | "
                     f"{t.get('eager_max_abs_err', NAN) / scale:.2g} | {fmt(best, 4)} | "
                     + " | ".join(fmt(v) for v in ms) + " | "
                     + " | ".join(fmt(best / v, 2) for v in ms) + " |")
    return lines


def main(paths: list[str]) -> int:
    if paths[:1] == ["--real"]:
        print("\n".join(real_table([r for p in paths[1:] for r in json.load(open(p))["results"]])))
        return 0
    print("| model | prec. | Kiln partitions | max abs error | Kiln, host I/O | Kiln, device-resident | "
          "eager | reduce-overhead | reduce-overhead, TF32 off | Kiln / eager | Kiln / reduce-overhead | "
          "Kiln / reduce-overhead, TF32 off | init cold / warm (ms) | weights / activations (MiB) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for path in paths:
        for r in json.load(open(path))["results"]:
            k, t = r["kiln"], r["torch"]
            dev = k.get("device_io", {}).get("event_span_ms", NAN)
            best = dev if dev == dev else k["median_ms"]
            err = max((e["max_abs"] for e in k["errors"] + k.get("device_io", {}).get("errors", [])), default=NAN)
            ro = t.get("compile_reduce-overhead_device_ms", NAN)
            strict = t.get("strict_fp32_compile_reduce-overhead_device_ms", NAN)
            mib = lambda b: NAN if b is None else b / 2**20  # noqa: E731
            print(f"| {r['key']} | {r['precision']} | {r['kiln_partitions']} | {err:.2g} | {fmt(k['median_ms'])} | "
                  f"{fmt(dev, 4)} | {fmt(t.get('eager_device_ms', NAN))} | {fmt(ro)} | {fmt(strict)} | "
                  f"{fmt(best / t.get('eager_device_ms', NAN), 2)} | {fmt(best / ro, 2)} | {fmt(best / strict, 2)} | "
                  f"{k['init_cold_ms']:.0f} / {k['init_warm_ms']:.1f} | "
                  f"{mib(k['device_weight_bytes']):.2f} / {mib(k['device_activation_bytes']):.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
