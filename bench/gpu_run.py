"""On the GPU machine: runs every exported model through kiln_runner, checks it against eager
PyTorch (CPU fp32 outputs recorded at export), and times Kiln against torch eager and
torch.compile (default and mode="reduce-overhead") on the same GPU, inputs and weights.

    gpu_run.py --models .gpu/models --runner .gpu/site/kiln_executorch/bin/kiln_runner --out DIR
               [--compile] [--iterations 200] [--profile]

Writes DIR/results.json and DIR/latency.png and prints a table with the ratios. Kiln's latency is
the runner's `execute`, for each model twice: the default program with host inputs and outputs
(copies in and out included) and the device-resident export (device tensors in and out; execute
returns when Kiln's stream is done). The torch figures are measured the same two ways (host
tensors in and out, and device-resident).
With --profile, each program that ran is run once more with `kiln_runner --profile`, and the
per-op GPU time tables of all programs go into one file, DIR/profiles.txt (the GPU machine returns
few files); those runs are not part of the results.
"""
from __future__ import annotations

import argparse
import copy
import json
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from model_zoo import build, weights_checksum  # noqa: E402

NP = {"Float": np.float32, "Long": np.int64}


def load(models: Path, spec: dict) -> torch.Tensor:
    a = np.fromfile(models / spec["file"], dtype=NP[spec["dtype"]]).reshape(spec["shape"])
    return torch.from_numpy(a.copy())


def run_kiln(runner: Path, models: Path, entry: dict, iterations: int, pte: str = "") -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [str(runner), str(models / (pte or entry["pte"])), "--output-dir", tmp,
               "--iterations", str(iterations), "--warmup", "20"]
        for i, spec in enumerate(entry["inputs"]):
            cmd += ["--input", f"{i}={models / spec['file']}"]
        if pte:  # the device-resident program: also timed on a stream handed to Kiln
            cmd += ["--device-timing", str(iterations)]
        t0 = time.time()
        r = subprocess.run(cmd, capture_output=True, text=True, errors="replace", timeout=300)
        wall = time.time() - t0
        if r.returncode != 0:
            return {"ok": False, "error": (r.stderr or r.stdout).strip()[-2000:]}
        m = re.search(r"latency_ms min=([\d.]+) median=([\d.]+) max=([\d.]+)", r.stdout)
        outs = [np.fromfile(Path(tmp) / f"output_{i}.bin", dtype=NP[s["dtype"]]).reshape(s["shape"])
                for i, s in enumerate(entry["outputs"])]
    errors = []
    for got, spec in zip(outs, entry["outputs"]):
        ref = load(models, spec).numpy().astype(np.float64)
        diff = np.abs(got.astype(np.float64) - ref)
        scale = max(float(np.abs(ref).max()), 1e-12)
        worst = np.argsort(np.nan_to_num(diff, nan=np.inf).ravel())[-5:][::-1]
        errors.append({"max_abs": float(diff.max()), "ref_max_abs": scale,
                       "nan": int(np.isnan(got).sum()),
                       "worst": [(int(i), float(got.ravel()[i]), float(ref.ravel()[i])) for i in worst]})
    loads = dict(re.findall(r"^(load_method(?:_warm)?_ms)=([\d.]+)$", r.stdout, re.M))
    mem = re.search(r"^kiln_device_bytes weights=(\d+) activations=(\d+)$", r.stdout, re.M)
    timing = {}
    span = re.search(r"^device_timing event_span_ms median=([\d.]+)", r.stdout, re.M)
    b2b = re.search(r"^device_timing back_to_back_ms_per_execute=([\d.]+) enqueue_ms_per_execute=([\d.]+)",
                    r.stdout, re.M)
    if span and b2b:
        # event_span_ms: GPU span of one execute between CUDA events on the caller's stream, the
        # way time_cuda below times torch; back_to_back: wall time per execute, pipelined.
        timing = {"event_span_ms": float(span.group(1)), "back_to_back_ms": float(b2b.group(1)),
                  "enqueue_ms": float(b2b.group(2))}
    return {"ok": True, "median_ms": float(m.group(2)), "min_ms": float(m.group(1)), **timing,
            "errors": errors, "wall_s": round(wall, 2),
            "init_cold_ms": float(loads.get("load_method_ms", "nan")),
            "init_warm_ms": float(loads.get("load_method_warm_ms", "nan")),
            "device_weight_bytes": int(mem.group(1)) if mem else None,
            "device_activation_bytes": int(mem.group(2)) if mem else None}


def profile_kiln(runner: Path, models: Path, entry: dict, iterations: int) -> str:
    """kiln_runner --profile's report for one program (its stdout from the profile header on)."""
    cmd = [str(runner), str(models / entry["pte"]), "--profile", "--values", "0",
           "--iterations", str(iterations), "--warmup", "5"]
    for i, spec in enumerate(entry["inputs"]):
        cmd += ["--input", f"{i}={models / spec['file']}"]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, errors="replace", timeout=300)
    except subprocess.TimeoutExpired:
        return "profile run timed out after 300 s\n"
    if r.returncode != 0:
        return f"profile run failed (exit {r.returncode}):\n{(r.stderr or r.stdout).strip()[-2000:]}\n"
    start = r.stdout.find("# profile of run")
    return r.stdout[start:] if start >= 0 else r.stdout


def passes(entry: dict, result: dict) -> bool:
    if not result.get("ok"):
        return False
    if "device_io" in result and not passes(entry, result["device_io"]):
        return False
    # fp32: 1e-4 absolute, relative to the output's magnitude where that exceeds 1;
    # bf16/fp16: 2e-2 relative to the output's largest magnitude. Real models carry their own
    # tolerance, relative to the output's largest magnitude (bench/export_models.py).
    for e in result["errors"]:
        if "tolerance" in entry:
            limit = entry["tolerance"] * e["ref_max_abs"]
        elif entry["precision"] == "fp32":
            limit = 1e-4 * max(1.0, e["ref_max_abs"])
        else:
            limit = 2e-2 * e["ref_max_abs"]
        if e["nan"] or e["max_abs"] > limit:
            return False
    return True


def time_cuda(fn, iterations: int) -> float:
    for _ in range(10):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iterations):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


# Models with convolutions: PyTorch runs their fp32 convolutions in TF32 by default
# (torch.backends.cudnn.allow_tf32), Kiln's fp32 does not (it keeps the 1e-4 tolerance). For those
# rows the references are also timed with TF32 off: the same arithmetic as Kiln's fp32.
CONV_MODELS = {"cnn_small", "resnet18", "mobilenet_v3_small"}


def set_tf32(on: bool) -> None:
    torch.backends.cudnn.allow_tf32 = on
    torch.backends.cuda.matmul.allow_tf32 = on and DEFAULT_MATMUL_TF32


DEFAULT_MATMUL_TF32 = torch.backends.cuda.matmul.allow_tf32  # False unless the machine set it


def torch_refs(models: Path, entry: dict, iterations: int, compile_modes: list) -> dict:
    if entry.get("suite") == "real":
        # Real models: each Kiln precision against one torch setting, every mode. fp32 against
        # strict fp32 (TF32 off everywhere, Kiln's fp32 arithmetic); tf32 against torch's default
        # fp32 (TF32 convolutions, fp32 matmuls); bf16 against bf16.
        strict = entry["precision"] == "fp32"
        set_tf32(not strict)
        try:
            torch._dynamo.reset()
            return {"torch_tf32_convolutions": not strict,
                    **_torch_refs(models, entry, iterations, compile_modes, "")}
        finally:
            set_tf32(True)
            torch._dynamo.reset()
    out = _torch_refs(models, entry, iterations, compile_modes, "")
    if entry["precision"] == "fp32" and entry["key"] in CONV_MODELS:
        torch.backends.cudnn.allow_tf32 = False
        try:
            torch._dynamo.reset()
            out.update(_torch_refs(models, entry, iterations,
                                   [m for m in compile_modes if m == "reduce-overhead"], "strict_fp32_"))
        finally:
            torch.backends.cudnn.allow_tf32 = True
            torch._dynamo.reset()
    return out


_BUILT: dict = {}


def rebuilt(key: str):
    """A fresh copy of the seeded module: the last key's is kept (real models take seconds to
    build and are timed in three precisions)."""
    if key not in _BUILT:
        _BUILT.clear()
        _BUILT[key] = build(key)[0]
    return copy.deepcopy(_BUILT[key])


def _torch_refs(models: Path, entry: dict, iterations: int, compile_modes: list, prefix: str) -> dict:
    module = rebuilt(entry["key"])
    if "weights_digest" in entry:  # real models: bit for bit the exported weights, or no timing
        from real_models import weights_digest

        if weights_digest(module) != entry["weights_digest"]:
            return {"error": f"the rebuilt {entry['key']} has other weights than the exported one "
                             f"(SHA-256 {weights_digest(module)} vs {entry['weights_digest']}): "
                             "its torchvision/transformers builds another state_dict"}
    got = weights_checksum(module)
    if abs(got - entry["weights_checksum"]) > 1e-6 * max(1.0, abs(got)):
        return {"error": f"seeded weights differ from the exported ones (checksum {got} vs "
                         f"{entry['weights_checksum']}): torch versions initialise differently"}
    dtype = torch.bfloat16 if entry["precision"] == "bf16" else torch.float32
    module = module.to("cuda", dtype)
    host_inputs = [load(models, s) for s in entry["inputs"]]
    host_inputs = [t.to(dtype) if t.is_floating_point() else t for t in host_inputs]
    dev_inputs = [t.cuda() for t in host_inputs]
    out = {}
    variants = [("eager", module)]
    for mode in compile_modes:
        variants.append((f"compile_{mode}", torch.compile(module, mode=None if mode == "default" else mode)))
    variants = [(prefix + name, fn) for name, fn in variants]
    with torch.inference_mode():
        for name, fn in variants:
            try:
                t0 = time.time()
                first = fn(*dev_inputs)
                torch.cuda.synchronize()
                warm_s = time.time() - t0
                if entry.get("suite") == "real":  # torch's own error against the CPU fp32 outputs
                    out[f"{name}_max_abs_err"] = max_abs_error(models, entry, first)
                out[f"{name}_device_ms"] = time_cuda(lambda: fn(*dev_inputs), iterations)
                if prefix:
                    out[f"{name}_first_call_s"] = round(warm_s, 2)
                    continue

                def host_round_trip():
                    r = fn(*[t.to("cuda", non_blocking=False) for t in host_inputs])
                    (r[0] if isinstance(r, tuple) else r).float().cpu()

                out[f"{name}_host_ms"] = time_cuda(host_round_trip, max(20, iterations // 4))
                out[f"{name}_first_call_s"] = round(warm_s, 2)
            except Exception as e:  # noqa: BLE001 - report and go on with the other variants
                out[f"{name}_error"] = f"{type(e).__name__}: {e}"[:500]
    return out


def max_abs_error(models: Path, entry: dict, outputs) -> float:
    outputs = outputs if isinstance(outputs, (tuple, list)) else (outputs,)
    return max(float((o.detach().float().cpu() - load(models, s)).abs().max())
               for o, s in zip(outputs, entry["outputs"]))


def chart(results: list, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in results if r["kiln"].get("ok")]
    labels = [f"{r['key']}\n{r['precision']}" for r in rows]
    series = [("Kiln (host I/O)", [r["kiln"]["median_ms"] for r in rows]),
              ("Kiln (device-resident)", [r["kiln"].get("device_io", {}).get("event_span_ms", 0) for r in rows]),
              ("torch eager (host I/O)", [r["torch"].get("eager_host_ms", 0) for r in rows]),
              ("torch eager (device)", [r["torch"].get("eager_device_ms", 0) for r in rows])]
    if any("compile_reduce-overhead_device_ms" in r["torch"] for r in rows):
        series.append(("torch.compile reduce-overhead (device)",
                       [r["torch"].get("compile_reduce-overhead_device_ms", 0) for r in rows]))
    fig, ax = plt.subplots(figsize=(max(8, len(rows) * 1.1), 5))
    width = 0.8 / len(series)
    for i, (name, vals) in enumerate(series):
        ax.bar([x + i * width for x in range(len(rows))], vals, width, label=name)
    ax.set_xticks([x + 0.4 - width / 2 for x in range(len(rows))], labels, fontsize=7)
    ax.set_ylabel("median latency (ms)")
    ax.set_yscale("log")
    ax.legend(fontsize=8)
    ax.set_title(f"Kiln vs PyTorch on {torch.cuda.get_device_name()}")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", type=Path, required=True)
    ap.add_argument("--runner", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--iterations", type=int, default=200)
    ap.add_argument("--compile", default="", help="comma list of torch.compile modes, e.g. default,reduce-overhead")
    ap.add_argument("--keys", default="")
    ap.add_argument("--profile", action="store_true",
                    help="also run each program with kiln_runner --profile into OUT/profiles.txt")
    ap.add_argument("--profile-iterations", type=int, default=20)
    args = ap.parse_args()
    manifest = json.loads((args.models / "manifest.json").read_text())
    if args.keys:
        manifest = [e for e in manifest if e["key"] in args.keys.split(",")]
    modes = [m for m in args.compile.split(",") if m]
    if args.profile:  # one file for every program's profile, started afresh
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "profiles.txt").write_text(f"kiln_runner --profile, {args.profile_iterations} "
                                               "iterations after 5 warm-up runs per program\n\n")
    results, failed = [], 0
    for entry in manifest:
        kiln = run_kiln(args.runner, args.models, entry, args.iterations)
        if kiln.get("ok") and entry.get("pte_device_resident"):
            kiln["device_io"] = run_kiln(args.runner, args.models, entry, args.iterations,
                                         entry["pte_device_resident"])
        refs = torch_refs(args.models, entry, args.iterations, modes) if kiln.get("ok") else {}
        ok = passes(entry, kiln)
        failed += not ok or bool(refs.get("error"))
        if refs.get("error"):
            print(f"   torch references: {refs['error']}", flush=True)
        results.append({**{k: entry[k] for k in ("key", "precision", "kiln_partitions", "ops_outside")},
                        **{k: entry[k] for k in ("suite", "tolerance") if k in entry},
                        "pass": ok, "kiln": kiln, "torch": refs})
        err = max((e["max_abs"] for e in kiln.get("errors", []) + kiln.get("device_io", {}).get("errors", [])),
                  default=float("nan"))
        print(f"{entry['key']:22s} {entry['precision']:5s} {'PASS' if ok else 'FAIL'} "
              f"max_abs_err={err:.3g} kiln={kiln.get('median_ms', float('nan')):.4f}ms "
              f"eager_host={refs.get('eager_host_ms', float('nan')):.4f}ms "
              f"eager_dev={refs.get('eager_device_ms', float('nan')):.4f}ms", flush=True)
        # Written after every model, so a run cut short by its time limit still leaves its numbers.
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "results.json").write_text(json.dumps(
            {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "results": results}, indent=1))
        if args.profile and kiln.get("ok"):
            text = profile_kiln(args.runner, args.models, entry, args.profile_iterations)
            with open(args.out / "profiles.txt", "a") as f:
                f.write(f"=== {entry['key']} {entry['precision']} ({entry['pte']})\n{text}\n")
        if not kiln.get("ok"):
            print("   " + kiln["error"].replace("\n", "\n   "), flush=True)
        elif "device_io" in kiln and not kiln["device_io"].get("ok"):
            print("   device-resident: " + kiln["device_io"]["error"].replace("\n", "\n   "), flush=True)
        elif not ok:
            for e in kiln["errors"]:
                print(f"   worst (flat index, got, expected): {e['worst']}", flush=True)
    try:
        chart(results, args.out / "latency.png")
    except Exception as e:  # noqa: BLE001 - the numbers matter more than the picture
        print(f"chart failed: {e}")
    print("\nmedian ms; kiln_host: host inputs/outputs (copies in the time); kiln_dev: the device-resident "
          "program, GPU span of one execute between CUDA events on the caller's stream (as torch is timed); "
          "torch *_dev: device tensors; ratios are kiln_dev (kiln_host when there is no "
          "device-resident program) over each reference; *_strict: PyTorch with TF32 convolutions off")
    print("key                    prec   pass  kiln_host  kiln_dev  eager_host  eager_dev  " +
          "  ".join(f"{m}_dev" for m in modes) + "  kiln/eager_dev  " + "  ".join(f"kiln/{m}" for m in modes) +
          "  kiln/reduce-overhead_strict")
    nan = float("nan")
    for r in results:
        k, t = r["kiln"], r["torch"]
        if not k.get("ok"):
            print(f"{r['key']:22s} {r['precision']:5s}  FAIL")
            continue
        dev = k.get("device_io", {}).get("event_span_ms", nan)
        best = dev if dev == dev else k["median_ms"]
        comp = "  ".join(f"{t.get(f'compile_{m}_device_ms', nan):8.4f}" for m in modes)
        ratios = "  ".join(f"{best / t.get(f'compile_{m}_device_ms', nan):6.2f}" for m in modes)
        strict = t.get("strict_fp32_compile_reduce-overhead_device_ms", nan)
        print(f"{r['key']:22s} {r['precision']:5s} {str(r['pass']):5s} {k['median_ms']:9.4f} {dev:9.4f} "
              f"{t.get('eager_host_ms', nan):10.4f} {t.get('eager_device_ms', nan):10.4f}  {comp}"
              f"  {best / t.get('eager_device_ms', nan):8.2f}  {ratios}  {best / strict:8.2f}")
    print("\ninit (load_method: blob validation, weight upload, plans) in ms, cold process / warm "
          "process; Kiln device memory after load in MiB, weights / activations")
    mib = lambda b: float("nan") if b is None else b / 2**20  # noqa: E731
    for r in results:
        k = r["kiln"]
        if k.get("ok"):
            print(f"{r['key']:22s} {r['precision']:5s} {k['init_cold_ms']:9.2f} {k['init_warm_ms']:9.2f}"
                  f" {mib(k['device_weight_bytes']):9.2f} {mib(k['device_activation_bytes']):9.2f}")
    if any(r.get("suite") == "real" for r in results):
        from table import real_table

        print("\nreal models: Kiln device-resident against torch on device tensors, median ms")
        print("\n".join(real_table(results)))
    print(f"\n{len(results) - failed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
