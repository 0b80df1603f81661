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


def _lowered(module, inputs):
    from kiln_executorch.aot import lower
    from kiln_testing.blob_reader import read_blob

    program = lower(module.eval(), inputs).exported_program()
    cpu = [str(n.target) for n in program.graph.nodes if n.op == "call_function"
           and "getitem" not in str(n.target) and "call_delegate" not in str(n.target)]
    blobs = [read_blob(m.processed_bytes) for _, m in program.graph_module.named_children()
             if hasattr(m, "processed_bytes")]
    return cpu, blobs


def _attention_ops(blobs):
    from kiln_executorch.aot.blob_format import Opcode

    return [op.operands for g in blobs for op in g.ops if op.opcode == Opcode.ATTENTION]


def test_transformers_run_attention_fused_in_one_partition():
    # One layer of each real transformer (same code, fewer layers; ViT at a small size): SDPA is
    # one kAttention op per layer, in one Kiln partition with nothing left on the CPU.
    import torchvision

    bert = real_models._bert(layers=1)
    llama = real_models._llama(layers=1)
    vit = torchvision.models.VisionTransformer(image_size=32, patch_size=16, num_layers=1,
                                               num_heads=2, hidden_dim=32, mlp_dim=64)
    cases = [(bert, (torch.randint(0, 100, (1, 128)),), dict(heads_q=12, mask=-1, causal=0)),
             (llama, (torch.randint(0, 100, (1, 32)),), dict(heads_q=16, heads_kv=4, causal=1)),
             (vit, (torch.randn(1, 3, 32, 32),), dict(heads_q=2, seq_q=5, causal=0))]
    for module, inputs, want in cases:
        cpu, blobs = _lowered(module, inputs)
        assert cpu == [] and len(blobs) == 1, (type(module).__name__, cpu, len(blobs))
        (att,) = _attention_ops(blobs)
        assert {k: att[k] for k in want} == want, type(module).__name__
