"""Coverage report: exports real models with KilnPartitioner (random weights, nothing downloads)
and reports, per model, how many Kiln partitions the program has and which operators stay
outside Kiln (ExecuTorch's CPU kernels), with explain()'s reason for each:

    coverage.py [--models gpt2,llama,bert] [--markdown bench/results/coverage.md]

HF transformers models are built from small configs of their architecture with default settings
(default attention implementation; the position ids, token types and masks the model builds for
itself); torchvision models at a small input. Their operators are those of the full-size models;
only the sizes differ. The GPU error against eager is the GPU check's (not measured here).
"""
from __future__ import annotations

import argparse
import collections
import operator
import sys
import time
from pathlib import Path

import torch
from torch import nn

from kiln_executorch.aot import KilnPartitioner
from kiln_executorch.aot.export import lower
from kiln_executorch.aot.ops.common import aten_op


class _Tokens(nn.Module):
    """An HF model called with token ids only; returns its first output as a tensor."""

    def __init__(self, model, **call):
        super().__init__()
        self.model, self.call = model, call

    def forward(self, input_ids):
        out = self.model(input_ids=input_ids, **self.call)
        return out[0] if isinstance(out, tuple) else next(iter(out.values()))


def _ids(vocab, seq=16):
    return (torch.randint(0, vocab, (1, seq)),)


def _gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel
    config = GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=1000, n_positions=128)
    return _Tokens(GPT2LMHeadModel(config), use_cache=False), _ids(1000)


def _llama():
    from transformers import LlamaConfig, LlamaForCausalLM
    config = LlamaConfig(num_hidden_layers=2, hidden_size=64, num_attention_heads=4,
                         num_key_value_heads=2, intermediate_size=128, vocab_size=1000,
                         max_position_embeddings=128)
    return _Tokens(LlamaForCausalLM(config), use_cache=False), _ids(1000)


def _bert():
    from transformers import BertConfig, BertModel
    config = BertConfig(num_hidden_layers=2, hidden_size=64, num_attention_heads=4,
                        intermediate_size=128, vocab_size=1000, max_position_embeddings=128)
    return _Tokens(BertModel(config, add_pooling_layer=False)), _ids(1000)


def _torchvision(name, size):
    def build():
        import torchvision
        return getattr(torchvision.models, name)(weights=None), (torch.randn(1, 3, size, size),)
    return build


MODELS = {
    "gpt2": _gpt2,
    "llama": _llama,
    "bert": _bert,
    "shufflenet_v2_x1_0": _torchvision("shufflenet_v2_x1_0", 64),
    "convnext_tiny": _torchvision("convnext_tiny", 64),
    "swin_t": _torchvision("swin_t", 112),
}


def measure(name):
    """{partitions, outside: Counter of ops left out, reasons: op -> explain()'s reason,
    export_s} for one model; an export failure is {error}."""
    module, inputs = MODELS[name]()
    module.eval()
    t0 = time.time()
    try:
        edge = lower(module, inputs)
    except Exception as e:  # the report shows a lowering error rather than stopping
        return {"error": f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"}
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
    # explain() on the program before partitioning gives the reasons.
    reasons = {}
    with torch.no_grad():
        from executorch.exir import to_edge
        from kiln_executorch.aot.export import NON_CORE_CPU_OPS
        from executorch.exir import EdgeCompileConfig
        plain = to_edge(torch.export.export(module, inputs),
                        compile_config=EdgeCompileConfig(
                            _core_aten_ops_exception_list=NON_CORE_CPU_OPS))
    for node, supported, reason in KilnPartitioner.explain(plain):
        op = str(aten_op(node)).replace("aten.", "", 1)
        if op in outside and not supported:
            reasons.setdefault(op, reason)
    return {"partitions": partitions, "outside": outside, "reasons": reasons, "export_s": seconds}


def markdown(results):
    lines = ["# Kiln coverage of real models (CPU side)", "",
             "Exported with `kiln_executorch.aot.lower` (KilnPartitioner, fp32, default settings); "
             "written by `bench/coverage.py`. Operators outside Kiln run on ExecuTorch's CPU "
             "kernels (getitem and the delegate calls not counted). The GPU error column is "
             "filled by the GPU check.", "",
             "Models: HF GPT2LMHeadModel, LlamaForCausalLM (2 layers, width 64, 4 heads, 2 KV "
             "heads, default attention) and BertModel (2 layers, width 64) called with token ids "
             "only (1 x 16; their position ids, token types and masks built inside the model); "
             "torchvision shufflenet_v2_x1_0 and convnext_tiny at 1x3x64x64, swin_t at "
             "1x3x112x112; random weights. The operators are those of the full-size models.", "",
             "| model | Kiln partitions | operators outside Kiln | export s | GPU error |",
             "|---|---|---|---|---|"]
    for name, r in results.items():
        if "error" in r:
            lines.append(f"| {name} | export failed: {r['error']} | | | |")
            continue
        outside = ", ".join(f"`{op}` x{n}" for op, n in sorted(r["outside"].items())) or "none"
        lines.append(f"| {name} | {r['partitions']} | {outside} | {r['export_s']:.0f} | |")
    why = [(name, op, reason) for name, r in results.items() for op, reason in
           sorted(r.get("reasons", {}).items())]
    if why:
        lines += ["", "## Why each operator stays outside", "", "| model | operator | reason |",
                  "|---|---|---|"]
        lines += [f"| {n} | `{op}` | {reason} |" for n, op, reason in why]
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--markdown", type=Path)
    args = ap.parse_args()
    torch.manual_seed(0)
    results = {}
    for name in args.models.split(","):
        r = results[name] = measure(name)
        if "error" in r:
            print(f"{name}: export failed: {r['error']}", flush=True)
            continue
        print(f"{name}: {r['partitions']} partition(s) in {r['export_s']:.0f} s; outside: "
              f"{dict(r['outside']) or 'none'}", flush=True)
        for op, reason in sorted(r["reasons"].items()):
            print(f"    {op}: {reason}", flush=True)
    if args.markdown:
        args.markdown.write_text(markdown(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
