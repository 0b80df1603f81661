"""Bounded dynamic shapes: a partition with symbolic sizes becomes a variant set of
shape-specialised plans; each plan, run by the reference interpreter, gives eager's answer."""

import copy
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from kiln_executorch.aot import lower
from kiln_executorch.aot import blob_format as bf
from kiln_executorch.aot import builder
from kiln_executorch.aot.lowering import lower_graph
from kiln_testing.blob_reader import is_variant_set, read_blob, read_variant_set
from kiln_testing.reference import run_blob, run_program

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import models  # noqa: E402

Dim = torch.export.Dim


class Mlp(nn.Module):
    def __init__(self, d_in=32, hidden=64, d_out=8):
        super().__init__()
        torch.manual_seed(0)
        self.fc1, self.fc2 = nn.Linear(d_in, hidden), nn.Linear(hidden, d_out)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


def lowered(module, example, dynamic_shapes, precision="fp32", exclude_ops=None):
    edge = lower(module.eval(), example, precision, dynamic_shapes=dynamic_shapes,
                 exclude_ops=exclude_ops)
    program = edge.exported_program()
    blobs = [m.processed_bytes for _, m in program.graph_module.named_children()
             if hasattr(m, "processed_bytes")]
    return program, blobs


def partition_irs(module, example):
    """The lowered, unplanned IR of every Kiln partition of a static export."""
    program = lower(module.eval(), example).exported_program()
    return [lower_graph(m.original_module) for _, m in program.graph_module.named_children()
            if hasattr(m, "processed_bytes")]


def eager(module, x):
    with torch.no_grad():
        return copy.deepcopy(module).double()(x.double())


def test_dynamic_mlp_variant_set_shares_its_weights():
    program, (blob,) = lowered(Mlp(), (torch.randn(4, 32),), {"x": {0: Dim("b", min=1, max=6)}})
    assert is_variant_set(blob)
    variants, weights = read_variant_set(blob)
    assert [s for _, s in variants] == [[(b, 32)] for b in range(1, 7)]
    for variant, _ in variants:
        h = dict(zip(bf.HEADER_FIELDS, bf.HEADER.unpack_from(variant)))
        assert h["flags"] == bf.FLAG_EXTERNAL_WEIGHTS and h["weights_size"] == 0
        with pytest.raises(ValueError, match="external weights"):
            read_blob(variant)
        assert read_blob(variant, weights).tensors
    assert len(weights) >= (32 * 64 + 64 + 64 * 8 + 8) * 4
    assert len(blob) < len(weights) + 6 * 4096     # the weights are not repeated per variant


def test_variants_with_different_weights_keep_their_own():
    first, other = Mlp(), Mlp()
    with torch.no_grad():
        other.fc1.weight.add_(1.0)
    _, (a,) = lowered(first, (torch.randn(1, 32),), None)
    _, (b,) = lowered(other, (torch.randn(2, 32),), None)
    (ga,), (gb,) = partition_irs(first, (torch.randn(1, 32),)), partition_irs(other,
                                                                             (torch.randn(2, 32),))
    container = builder.build_variant_set([ga, gb])
    variants, shared = read_variant_set(container)
    assert shared is None and [v for v, _ in variants] == [a, b]
    x = torch.randn(2, 32)
    (actual,) = run_blob(container, [x])
    assert (actual.double() - eager(other, x)).abs().max().item() <= 1e-5


@pytest.mark.parametrize("precision, tol", [("fp32", 1e-5), ("bf16", 2e-2)])
def test_dynamic_mlp_variants_match_eager(precision, tol):
    module = Mlp()
    program, (blob,) = lowered(module, (torch.randn(4, 32),), {"x": {0: Dim("b", min=1, max=16)}},
                               precision)
    for b in (1, 7, 16):
        x = torch.randn(b, 32, generator=torch.Generator().manual_seed(b))
        (actual,) = run_program(program, [x])
        expected = eager(module, x)
        assert actual.shape == (b, 8) and actual.dtype == torch.float32
        err = (actual.double() - expected).abs().max().item()
        assert err <= tol * max(1.0, expected.abs().max().item()), (b, err)


def test_dynamic_sequence_block_variants_match_eager():
    module = models.PreNormBlock(16, 32)
    program, blobs = lowered(module, (torch.randn(1, 8, 16),),
                             {"x": {1: Dim("seq", min=1, max=32)}})
    assert len(blobs) == 1 and len(read_variant_set(blobs[0])[0]) == 32
    for t in (1, 17, 32):
        x = torch.randn(1, t, 16, generator=torch.Generator().manual_seed(t))
        (actual,) = run_program(program, [x])
        assert actual.shape == (1, t, 16)
        assert (actual.double() - eager(module, x)).abs().max().item() <= 1e-5


def test_shape_no_variant_serves_is_an_error():
    _, (blob,) = lowered(Mlp(), (torch.randn(4, 32),), {"x": {0: Dim("b", min=1, max=4)}})
    with pytest.raises(ValueError, match=r"no variant serves input shapes \[\(5, 32\)\]"):
        run_blob(blob, [torch.randn(5, 32)])


def test_too_many_combinations_stay_on_cpu():
    module = nn.ReLU()
    dims = {"input": {0: Dim("a", min=1, max=10), 1: Dim("b", min=1, max=10)}}
    program, blobs = lowered(module, (torch.randn(4, 5),), dims)
    assert blobs == []


def test_unbounded_dim_stays_on_cpu():
    program, blobs = lowered(Mlp(), (torch.randn(4, 32),), {"x": {0: Dim("b")}})
    assert blobs == []
    assert any("addmm" in str(n.target) for n in program.graph.nodes)


def test_static_partition_is_still_a_plain_blob():
    _, (blob,) = lowered(Mlp(), (torch.randn(4, 32),), None)
    assert not is_variant_set(blob) and blob[:8] == bf.MAGIC


def test_two_symbols_give_every_combination():
    class Fn(nn.Module):
        def forward(self, x, y):
            return torch.relu(x) @ y.transpose(0, 1)

    module = Fn()
    dims = ({0: Dim("m", min=1, max=6)}, {0: Dim("n", min=1, max=6)})
    program, (blob,) = lowered(module, (torch.randn(4, 6), torch.randn(5, 6)), dims)
    assert len(read_variant_set(blob)[0]) == 36
    for m, n in ((1, 6), (3, 2), (6, 6)):
        x, y = torch.randn(m, 6), torch.randn(n, 6)
        (actual,) = run_program(program, [x, y])
        assert (actual - module(x, y)).abs().max().item() <= 1e-5


def test_a_size_crossing_a_partition_boundary_stays_on_cpu():
    """sym_size(x) feeds views on both sides of erfinv (excluded, so it runs on the CPU): a
    delegate cannot take or return a SymInt, so both partitions are declined and the program still
    runs. With Kiln running erfinv the size never leaves the one partition."""
    class Fn(nn.Module):
        def forward(self, x):
            b = x.shape[0]
            z = torch.erfinv(torch.tanh(x.reshape(b, -1)) * 0.5)
            return (torch.cos(z).reshape(b, 2, -1) * 2).sum(-1)

    module = Fn()
    example, dims = (torch.randn(4, 2, 6),), ({0: Dim("b", min=1, max=8)},)
    program, blobs = lowered(module, example, dims, exclude_ops=["aten::erfinv"])
    assert blobs == []
    x = torch.randn(3, 2, 6)
    (actual,) = run_program(program, [x])
    assert (actual - module(x)).abs().max().item() <= 1e-5
    program, blobs = lowered(module, example, dims)
    assert len(blobs) == 1 and is_variant_set(blobs[0])
    (actual,) = run_program(program, [x])
    assert (actual - module(x)).abs().max().item() <= 1e-5
