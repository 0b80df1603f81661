"""Exports HF Llama-architecture (and Qwen3) decoders with kiln_executorch.llm.export_llm (methods
prefill and decode sharing the KV cache) for the GPU check (check_llm.py).

    export_llm.py --out DIR [--bench llama1b,llama1b_2l,qwen3_small] [--variants bf16,bf16_int8]
                                                  (or KILN_LLM_BENCH=..., KILN_LLM_VARIANTS=...)

Always: `small` (2 layers, width 256, 8 heads / 2 KV heads, FFN 512, vocab 1024, cache 192 rows,
prefill chunks of 32) in fp32, bf16, bf16 over host tensors (bf16_host: export_llm's
device_resident=False; every other variant is device-resident, the default) and bf16 with
quantized weights (bf16_int8: KilnPartitioner
weights="int8", every projection and the LM head per-channel int8; bf16_int4: weights="int4",
int4 in groups of 128), weights regenerated from the seed as bench/real_models.py
does, with eager HF's greedy tokens on the CPU in fp32 for a fixed prompt. `--bench llama1b` adds
the Llama-3.2-1B shape (16 layers, width 2048, 32 heads / 8 KV heads, FFN 8192, vocab 128256, tied
embeddings, cache 2048 rows, prefill chunks of 128) in bf16, bf16_int8 and bf16_int4, for the
decode and prefill timings:
about 5 GB of weights over both methods, xz-compressible (the seeded values tile). Its 2-layer cut
took 10-12 GB of memory and ~4 minutes to export on a 2-core machine: the whole model needs ~40 GB.
`--bench llama1b_2l` is that cut (2 of the 16 layers, the whole embedding and LM head).
`--bench qwen3_small` is `small` as a Qwen3 decoder (per-head q / k RMSNorm, tied embeddings) in
bf16 and bf16_int8.
`--variants` keeps only those of each config's variants (e.g. bf16 alone: one export instead of
three when only the runtime changed).

Writes DIR/<name>_<variant>.pte and DIR/meta.json: per program the config, the seed, the
weights' SHA-256 (weights_digest: the GPU machine rebuilds the same model from the config and the
seed and checks it), the prompt, the expected tokens (small fp32 only) and the export's check that
each method is one Kiln delegate with no CPU operator.
"""

import argparse
import json
import os
import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "python"))
sys.path.insert(0, str(REPO / "bench"))

import real_models  # noqa: E402  (bench/real_models.py: seeded weights and their digest)

# name -> (LlamaConfig keyword arguments, max_context, prefill_length, precisions)
CONFIGS = {
    "small": (dict(num_hidden_layers=2, hidden_size=256, num_attention_heads=8,
                   num_key_value_heads=2, intermediate_size=512, vocab_size=1024,
                   max_position_embeddings=4096), 192, 32, ("fp32", "bf16", "bf16_host",
                                                              "bf16_int8", "bf16_int4")),
    "llama1b": (dict(num_hidden_layers=16, hidden_size=2048, num_attention_heads=32,
                     num_key_value_heads=8, intermediate_size=8192, vocab_size=128256,
                     max_position_embeddings=131072, tie_word_embeddings=True,
                     rope_theta=500000.0, head_dim=64), 2048, 128,
                    ("bf16", "bf16_int8", "bf16_int4")),
}
# The 1B shape cut to 2 of its 16 layers (the 128256-token embedding, tied to the LM head, and two
# full layers: 383M parameters): what a machine with ~24 GB can export. Its decode reads the same
# per-layer and LM-head matrices as the whole model, so its fraction of the HBM floor carries over.
CONFIGS["llama1b_2l"] = ({**CONFIGS["llama1b"][0], "num_hidden_layers": 2},) + CONFIGS["llama1b"][1:]
# The Qwen3 architecture (RMSNorm on each head's q and k, tied embeddings) at the small model's
# size, for a GPU check of a second decoder family (--bench qwen3_small).
CONFIGS["qwen3_small"] = ({**CONFIGS["small"][0], "head_dim": 32, "tie_word_embeddings": True},
                          192, 32, ("bf16", "bf16_int8"))
# config name -> HF architecture (Llama unless named here)
ARCHITECTURES = {"qwen3_small": "Qwen3"}
SEED = 0
NEW_TOKENS = 40


def build(name, seed=SEED):
    """The HF model of config `name` (eval, fp32) with weights regenerated from `seed`."""
    import transformers

    arch = ARCHITECTURES.get(name, "Llama")
    config = getattr(transformers, f"{arch}Config")(attn_implementation="sdpa", **CONFIGS[name][0])
    torch.manual_seed(seed)
    model = getattr(transformers, f"{arch}ForCausalLM")(config).eval()
    real_models.regenerate(model, seed)
    return model


def prompt_for(name, length=19):
    """A fixed prompt of token ids below the vocabulary."""
    vocab = CONFIGS[name][0]["vocab_size"]
    g = torch.Generator().manual_seed(SEED + 7)
    return [int(t) for t in torch.randint(1, vocab, (length,), generator=g)]


def main():
    from kiln_executorch.llm import export_llm, greedy_reference

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--bench", default=os.environ.get("KILN_LLM_BENCH", ""),
                        help="comma list of configs to add (llama1b, llama1b_2l, qwen3_small)")
    parser.add_argument("--variants", default=os.environ.get("KILN_LLM_VARIANTS", ""),
                        help="comma list: export only these variants (fp32, bf16, bf16_int8, "
                             "bf16_int4) of each config")
    args = parser.parse_args()
    keep = {v for v in args.variants.split(",") if v}
    known = {v for config in CONFIGS.values() for v in config[3]}
    if keep - known:
        raise SystemExit(f"export_llm: unknown variants {sorted(keep - known)}; known: {sorted(known)}")
    args.out.mkdir(parents=True, exist_ok=True)
    names = ["small"] + [b for b in args.bench.split(",") if b]
    programs = {}
    for name in names:
        if name not in CONFIGS:
            raise SystemExit(f"export_llm: unknown config {name!r}; known: {sorted(CONFIGS)}")
        kwargs, max_context, prefill, precisions = CONFIGS[name]
        model = build(name)
        prompt = prompt_for(name)
        expected = greedy_reference(model, prompt, NEW_TOKENS)[0] if name == "small" else None
        digest = real_models.weights_digest(model)
        if name != "small":
            # Exported from bf16 weights (the same program as from fp32 with precision bf16):
            # half the memory, which a billion-parameter export needs on a small machine.
            model = model.to(torch.bfloat16)
        for variant in precisions:
            if keep and variant not in keep:
                continue
            # "bf16_int8": bf16 with int8 weights; "_host": methods over host tensors (the
            # default export is device-resident).
            precision, *options = variant.split("_")
            weights = next((o for o in options if o.startswith("int")), "")
            pte = args.out / f"{name}_{variant}.pte"
            info = export_llm(model, pte, max_context, prefill, precision=precision,
                              weights=weights or None, device_resident="host" not in options)
            programs[f"{name}_{variant}"] = {
                "file": pte.name, "config_name": name, "config": kwargs, "seed": SEED,
                "digest": digest, "precision": precision, "weights": weights or None,
                # The dtype of the weights the export quantized (check_llm.py fake-quantizes the
                # same values for its eager reference).
                "quantized_from": "fp32" if name == "small" else "bf16",
                "max_context": max_context, "prefill_length": prefill, "prompt": prompt,
                "new_tokens": NEW_TOKENS, "cpu_fp32_expected_tokens": expected,
                "methods": info["methods"]}
            print(f"wrote {pte} ({pte.stat().st_size / 2**20:.1f} MiB)", flush=True)
    (args.out / "meta.json").write_text(json.dumps({"programs": programs}, indent=1))


if __name__ == "__main__":
    main()
