"""The README's results table, in Markdown, from gpu_run.py's JSON files:

    table.py bench/results/h200_fixtures_and_zoo.json bench/results/h200_resnet18_*.json
"""
from __future__ import annotations

import json
import sys

NAN = float("nan")


def fmt(v: float, digits: int = 3) -> str:
    return "-" if v != v else f"{v:.{digits}f}"


def main(paths: list[str]) -> int:
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
