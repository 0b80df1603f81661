"""Exports a tiny decoder-only language model with KilnPartitioner and writes its eager greedy
tokens, for examples/tiny_lm's C++ app.

    export_tiny_lm.py --out DIR [--new-tokens N] [--precision fp32]

The model: token + learned position embeddings, 2 pre-norm layers of 4-head attention with a
KV cache per layer (buffers updated with index_copy_, so the caches become state inside the Kiln
delegate) and a GELU MLP, a final norm and the vocabulary head; vocab 256, d_model 64, 64
positions, weights from torch.manual_seed(0). forward(token int64 [1,1], input_pos int64 [1]) ->
logits [1,1,256]; one call per token.

Writes DIR/tiny_lm.pte, DIR/prompt.txt and DIR/expected_tokens.txt (space-separated token ids:
the prompt fed one token at a time, then N tokens chosen greedily by eager PyTorch on the CPU)
and DIR/tiny_lm.json (the same, with the model's sizes).
"""

import argparse
import json
import math
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

VOCAB, D_MODEL, HEADS, LAYERS, MAX_SEQ = 256, 64, 4, 2, 64
PROMPT = [1, 72, 105, 33]


class Layer(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln1 = nn.LayerNorm(D_MODEL)
        self.q, self.k, self.v, self.o = (nn.Linear(D_MODEL, D_MODEL) for _ in range(4))
        self.ln2 = nn.LayerNorm(D_MODEL)
        self.fc1 = nn.Linear(D_MODEL, 4 * D_MODEL)
        self.fc2 = nn.Linear(4 * D_MODEL, D_MODEL)
        head = D_MODEL // HEADS
        self.register_buffer("k_cache", torch.zeros(1, HEADS, MAX_SEQ, head))
        self.register_buffer("v_cache", torch.zeros(1, HEADS, MAX_SEQ, head))

    def forward(self, x, input_pos):
        b, s, d = x.shape
        head = d // HEADS
        y = self.ln1(x)
        q, k, v = (p(y).view(b, s, HEADS, head).transpose(1, 2) for p in (self.q, self.k, self.v))
        self.k_cache.index_copy_(2, input_pos, k)
        self.v_cache.index_copy_(2, input_pos, v)
        scores = (q @ self.k_cache.transpose(2, 3)) * (1 / math.sqrt(head))
        scores = scores.masked_fill(torch.arange(MAX_SEQ) > input_pos, float("-inf"))
        a = torch.softmax(scores, -1) @ self.v_cache
        x = x + self.o(a.transpose(1, 2).reshape(b, s, d))
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class TinyLm(nn.Module):
    def __init__(self):
        super().__init__()
        self.tok = nn.Embedding(VOCAB, D_MODEL)
        self.pos = nn.Embedding(MAX_SEQ, D_MODEL)
        self.layers = nn.ModuleList(Layer() for _ in range(LAYERS))
        self.ln = nn.LayerNorm(D_MODEL)
        self.head = nn.Linear(D_MODEL, VOCAB)

    def forward(self, token, input_pos):
        x = self.tok(token) + self.pos(input_pos)
        for layer in self.layers:
            x = layer(x, input_pos)
        return self.head(self.ln(x))


def make_model():
    torch.manual_seed(0)
    return TinyLm().eval()


def greedy(model, prompt, new_tokens):
    """Feeds the prompt one token at a time, then appends the argmax token new_tokens times."""
    tokens = list(prompt)
    with torch.no_grad():
        for pos in range(len(prompt) + new_tokens - 1):
            logits = model(torch.tensor([[tokens[pos]]]), torch.tensor([pos]))
            if pos >= len(prompt) - 1:
                tokens.append(int(logits[0, -1].argmax()))
    return tokens


def write(out, new_tokens=32, precision="fp32"):
    """Exports the model to out/tiny_lm.pte and writes the prompt and eager greedy tokens beside
    it. Returns the tiny_lm.json contents."""
    from kiln_executorch.aot import export      # here: --help needs no executorch

    if len(PROMPT) + new_tokens > MAX_SEQ:
        raise ValueError(f"prompt + new tokens must fit in {MAX_SEQ} positions")
    out.mkdir(parents=True, exist_ok=True)
    pte = out / "tiny_lm.pte"
    export(make_model(), (torch.tensor([[PROMPT[0]]]), torch.tensor([0])), pte,
           precision=precision)
    tokens = greedy(make_model(), PROMPT, new_tokens)
    (out / "prompt.txt").write_text(" ".join(map(str, PROMPT)) + "\n")
    (out / "expected_tokens.txt").write_text(" ".join(map(str, tokens)) + "\n")
    meta = {"model": pte.name, "precision": precision, "prompt": PROMPT,
            "new_tokens": new_tokens, "expected_tokens": tokens, "vocab": VOCAB,
            "d_model": D_MODEL, "heads": HEADS, "layers": LAYERS, "max_seq": MAX_SEQ}
    (out / "tiny_lm.json").write_text(json.dumps(meta, indent=1))
    return meta


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--precision", default="fp32")
    args = parser.parse_args()
    meta = write(args.out, args.new_tokens, args.precision)
    print(f"wrote {args.out / meta['model']}; eager greedy tokens: "
          f"{' '.join(map(str, meta['expected_tokens']))}")


if __name__ == "__main__":
    main()
