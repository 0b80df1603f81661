"""Exports the kv_cache_decode fixture's module with KilnPartitioner (fp32 and bf16) for the GPU
check, with a decode sequence and its eager outputs.

    export_kv_cache.py --out DIR

Writes into DIR: kv_cache_<precision>.pte (the caches are state inside the Kiln delegate),
step<k>_x.bin / step<k>_pos.bin (float32 [1,1,32] / int64 [1]), step<k>_expected.bin (eager
float32 [1,1,32], the module's caches carried from step to step), bad_pos.bin (a position past
the cache) and meta.json (steps, tolerances, the bytes one step may copy). Steps 1-3 are the
fixture's own inputs; the rest are seeded random inputs at the following positions.
DIR/tiny_lm/ gets examples/tiny_lm's model and its eager greedy tokens (export_tiny_lm.py), for
the C++ app the check builds from the install tree.
check_kv_cache.py runs them on the GPU through kiln_runner --next in one loaded method.
"""

import argparse
import json
import re
import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "python"))
sys.path.insert(0, str(REPO / "python"))
sys.path.insert(0, str(REPO / "examples" / "tiny_lm"))

import export_tiny_lm  # noqa: E402
import models  # noqa: E402  (tests/python/models.py: the fixture modules)
from kiln_executorch.aot import export, read_delegates, read_operators  # noqa: E402

STEPS = 6
PRECISIONS = {"fp32": {"atol": 1e-4, "rtol": 1e-4}, "bf16": {"atol": 3e-2, "rtol": 3e-2}}
CACHE_BYTES = 2 * 32 * 32 * 4     # k_cache + v_cache, float32


def error_flag_bytes():
    """The bytes of the range-error flag the engine reads back after every run
    (runtime/engine/step.h's DeviceErrorFlag, every field 8 bytes), read from the header so the
    expected copy counts follow the struct."""
    text = (REPO / "runtime" / "engine" / "step.h").read_text()
    body = re.search(r"struct DeviceErrorFlag \{(.*?)\};", text, re.S)
    if body is None:
        raise SystemExit("export_kv_cache: no struct DeviceErrorFlag in runtime/engine/step.h")
    return 8 * len(re.findall(r"^\s*(?:unsigned )?long long \w+;", body.group(1), re.M))


ERROR_FLAG_BYTES = error_flag_bytes()


def decode_inputs():
    fixture = models.kv_cache_decode()
    folder = models.FIXTURES / "kv_cache_decode"
    meta = json.loads((folder / "meta.json").read_text())
    steps = []
    for case in meta["methods"][0]["cases"]:
        x, pos = (models._read_tensor(folder / s["file"], s) for s in case["inputs"])
        steps.append((x, pos))
    g = torch.Generator().manual_seed(11)
    while len(steps) < STEPS:
        steps.append((torch.randn(1, 1, 32, generator=g), torch.tensor([len(steps)])))
    return fixture, steps


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, type=Path)
    args = parser.parse_args()
    out = args.out
    out.mkdir(parents=True, exist_ok=True)

    fixture, steps = decode_inputs()
    programs = {}
    for precision in PRECISIONS:
        module = models.kv_cache_decode().module        # fresh, zeroed caches
        path = out / f"kv_cache_{precision}.pte"
        export(module, steps[0], path, precision=precision)
        delegates = read_delegates(path)
        programs[precision] = {"file": path.name, "delegates": len(delegates),
                               "cpu_operators": read_operators(path, device_copies=False)["forward"]}

    eager = fixture.module
    records = []
    with torch.no_grad():
        for k, (x, pos) in enumerate(steps, start=1):
            y = eager(x, pos)
            (out / f"step{k}_x.bin").write_bytes(x.contiguous().numpy().tobytes())
            (out / f"step{k}_pos.bin").write_bytes(pos.to(torch.int64).numpy().tobytes())
            (out / f"step{k}_expected.bin").write_bytes(y.contiguous().numpy().tobytes())
            records.append({"x": f"step{k}_x.bin", "pos": f"step{k}_pos.bin",
                            "expected": f"step{k}_expected.bin", "position": int(pos[0])})
    (out / "bad_pos.bin").write_bytes(torch.tensor([32]).numpy().tobytes())

    step_in = 32 * 4 + 8
    step_out = 32 * 4 + ERROR_FLAG_BYTES
    meta = {"programs": programs, "precisions": PRECISIONS, "steps": records,
            "output_shape": [1, 1, 32], "bad_position_file": "bad_pos.bin",
            "copy_per_step": {"host_to_device": step_in, "device_to_host": step_out},
            "cache_bytes": CACHE_BYTES, "error_flag_bytes": ERROR_FLAG_BYTES}
    meta["tiny_lm"] = export_tiny_lm.write(out / "tiny_lm")
    (out / "meta.json").write_text(json.dumps(meta, indent=1))
    print(f"wrote {', '.join(p['file'] for p in programs.values())} and {len(records)} steps "
          f"to {out}")


if __name__ == "__main__":
    main()
