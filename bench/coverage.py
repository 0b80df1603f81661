"""Coverage report: exports real models with KilnPartitioner (random weights, nothing downloads)
and reports, per model, how many Kiln partitions the program has and which operators stay
outside Kiln (ExecuTorch's CPU kernels), with explain()'s reason for each:

    coverage.py [--models hf_gpt2,resnet18 | --models all] [--jsonl results.jsonl]
                [--timeout 900] [--markdown bench/results/coverage.md]
    coverage.py --from-jsonl results.jsonl [--gpu gpu.json] --markdown bench/results/coverage.md
    coverage.py --models hf_gpt2,vgg11 --update bench/results/coverage.md
    coverage.py --models none --gpu gpu.json --update bench/results/coverage.md [--note TEXT]

The models are bench/coverage_models.py's: every torchvision classification model
(torchvision.models.list_models(module=torchvision.models)) and small configs of HF transformers
architectures. Each model is exported in a process of its own (a crash, a memory blow-up or
--timeout is that model's failure, with the reason, and the others go on); each result is appended
to --jsonl as it finishes, so a long run can be reported from whatever finished (--from-jsonl).
An export failure is listed with its reason, never dropped. --gpu: a JSON {model: relative error}
from the GPU check, shown in the GPU error column. --update re-measures a few models of a
committed report: their rows are replaced, every other row keeps its numbers, and the header
names the re-measured models, the commit and the time (--models none: only --gpu's errors
are merged in, with --note's paragraph).
"""
from __future__ import annotations

import argparse
import collections
import json
import multiprocessing
import operator
import subprocess
import sys
import time
import traceback
from pathlib import Path

import coverage_models  # bench/coverage_models.py, beside this script


def measure(name):
    """{partitions, outside: {op: count} left out, reasons: op -> explain()'s reason, export_s} for
    one model; an export failure is {error, export_s}."""
    import torch
    from executorch.exir import EdgeCompileConfig, to_edge

    from kiln_executorch.aot import KilnPartitioner
    from kiln_executorch.aot.export import NON_CORE_CPU_OPS, lower
    from kiln_executorch.aot.ops.common import aten_op

    torch.manual_seed(0)
    module, inputs = coverage_models.all_models()[name]()
    module.eval()
    t0 = time.time()
    try:
        edge = lower(module, inputs)
    except Exception as e:  # the report shows a lowering error rather than stopping
        first = (str(e).strip().splitlines() or [""])[0][:300]
        # Where it was raised: the last two frames.
        where = " <- ".join(f"{Path(f.filename).parent.name}/{Path(f.filename).name}:{f.lineno} "
                            f"{f.name}" for f in traceback.extract_tb(e.__traceback__)[:-3:-1])
        return {"error": f"{type(e).__name__}: {first} (at {where})",
                "export_s": time.time() - t0}
    seconds = time.time() - t0
    ep = edge.exported_program()
    partitions, outside = 0, collections.Counter()
    for node in ep.graph.nodes:
        if node.op != "call_function" or node.target is operator.getitem:
            continue
        if "executorch_call_delegate" in str(node.target):
            partitions += 1
        else:
            outside[str(aten_op(node)).replace("aten.", "", 1)] += 1
    reasons = {}
    if outside:  # explain() on the program before partitioning gives the reasons.
        with torch.no_grad():
            plain = to_edge(torch.export.export(module, inputs),
                            compile_config=EdgeCompileConfig(
                                _core_aten_ops_exception_list=NON_CORE_CPU_OPS))
        for node, supported, reason in KilnPartitioner.explain(plain):
            op = str(aten_op(node)).replace("aten.", "", 1)
            if op in outside and not supported:
                reasons.setdefault(op, reason)
    return {"partitions": partitions, "outside": dict(outside), "reasons": reasons,
            "export_s": seconds}


def _worker(name, queue):
    try:
        queue.put(measure(name))
    except BaseException as e:  # building the model failed: that is the model's result
        queue.put({"error": f"{type(e).__name__}: {str(e).strip()[:300]}"})


def measure_isolated(name, timeout):
    """measure(name) in a process of its own: a timeout or a crash is the model's error."""
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=_worker, args=(name, queue))
    t0 = time.time()
    proc.start()
    try:
        return queue.get(timeout=timeout)
    except Exception:
        if proc.is_alive():
            return {"error": f"export did not finish in {timeout} s (2-core CPU)",
                    "export_s": time.time() - t0}
        return {"error": f"the export process died (exit code {proc.exitcode}; out of memory?)",
                "export_s": time.time() - t0}
    finally:
        if proc.is_alive():
            proc.kill()
        proc.join()


def one_partition(r):
    return "error" not in r and r["partitions"] == 1 and not r["outside"]


def summary(results):
    """The headline lines: models in one partition per family, and the operators left outside
    (summed over the models, with how many models leave each)."""
    lines = []
    for family, names in (("HF transformers", [n for n in results if n.startswith("hf_")]),
                          ("torchvision", [n for n in results if not n.startswith("hf_")])):
        measured = [n for n in names if "skipped" not in results[n]]
        if measured:
            ok = sum(one_partition(results[n]) for n in measured)
            failed = sum("error" in results[n] for n in measured)
            left = len(names) - len(measured)
            lines.append(f"- {family}: {ok} / {len(measured)} in one Kiln partition with no "
                         f"operator outside ({100 * ok / len(measured):.0f} %); {failed} failed to "
                         "export" + (f"; {left} not measured" if left else "") + ".")
    models, nodes = collections.Counter(), collections.Counter()
    for r in results.values():
        for op, n in r.get("outside", {}).items():
            models[op] += 1
            nodes[op] += n
    if models:
        top = ", ".join(f"`{op}` ({m} models, {nodes[op]} nodes)" for op, m in models.most_common())
        lines.append(f"- Operators left outside, by how many models leave them: {top}.")
    return lines


def markdown(results, gpu=None, note=None):
    gpu = gpu or {}
    lines = ["# Kiln coverage of real models (CPU side)", "",
             "Exported with `kiln_executorch.aot.lower` (KilnPartitioner, fp32, default settings), "
             "each model in a process of its own; written by `bench/coverage.py` (models: "
             "`bench/coverage_models.py`). Operators outside Kiln run on ExecuTorch's CPU "
             "kernels (getitem and the delegate calls not counted). Export s: torch.export + "
             "to_edge_transform_and_lower on a 2-core CPU (shared with other builds). The GPU "
             "error column is filled from the GPU check's JSON when given (`--gpu`).", "",
             "Models: every `torchvision.models.list_models(module=torchvision.models)` "
             f"classification model, random weights, at 1x3x{coverage_models.DEFAULT_SIZE}x"
             f"{coverage_models.DEFAULT_SIZE} (224 for ViT, MaxViT, AlexNet and VGG; 112 for "
             "Swin, GoogLeNet and Inception v3); HF transformers 2-layer width-64 configs "
             "(4 heads, 2 KV heads where the architecture has GQA) called with token ids only "
             f"(1 x {coverage_models.SEQ}; position ids, token types and masks built inside the "
             "model) or a 1x3x32x32 image (ViT, DINOv2, CLIP vision, patch 8); Whisper's "
             "encoder on 1x16x64 mel frames; T5's encoder. The operators are those of the "
             "full-size models.", ""] + ([note, ""] if note else []) + ["## Summary", ""]
    lines += summary(results)
    lines += ["", "| model | Kiln partitions | operators outside Kiln | export s | GPU error |",
              "|---|---|---|---|---|"]
    for name, r in results.items():
        seconds = f"{r['export_s']:.0f}" if "export_s" in r else ""
        if "skipped" in r:
            lines.append(f"| {name} | {r['skipped']} | | | |")
            continue
        if "error" in r:
            lines.append(f"| {name} | export failed: {r['error'].replace('|', '/')} | | "
                         f"{seconds} | |")
            continue
        outside = ", ".join(f"`{op}` x{n}" for op, n in sorted(r["outside"].items())) or "none"
        error = f"{gpu[name]:.2e}" if name in gpu else ""
        lines.append(f"| {name} | {r['partitions']} | {outside} | {seconds} | {error} |")
    why = [(name, op, reason) for name, r in results.items() for op, reason in
           sorted(r.get("reasons", {}).items())]
    if why:
        lines += ["", "## Why each operator stays outside", "", "| model | operator | reason |",
                  "|---|---|---|"]
        lines += [f"| {n} | `{op}` | {reason} |" for n, op, reason in why]
    return "\n".join(lines) + "\n"


def read_jsonl(path):
    results = {}
    for line in Path(path).read_text().splitlines():
        if line.strip():
            entry = json.loads(line)
            results[entry.pop("model")] = entry
    return results


def read_report(path):
    """(results, gpu errors, note paragraphs) of a report markdown() wrote, so that a run of a
    few models can update it (--update): the model rows in their order, each with its reasons
    from the table below it, and the paragraphs between the models paragraph and the summary."""
    head, _, rest = Path(path).read_text().partition("\n## Summary\n")
    notes = [p.strip() for p in head.split("\n\n") if p.strip()][3:]
    table, _, why = rest.partition("\n## Why each operator stays outside\n")
    results, gpu = {}, {}
    for line in table.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if not line.startswith("| ") or len(cells) != 5 or cells[0] == "model":
            continue
        name, part, outside, seconds, error = cells
        r = results[name] = {}
        if part.startswith("not measured"):
            r["skipped"] = part
            continue
        if seconds:
            r["export_s"] = float(seconds)
        if part.startswith("export failed: "):
            r["error"] = part[len("export failed: "):]
            continue
        r["partitions"] = int(part)
        r["outside"] = {} if outside == "none" else {
            op.strip().strip("`"): int(n) for op, n in
            (item.rsplit(" x", 1) for item in outside.split(", "))}
        r["reasons"] = {}
        if error:
            gpu[name] = float(error)
    for line in why.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|", 2)]
        if line.startswith("| ") and len(cells) == 3 and cells[0] in results:
            results[cells[0]].setdefault("reasons", {})[cells[1].strip("`")] = cells[2]
    return results, gpu, notes


def _head():
    """This checkout's commit, for the note an --update adds."""
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, cwd=Path(__file__).parent, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "an unknown commit"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="all", help="comma list, or 'all' (the default)")
    ap.add_argument("--jsonl", type=Path, help="append each model's result here as it finishes")
    ap.add_argument("--from-jsonl", type=Path, help="report a finished (or partial) run")
    ap.add_argument("--gpu", type=Path, help="JSON {model: relative error} from the GPU check")
    ap.add_argument("--timeout", type=float, default=900, help="seconds per model")
    ap.add_argument("--markdown", type=Path)
    ap.add_argument("--note", help="a paragraph for the report (e.g. where and when it ran)")
    ap.add_argument("--update", type=Path,
                    help="a report this script wrote: this run's models replace their rows in it "
                         "(the others keep theirs) and the header says which were re-measured; "
                         "written back to it unless --markdown names another file")
    args = ap.parse_args()
    filled = set()    # models listed as not reached, not results of the run
    if args.from_jsonl:
        results = read_jsonl(args.from_jsonl)
        if args.models == "all":  # the models the run did not reach are listed as such
            filled = set(coverage_models.all_models()) - set(results)
            for name in coverage_models.all_models():
                results.setdefault(name, {"skipped": "not measured: the run stopped first"})
    else:
        names = list(coverage_models.all_models()) if args.models == "all" else \
            [] if args.models == "none" else args.models.split(",")
        done = read_jsonl(args.jsonl) if args.jsonl and args.jsonl.exists() else {}
        results = {}
        for name in names:
            if name in done:  # a resumed run keeps what finished
                results[name] = done[name]
                continue
            r = results[name] = measure_isolated(name, args.timeout)
            if args.jsonl:
                with args.jsonl.open("a") as f:
                    f.write(json.dumps({"model": name, **r}) + "\n")
            if "error" in r:
                print(f"{name}: export failed: {r['error']}", flush=True)
                continue
            print(f"{name}: {r['partitions']} partition(s) in {r['export_s']:.0f} s; outside: "
                  f"{r['outside'] or 'none'}", flush=True)
            for op, reason in sorted(r["reasons"].items()):
                print(f"    {op}: {reason}", flush=True)
    gpu = json.loads(args.gpu.read_text()) if args.gpu else None
    note = args.note
    if args.update:
        old, old_gpu, notes = read_report(args.update)
        new = {n: r for n, r in results.items() if n not in filled}
        remeasured = [n for n in new if "skipped" not in new[n]]
        for name in new:
            old_gpu.pop(name, None)
        gpu = {**old_gpu, **(gpu or {})}
        if remeasured:
            notes.append(f"Re-measured on {_head()} "
                         f"({time.strftime('%Y-%m-%d %H:%M', time.gmtime())} UTC): "
                         f"{', '.join(remeasured)}; the other rows are from the runs above."
                         + (f" {args.note}" if args.note else ""))
        elif args.note:
            notes.append(args.note)
        results = {**old, **new}
        note = "\n\n".join(notes)
        args.markdown = args.markdown or args.update
    if args.markdown:
        args.markdown.write_text(markdown(results, gpu, note))
    print("\n".join(summary(results)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
