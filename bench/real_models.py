"""Real models for the benchmark, beside the zoo (bench/model_zoo.py): torchvision resnet50,
mobilenet_v2, efficientnet_b0 and vit_b_16 at batch 1, 224x224; HF transformers BERT-base
(sequence 128) and a Llama-architecture decoder prefill (8 layers, width 1024, 32 tokens, logits
out, no cache). Nothing downloads: the architectures come from their classes and configs.

Every floating-point weight and buffer is regenerated from the seed (`regenerate`), not left to
the library's initialisation, for two reasons:
- the programs embed the weights and must travel to the GPU machine (resnet50 fp32 is ~100 MB a
  program): each tensor takes a few distinct magnitudes times a random sign, scaled per tensor
  like PyTorch's default initialisation (so activations stay sane), which xz packs to a few bits a
  value;
- the GPU machine rebuilds the eager model for the torch timings with its own torch and
  torchvision/transformers: values drawn with integer draws of a CPU generator seeded per tensor
  name do not depend on how a library version initialises or in what order, and
  `weights_digest` (SHA-256 of every tensor's name, shape, dtype and bytes) proves both sides
  hold the same weights.
"""
from __future__ import annotations

import hashlib
import zlib

import torch
from torch import nn

SEED = 0
# Two magnitudes times a random sign: 4 values a tensor (2 bits), mean square 1.
GRID = torch.tensor([1.0, 2.0]) / (2.5 ** 0.5)
TILE = 8191


class HiddenStates(nn.Module):
    """An HF encoder (BertModel) returning its last hidden state as a plain tensor. The attention
    mask (all zeros: one unpadded sequence) is handed in ready-made, 4-D and additive, as HF
    takes it as-is: otherwise HF builds it from the input on every call, with index, cumsum and
    comparison ops that stay on the CPU between Kiln partitions."""

    def __init__(self, model, seq: int):
        super().__init__()
        self.model = model
        self.register_buffer("mask", torch.zeros(1, 1, seq, seq), persistent=False)
        # (Token types too: BERT's default gathers them from a buffer.)
        self.register_buffer("token_types", torch.zeros(1, seq, dtype=torch.int64), persistent=False)

    def forward(self, input_ids):
        return self.model(input_ids=input_ids, attention_mask=self.mask,
                          token_type_ids=self.token_types).last_hidden_state


class Logits(nn.Module):
    """An HF causal LM's prefill: logits for every position, no KV cache. The causal mask
    (additive, -1e9 above the diagonal) and the positions are handed in ready-made, for the
    same reason as HiddenStates'. With SDPA attention HF then repeats the key/value heads
    (repeat_kv) and passes the mask; Kiln reads both back as one causal, grouped-query
    kAttention op."""

    def __init__(self, model, seq: int):
        super().__init__()
        self.model = model
        causal = torch.full((seq, seq), -1e9).triu(1)
        self.register_buffer("mask", causal[None, None], persistent=False)
        self.register_buffer("positions", torch.arange(seq)[None], persistent=False)

    def forward(self, input_ids):
        # The decoder, then the LM head over every position, as LlamaForCausalLM.forward does
        # (whose slice of the positions to keep, all of them here, exports as an alias op that
        # Kiln leaves to the CPU).
        hidden = self.model.model(input_ids=input_ids, attention_mask=self.mask,
                                  position_ids=self.positions, use_cache=False).last_hidden_state
        return self.model.lm_head(hidden)


def _torchvision(name):
    import torchvision

    return getattr(torchvision.models, name)(weights=None)


def _bert(layers: int = 12):
    from transformers import BertConfig, BertModel

    # BERT-base (12 layers, width 768, 12 heads); HF's default SDPA attention, which Kiln runs
    # as one kAttention op per layer (the all-zeros mask folds away). `layers`: fewer, for tests.
    config = BertConfig(num_hidden_layers=layers, attn_implementation="sdpa")
    return HiddenStates(BertModel(config, add_pooling_layer=False), 128)


def _llama(layers: int = 8):
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(num_hidden_layers=layers, hidden_size=1024, num_attention_heads=16,
                         num_key_value_heads=4, intermediate_size=2816, vocab_size=32000,
                         max_position_embeddings=2048, attn_implementation="sdpa")
    return Logits(LlamaForCausalLM(config), 32)


IMAGE = [((1, 3, 224, 224), torch.float32)]
# key -> (constructor, example input shapes and dtypes); int64 inputs are token ids < vocab.
REAL = {
    "resnet50": (lambda: _torchvision("resnet50"), IMAGE),
    "mobilenet_v2": (lambda: _torchvision("mobilenet_v2"), IMAGE),
    "efficientnet_b0": (lambda: _torchvision("efficientnet_b0"), IMAGE),
    "vit_b_16": (lambda: _torchvision("vit_b_16"), IMAGE),
    "bert_base": (_bert, [((1, 128), torch.int64)]),
    "llama_prefill": (_llama, [((1, 32), torch.int64)]),
}
VOCAB = {"bert_base": 30522, "llama_prefill": 32000}
# Models with convolutions (PyTorch's default fp32 runs them in TF32).
CONV = {"resnet50", "mobilenet_v2", "efficientnet_b0", "vit_b_16"}


def _generator(seed: int, name: str) -> torch.Generator:
    # (The CPU generator's Mersenne Twister keeps 32 bits of a seed: mix the seed into them.)
    return torch.Generator().manual_seed(zlib.crc32(f"{seed}:{name}".encode()))


def _grid(shape, scale: float, g: torch.Generator) -> torch.Tensor:
    """Values +-GRID[i] * scale, drawn with integer draws only (the same on every torch). A tensor
    larger than TILE values repeats its first TILE values (TILE is prime, so the repeats shift
    against every row length and no two rows of a weight matrix are equal): xz stores each repeat
    as one cheap match, which random values of any grid would not allow."""
    n = 1
    for d in shape:
        n *= d
    drawn = min(n, TILE)
    sign = torch.randint(0, 2, (drawn,), generator=g).float() * 2 - 1
    mag = GRID[torch.randint(0, len(GRID), (drawn,), generator=g)]
    v = sign * mag * scale
    return v.repeat(-(-n // drawn))[:n].reshape(shape)


def _norm_owners(module: nn.Module) -> dict:
    """name of each normalisation layer's weight/bias/stat -> the layer."""
    out = {}
    for mname, m in module.named_modules():
        cls = type(m).__name__
        if isinstance(m, (nn.BatchNorm2d, nn.LayerNorm, nn.GroupNorm)) or cls.endswith(("RMSNorm", "LayerNorm")):
            for pname, _ in list(m.named_parameters(recurse=False)) + list(m.named_buffers(recurse=False)):
                out[f"{mname}.{pname}" if mname else pname] = m
    return out


def regenerate(module: nn.Module, seed: int = SEED) -> None:
    """Overwrites every floating-point parameter and buffer of `module` with seeded grid values.

    Weights of rank >= 2: std 1/sqrt(3 fan_in) as PyTorch's default (kaiming-uniform, a=sqrt(5))
    gives, except embeddings (std 1, as nn.Embedding). Normalisation weights near 1, biases
    and shifts small; batch-norm running statistics as real ones (mean near 0, variance 0.6..1.4),
    which also keeps folding errors visible. Other vectors (biases, class tokens, position
    embeddings): std 0.1 of the same grid."""
    norms = _norm_owners(module)
    embeddings = {f"{n}.weight" for n, m in module.named_modules() if isinstance(m, nn.Embedding)}
    with torch.no_grad():
        for name, t in module.state_dict(keep_vars=True).items():
            if not t.is_floating_point():
                continue
            g = _generator(seed, name)
            leaf = name.rsplit(".", 1)[-1]
            if name in norms:
                if leaf == "running_var":
                    v = 1.0 + _grid(t.shape, 0.3, g)
                elif leaf == "weight":
                    v = 1.0 + _grid(t.shape, 0.15, g)
                else:  # bias, running_mean
                    v = _grid(t.shape, 0.1, g)
            elif name in embeddings:
                v = _grid(t.shape, 1.0, g)
            elif t.dim() >= 2 and t.shape[0] > 1 and t[0].numel() > 1:
                fan_in = t[0].numel()
                v = _grid(t.shape, (3 * fan_in) ** -0.5, g)
            else:
                v = _grid(t.shape, 0.1, g)
            t.copy_(v.to(t.dtype))


def weights_digest(module: nn.Module) -> str:
    """SHA-256 over every state_dict entry's name, shape, dtype and bytes."""
    h = hashlib.sha256()
    for name, t in module.state_dict().items():
        t = t.detach().cpu().contiguous()
        h.update(f"{name}:{tuple(t.shape)}:{t.dtype}\n".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def build(key: str, seed: int = SEED):
    """The model (eval mode, regenerated weights) and its seeded example inputs."""
    ctor, specs = REAL[key]
    module = ctor().eval()
    regenerate(module, seed)
    g = torch.Generator().manual_seed(seed + 1)
    inputs = []
    for shape, dtype in specs:
        if dtype == torch.int64:
            inputs.append(torch.randint(0, VOCAB[key], shape, generator=g))
        else:
            inputs.append(torch.randn(shape, generator=g))  # travels as a file
    return module, tuple(inputs)
