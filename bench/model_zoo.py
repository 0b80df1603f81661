"""The models the GPU check and the benchmark run: the public fixture modules (tests/python/models.py)
plus torchvision's resnet18 and mobilenet_v3_small and a 2-layer transformer encoder, all with
seeded random weights. `build(key)` gives the module (eval mode) and its example inputs, for the
real models of bench/real_models.py too; the weights do not travel to the GPU machine: it rebuilds
each module from the same seed, so only the classes are needed there."""
from __future__ import annotations

import sys
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "python"))
import models as fixture_models  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
import real_models  # noqa: E402


class Encoder2(nn.Module):
    """nn.TransformerEncoder, 2 layers, d_model 256, 4 heads, batch-first, sequence 32."""

    def __init__(self):
        super().__init__()
        layer = nn.TransformerEncoderLayer(256, 4, dim_feedforward=1024, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False)

    def forward(self, x):
        return self.encoder(x)


def _torchvision(name):
    import torchvision

    return getattr(torchvision.models, name)(weights=None)


# key -> (constructor, example input shapes and dtypes)
ZOO = {
    "add_one": (fixture_models.AddOne, [((64, 64), torch.float32)]),
    "mlp": (fixture_models.Mlp, [((8, 256), torch.float32)]),
    "cnn_small": (fixture_models.CnnSmall, [((1, 3, 32, 32), torch.float32)]),
    "coalesced": (fixture_models.Coalesced, [((64, 64), torch.float32)]),
    "transformer_block": (fixture_models.TransformerBlock, [((1, 16, 64), torch.float32)]),
    "embedding_lm": (fixture_models.EmbeddingLm, [((1, 12), torch.int64)]),
    "multi_method_encode": (fixture_models.MultiMethodEncoder, [((4, 16), torch.float32)]),
    "multi_method_forward": (fixture_models.MultiMethodForward, [((4, 16), torch.float32)]),
    "resnet18": (lambda: _torchvision("resnet18"), [((1, 3, 224, 224), torch.float32)]),
    "mobilenet_v3_small": (lambda: _torchvision("mobilenet_v3_small"), [((1, 3, 224, 224), torch.float32)]),
    "transformer_encoder": (Encoder2, [((1, 32, 256), torch.float32)]),
}


def build(key: str, seed: int = 0):
    if key in real_models.REAL:
        return real_models.build(key, seed)
    ctor, specs = ZOO[key]
    torch.manual_seed(seed)
    module = ctor().eval()
    g = torch.Generator().manual_seed(seed + 1)
    inputs = []
    for shape, dtype in specs:
        if dtype == torch.int64:
            inputs.append(torch.randint(0, 100, shape, generator=g))
        else:
            inputs.append(torch.randn(shape, generator=g))
    # Freshly constructed batch norms are the identity (mean 0, variance 1, weight 1, bias 0), which
    # leaves deep CNNs with vanishing outputs and hides folding errors: give them real statistics.
    with torch.no_grad():
        for m in module.modules():
            if isinstance(m, nn.BatchNorm2d):
                n = m.num_features
                m.running_mean.copy_(0.2 * torch.randn(n, generator=g))
                m.running_var.copy_(0.6 + 0.8 * torch.rand(n, generator=g))
                m.weight.copy_(1 + 0.2 * torch.randn(n, generator=g))
                m.bias.copy_(0.1 * torch.randn(n, generator=g))
    return module, tuple(inputs)


def weights_checksum(module: nn.Module) -> float:
    """Sum of every floating-point weight and buffer: equal on both machines when the seeded
    construction gave the same weights."""
    return float(sum(t.double().sum() for t in module.state_dict().values() if t.is_floating_point()))
