"""The public fixture modules (../shared/fixtures/<name>/model.txt), re-created exactly.

Each builder returns a `Fixture`: the module in eval mode (weights seeded as model.txt says) and
the fixture's own recorded inputs (the first case: kv_cache_decode's step 1 on zeroed caches), so
the re-creation can be checked against the fixture's `expected_output_*.bin` and then exported
with Kiln. dynamic_mlp is the mlp module exported with a dynamic batch (see the tests).
"""

import json
import math
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

FIXTURES = Path(__file__).resolve().parents[3] / "shared" / "fixtures"

_DTYPES = {"float32": torch.float32, "int64": torch.int64}


@dataclass
class Fixture:
    name: str
    method: str
    module: nn.Module
    inputs: tuple
    expected: list          # eager reference outputs recorded in the fixture folder
    tolerance: dict         # {"atol", "rtol"} from meta.json


def _read_tensor(path, spec):
    data = bytearray(path.read_bytes())
    return torch.frombuffer(data, dtype=_DTYPES[spec["torch_dtype"]]).reshape(spec["shape"])


def _fixture(name, module, method="forward"):
    folder = FIXTURES / name
    meta = json.loads((folder / "meta.json").read_text())
    (plan,) = [m for m in meta["methods"] if m["name"] == method]
    case = plan["cases"][0]
    inputs = tuple(_read_tensor(folder / s["file"], s) for s in case["inputs"])
    expected = [_read_tensor(folder / s["file"], s) for s in case["outputs"]]
    return Fixture(name, method, module.eval(), inputs, expected, meta["tolerance"])


class Mlp(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(256, 512)
        self.relu = nn.ReLU()
        self.fc2 = nn.Linear(512, 10)

    def forward(self, x):
        return self.fc2(self.relu(self.fc1(x)))


class CnnSmall(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 16, 3, padding=1)
        self.bn = nn.BatchNorm2d(16)
        self.relu1 = nn.ReLU()
        self.pool = nn.MaxPool2d(2)
        self.conv2 = nn.Conv2d(16, 32, 3, padding=1)
        self.relu2 = nn.ReLU()
        self.gap = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(32, 10)

    def forward(self, x):
        x = self.pool(self.relu1(self.bn(self.conv1(x))))
        x = self.gap(self.relu2(self.conv2(x)))
        return self.fc(x.flatten(1))


class AddOne(nn.Module):
    def forward(self, x):
        return x + 1


class Coalesced(nn.Module):
    def forward(self, x):
        return torch.cos(torch.erfinv(torch.tanh(x)))


class TransformerBlock(nn.Module):
    def __init__(self, d_model=64, heads=4):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(d_model)
        self.q = nn.Linear(d_model, d_model)
        self.k = nn.Linear(d_model, d_model)
        self.v = nn.Linear(d_model, d_model)
        self.o = nn.Linear(d_model, d_model)
        self.ln2 = nn.LayerNorm(d_model)
        self.fc1 = nn.Linear(d_model, 4 * d_model)
        self.act = nn.GELU()
        self.fc2 = nn.Linear(4 * d_model, d_model)

    def forward(self, x):
        b, s, d = x.shape
        y = self.ln1(x)
        q, k, v = (p(y).view(b, s, self.heads, d // self.heads).transpose(1, 2)
                   for p in (self.q, self.k, self.v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.o(a.transpose(1, 2).reshape(b, s, d))
        return x + self.fc2(self.act(self.fc1(self.ln2(x))))


class EmbeddingLm(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(100, 32)
        self.proj = nn.Linear(32, 100)

    def forward(self, ids):
        return F.log_softmax(self.proj(self.emb(ids)), dim=-1)


class KvCacheDecode(nn.Module):
    def __init__(self, d=32, max_seq=32):
        super().__init__()
        self.wq, self.wk, self.wv, self.wo = (nn.Linear(d, d) for _ in range(4))
        self.register_buffer("k_cache", torch.zeros(1, max_seq, d))
        self.register_buffer("v_cache", torch.zeros(1, max_seq, d))

    def forward(self, x, input_pos):
        q, k, v = self.wq(x), self.wk(x), self.wv(x)
        self.k_cache.index_copy_(1, input_pos, k)
        self.v_cache.index_copy_(1, input_pos, v)
        s = (q @ self.k_cache.transpose(1, 2)) * (1 / math.sqrt(q.shape[-1]))
        s = s.masked_fill(torch.arange(self.k_cache.shape[1]) > input_pos, float("-inf"))
        return self.wo(torch.softmax(s, -1) @ self.v_cache)


class MultiMethodForward(nn.Module):
    def forward(self, x):
        return x * 2 + 1


class MultiMethodEncoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(16, 8)

    def forward(self, x):
        return self.lin(x)


class MultiMethod(nn.Module):
    def __init__(self):
        super().__init__()
        self.fwd = MultiMethodForward()
        self.enc = MultiMethodEncoder()


def mlp():
    torch.manual_seed(0)
    return _fixture("mlp", Mlp())


def cnn_small():
    torch.manual_seed(0)
    model = CnnSmall()
    g = torch.Generator().manual_seed(7)
    with torch.no_grad():
        model.bn.running_mean.copy_(0.2 * torch.randn(16, generator=g))
        model.bn.running_var.copy_(0.6 + 0.8 * torch.rand(16, generator=g))
        model.bn.weight.copy_(1 + 0.2 * torch.randn(16, generator=g))
        model.bn.bias.copy_(0.1 * torch.randn(16, generator=g))
    return _fixture("cnn_small", model)


def add_one():
    return _fixture("add_one", AddOne())


def coalesced():
    return _fixture("coalesced", Coalesced())


def transformer_block():
    torch.manual_seed(0)
    return _fixture("transformer_block", TransformerBlock())


def embedding_lm():
    torch.manual_seed(0)
    return _fixture("embedding_lm", EmbeddingLm())


def kv_cache_decode():
    """Step 1 of the fixture's decode sequence; the caches start as zeros. Running the module
    mutates its caches, so build a fresh one per use."""
    torch.manual_seed(0)
    return _fixture("kv_cache_decode", KvCacheDecode())


def multi_method():
    """Both methods of the multi_method fixture, as two Fixtures sharing one container."""
    torch.manual_seed(0)
    container = MultiMethod()
    return [_fixture("multi_method", container.fwd, "forward"),
            _fixture("multi_method", container.enc, "encode")]


def all_fixtures():
    """Every single-method fixture plus both multi_method methods, by "name" or "name.method"."""
    fixtures = [f() for f in (mlp, cnn_small, add_one, coalesced, transformer_block, embedding_lm,
                              kv_cache_decode)]
    fixtures += multi_method()
    return {f.name if f.name != "multi_method" else f"{f.name}.{f.method}": f for f in fixtures}


class PreNormBlock(nn.Module):
    """Not a fixture: a pre-norm self-attention block with a GELU MLP (width `hidden`), for the
    dynamic-sequence tests and exports. Weights come from torch.manual_seed(0)."""

    def __init__(self, d, hidden):
        super().__init__()
        torch.manual_seed(0)
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.q, self.k, self.v = nn.Linear(d, d), nn.Linear(d, d), nn.Linear(d, d)
        self.fc1, self.fc2 = nn.Linear(d, hidden), nn.Linear(hidden, d)
        self.scale = d ** -0.5

    def forward(self, x):
        h = self.ln1(x)
        att = torch.softmax(self.q(h) @ self.k(h).transpose(-1, -2) * self.scale, dim=-1)
        x = x + att @ self.v(h)
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))
