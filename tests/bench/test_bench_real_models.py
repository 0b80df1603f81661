"""bench/real_models.py's weight regeneration (CPU only): deterministic, on its grid, with a
stable digest; the GPU machine rebuilds the eager models through the same code and compares
digests, so a change here must be a deliberate one."""
from __future__ import annotations

import sys
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import real_models  # noqa: E402

# The digest of TinyNet's regenerated weights. It changes only when the regeneration (or the
# torch CPU generator's integer draws) changes: then re-export every real model.
TINY_DIGEST = "eabb3882eb9353336ea0ee4a3e1570a025624ad611fe96268619b3d8ed6936ff"


class TinyNet(nn.Module):
    """One of each layer kind regenerate() treats apart, one weight larger than TILE."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(50, 16)
        self.conv = nn.Conv2d(3, 8, 3)
        self.bn = nn.BatchNorm2d(8)
        self.norm = nn.LayerNorm(16)
        self.fc = nn.Linear(1000, 20)  # 20000 values > TILE: repeats


def tiny() -> nn.Module:
    m = TinyNet()
    real_models.regenerate(m, seed=3)
    return m


def test_regeneration_is_deterministic_and_its_digest_stable():
    a, b = tiny(), tiny()
    assert real_models.weights_digest(a) == real_models.weights_digest(b) == TINY_DIGEST
    other = TinyNet()
    real_models.regenerate(other, seed=4)
    assert real_models.weights_digest(other) != TINY_DIGEST


def test_weights_are_few_values_scaled_like_the_default_init():
    m = tiny()
    w = m.fc.weight.detach()
    # +-2 magnitudes: four distinct values, std 1/sqrt(3 fan_in) as nn.Linear's default.
    assert torch.unique(w).numel() == 4
    assert abs(float(w.std()) * (3 * 1000) ** 0.5 - 1) < 0.05
    flat = w.flatten()
    assert torch.equal(flat[real_models.TILE:2 * real_models.TILE], flat[:real_models.TILE])
    assert not torch.equal(w[0], w[1])  # TILE is prime: rows differ
    assert torch.unique(m.embed.weight).numel() == 4
    with torch.no_grad():
        assert float(m.bn.running_var.min()) > 0.5 and float((m.bn.weight - 1).abs().max()) < 0.3
        assert float((m.norm.weight - 1).abs().max()) < 0.3
    assert m.bn.num_batches_tracked.item() == 0  # integer buffers are left alone


def test_digest_sees_every_bit():
    m = tiny()
    before = real_models.weights_digest(m)
    with torch.no_grad():
        flat = m.conv.weight.view(-1)
        flat[5] = torch.nextafter(flat[5], torch.tensor(10.0))
    assert real_models.weights_digest(m) != before
