"""Exports a HF transformers Llama decoder (random weights from a LlamaConfig, nothing downloads)
into one .pte with `prefill` and `decode` methods sharing the KV cache on the GPU, for kiln_llm.

    export_llama.py --out DIR [--layers 2] [--hidden 256] [--heads 8] [--kv-heads 2]
                    [--ffn 512] [--vocab 1024] [--max-context 256] [--prefill 32]
                    [--precision bf16] [--new-tokens 32]

Writes DIR/llama.pte, DIR/prompt.txt (token ids) and DIR/expected_tokens.txt: eager HF's greedy
continuation on the CPU in fp32 (a bf16 program may differ where two logits nearly tie).
"""

import argparse
from pathlib import Path

import torch


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, type=Path)
    for name, default in (("layers", 2), ("hidden", 256), ("heads", 8), ("kv-heads", 2),
                          ("ffn", 512), ("vocab", 1024), ("max-context", 256), ("prefill", 32),
                          ("new-tokens", 32)):
        parser.add_argument(f"--{name}", type=int, default=default)
    parser.add_argument("--precision", default="bf16", choices=["fp32", "tf32", "fp16", "bf16"])
    args = parser.parse_args()

    from transformers import LlamaConfig, LlamaForCausalLM

    from kiln_executorch.llm import export_llm, greedy_reference

    config = LlamaConfig(num_hidden_layers=args.layers, hidden_size=args.hidden,
                         num_attention_heads=args.heads, num_key_value_heads=args.kv_heads,
                         intermediate_size=args.ffn, vocab_size=args.vocab,
                         max_position_embeddings=max(4096, args.max_context),
                         attn_implementation="sdpa")
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).eval()
    args.out.mkdir(parents=True, exist_ok=True)
    info = export_llm(model, args.out / "llama.pte", args.max_context, args.prefill,
                      precision=args.precision)
    prompt = [int(t) for t in torch.randint(1, args.vocab, (20,),
                                            generator=torch.Generator().manual_seed(1))]
    expected = greedy_reference(model, prompt, args.new_tokens)[0]
    (args.out / "prompt.txt").write_text(" ".join(map(str, prompt)) + "\n")
    (args.out / "expected_tokens.txt").write_text(" ".join(map(str, expected)) + "\n")
    print(f"wrote {args.out / 'llama.pte'}: {info['methods']}")


if __name__ == "__main__":
    main()
