"""Elementwise-chain fusion (the C++ builder's fuse_elementwise pass): which chains become one
kFusedElementwise op, which stay apart, and that fused programs compute exactly what the unfused
ops compute (the reference interpreter, fp32 and bf16) for the fixture models and
mobilenet_v3_small."""

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import models  # noqa: E402
from test_lowering import Fn, partitions  # noqa: E402

from kiln_executorch.aot.blob_format import (FUSED_INSTR_WIDTH, BinaryKind, DType,  # noqa: E402
                                             FusedForm, Opcode, Precision, UnaryKind)
from kiln_executorch.aot import lower  # noqa: E402
from kiln_executorch.aot.backend import build_blob  # noqa: E402
from kiln_testing.blob_reader import read_blob  # noqa: E402
from kiln_testing.reference import run_blob, run_program  # noqa: E402

FIXTURES = models.all_fixtures()


def built(module, inputs, precision="fp32", fuse=True):
    """[(graph, blob)] of every Kiln partition, built with or without fusion."""
    out = []
    for ep, _ in partitions(module, inputs, precision):
        blob = build_blob(ep, Precision[precision.upper()], fuse=fuse)
        out.append((read_blob(blob), blob))
    return out


def only(module, inputs, precision="fp32", fuse=True):
    (pair,) = built(module, inputs, precision, fuse)
    return pair


def opcodes(g):
    return [op.opcode for op in g.ops]


def instructions(op):
    p = op.operands["program"]
    return [p[i:i + FUSED_INSTR_WIDTH] for i in range(0, len(p), FUSED_INSTR_WIDTH)]


def hardswish_chain(x):
    return x * torch.clamp(x + 3, 0, 6) / 6


def test_hardswish_chain_is_one_op():
    x = torch.randn(2, 8, 5, 5)
    g, blob = only(Fn(hardswish_chain), (x,))
    assert opcodes(g) == [Opcode.FUSED_ELEMENTWISE]
    op = g.ops[0]
    assert op.operands["num_inputs"] == 1 and op.operands["num_instrs"] == 4
    forms = [(FusedForm(i[0]), i[1]) for i in instructions(op)]
    assert forms == [(FusedForm.BINARY, BinaryKind.ADD), (FusedForm.UNARY, UnaryKind.CLAMP),
                     (FusedForm.BINARY, BinaryKind.MUL), (FusedForm.BINARY, BinaryKind.DIV)]
    # Registers: 0 is x; instruction j writes 1 + j.
    assert [i[2:5] for i in instructions(op)] == [[0, -1, -1], [1, -1, -1], [0, 2, -1],
                                                   [3, -1, -1]]
    assert all(i[7] == DType.FLOAT32 for i in instructions(op))
    assert g.arena_size == 0        # the intermediates are gone from the arena
    assert read_blob(blob).ops[0].operands == op.operands
    (out,) = run_blob(blob, [x])
    torch.testing.assert_close(out, hardswish_chain(x))


def test_bf16_chain_rounds_each_step_like_the_unfused_ops():
    x = torch.randn(4, 33) * 4
    g, blob = only(Fn(lambda x: torch.sigmoid(x * 1.7 + 0.3) * x), (x,), "bf16")
    (fused,) = [op for op in g.ops if op.opcode == Opcode.FUSED_ELEMENTWISE]
    assert {i[7] for i in instructions(fused)[:-1]} == {DType.BFLOAT16}
    _, plain = only(Fn(lambda x: torch.sigmoid(x * 1.7 + 0.3) * x), (x,), "bf16", fuse=False)
    for compute in (torch.float64, torch.float32):
        assert torch.equal(run_blob(blob, [x], compute)[0], run_blob(plain, [x], compute)[0])


def test_broadcast_inputs_are_read_with_their_strides():
    x, bias, scale = torch.randn(2, 8, 5, 5), torch.randn(8, 1, 1), torch.randn(5)
    fn = Fn(lambda x, b, s: torch.relu(x + b) * s - 1)
    g, blob = only(fn, (x, bias, scale))
    assert opcodes(g) == [Opcode.FUSED_ELEMENTWISE]
    assert g.ops[0].operands["num_inputs"] == 3
    torch.testing.assert_close(run_blob(blob, [x, bias, scale])[0], fn(x, bias, scale))


def test_where_with_a_bool_condition_fuses():
    x, y = torch.randn(3, 16), torch.randn(16)
    fn = Fn(lambda x, y: torch.where(x > 0, torch.exp(x), y) + 1)
    g, blob = only(fn, (x, y))
    assert opcodes(g) == [Opcode.BINARY, Opcode.FUSED_ELEMENTWISE]  # the compare stays apart
    assert [FusedForm(i[0]) for i in instructions(g.ops[1])].count(FusedForm.WHERE) == 1
    torch.testing.assert_close(run_blob(blob, [x, y])[0], fn(x, y))


def test_an_intermediate_that_is_an_output_is_not_fused_across():
    x = torch.randn(4, 8)
    fn = Fn(lambda x: ((y := x + 3), torch.relu(y) * 2))
    g, blob = only(fn, (x,))
    assert opcodes(g) == [Opcode.BINARY, Opcode.FUSED_ELEMENTWISE]
    assert g.ops[1].operands["inputs"] == [g.ops[0].operands["out"]]
    assert g.ops[1].operands["num_instrs"] == 2
    for got, want in zip(run_blob(blob, [x]), fn(x)):
        torch.testing.assert_close(got, want)


def test_an_intermediate_read_twice_is_not_fused_across():
    x = torch.randn(4, 8)
    fn = Fn(lambda x: torch.sin(y := x + 1) * torch.cos(y))
    g, blob = only(fn, (x,))
    assert opcodes(g) == [Opcode.BINARY, Opcode.FUSED_ELEMENTWISE]
    assert g.ops[1].operands["inputs"] == [g.ops[0].operands["out"]]
    assert g.ops[1].operands["num_instrs"] == 3
    torch.testing.assert_close(run_blob(blob, [x])[0], fn(x))


def test_a_broadcast_intermediate_stays_its_own_op():
    # sigmoid(w) has 8 elements and is read broadcast: fusing it would recompute it per element.
    x, w = torch.randn(2, 8, 3, 3), torch.randn(8, 1, 1)
    fn = Fn(lambda x, w: x * torch.sigmoid(w) + 1)
    g, blob = only(fn, (x, w))
    assert opcodes(g) == [Opcode.UNARY, Opcode.FUSED_ELEMENTWISE]
    torch.testing.assert_close(run_blob(blob, [x, w])[0], fn(x, w))


def test_integer_chains_stay_unfused():
    x = torch.randint(-5, 5, (4, 8))
    g, _ = only(Fn(lambda x: torch.abs(x + 1) * 3), (x,))
    assert Opcode.FUSED_ELEMENTWISE not in opcodes(g)


def test_long_chains_split_at_the_instruction_limit():
    x = torch.randn(64)

    def chain(x):
        for i in range(40):
            x = x * 1.01 + 0.01
        return x

    g, blob = only(Fn(chain), (x,))
    assert all(op.opcode == Opcode.FUSED_ELEMENTWISE for op in g.ops)
    assert all(op.operands["num_instrs"] <= 16 for op in g.ops)
    assert sum(op.operands["num_instrs"] for op in g.ops) == 80
    _, plain = only(Fn(chain), (x,), fuse=False)
    assert torch.equal(run_blob(blob, [x])[0], run_blob(plain, [x])[0])


def _same_results(module, inputs, precision):
    """Runs the lowered program with fused and with unfused blobs; they must agree bit for bit.
    Returns (ops without fusion, ops with fusion, the fused run's outputs)."""
    program = lower(module, inputs, precision).exported_program()
    eps = [m.original_module for _, m in program.graph_module.named_children()
           if hasattr(m, "processed_bytes")]
    plain = [build_blob(ep, Precision[precision.upper()], fuse=False) for ep in eps]
    fused = [build_blob(ep, Precision[precision.upper()]) for ep in eps]
    for gf, gp in zip(map(read_blob, fused), map(read_blob, plain)):
        assert gf.arena_size <= gp.arena_size
    want = run_program(program, inputs, plain)
    got = run_program(program, inputs, fused)
    for a, b in zip(got, want):
        assert torch.equal(a, b)
    return (sum(len(read_blob(b).ops) for b in plain), sum(len(read_blob(b).ops) for b in fused),
            got)


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("name", sorted(FIXTURES))
def test_fixtures_fused_equals_unfused(name, precision):
    f = FIXTURES[name]
    before, after, _ = _same_results(f.module, f.inputs, precision)
    assert after <= before


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_mobilenet_v3_small(precision):
    import torchvision
    torch.manual_seed(0)
    module = torchvision.models.mobilenet_v3_small(weights=None).eval()
    x = torch.randn(1, 3, 64, 64)
    before, after, (got,) = _same_results(module, (x,), precision)
    assert after < before * 0.8     # hardswish / hardsigmoid * x chains
    tol = dict(atol=1e-4, rtol=1e-4) if precision == "fp32" else dict(atol=5e-2, rtol=5e-2)
    torch.testing.assert_close(got, module(x), **tol)


def test_hf_llama_rms_norm_is_one_layer_norm_op():
    """HF's own LlamaRMSNorm (pow, mean, add, rsqrt, mul, mul in the export) becomes one
    kLayerNorm with rms set, and computes eager's answer in fp32 and bf16."""
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    norm = LlamaRMSNorm(300, eps=1e-6).eval()
    with torch.no_grad():
        norm.weight.copy_(torch.randn(300) * 0.3 + 1)
    x = torch.randn(2, 5, 300) * 3
    for precision in ("fp32", "bf16"):
        g, blob = only(norm, (x,), precision)
        norms = [op for op in g.ops if op.opcode == Opcode.LAYER_NORM]
        assert len(norms) == 1 and norms[0].operands["rms"] == 1, opcodes(g)
        assert norms[0].operands["weight"] >= 0 and norms[0].operands["cols"] == 300
        assert not any(op.opcode in (Opcode.REDUCE, Opcode.UNARY) for op in g.ops), opcodes(g)
    with torch.no_grad():
        expected = norm(x)
    (actual,) = run_program(lower(norm, (x,)).exported_program(), (x,))
    torch.testing.assert_close(actual, expected, atol=1e-5, rtol=1e-5)


def test_rms_chain_with_a_shared_intermediate_is_not_fused():
    """When the mean of squares is also returned, the chain stays as its ops (the fused op would
    not write that intermediate)."""
    def fn(x):
        ms = x.pow(2).mean(-1, keepdim=True)
        return x * torch.rsqrt(ms + 1e-5), ms

    g, _ = only(Fn(fn), (torch.randn(4, 64),))
    assert Opcode.LAYER_NORM not in opcodes(g)
