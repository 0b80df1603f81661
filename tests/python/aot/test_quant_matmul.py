"""Weight-only quantization (KilnPartitioner(weights="int8"), and int4 in groups): the quantizer's
numbers, the
lowering of linear / mm / addmm with a constant weight (and an LLM's merged projections and LM
head) to kQuantMatmul, the reference interpreter's answers against torch on the dequantized
weights (tight: the same products in another order) and against the float model (looser: the
quantization error itself), and the refusals."""

import pytest
import torch
from torch import nn

from kiln_executorch import llm, quantize
from kiln_executorch.aot import KilnPartitioner, lower
from kiln_executorch.aot import blob_format as bf
from kiln_executorch.aot.backend import unwrap_state_keys
from kiln_testing.blob_reader import read_blob
from kiln_testing.reference import ReferenceProgram, run_program
from kiln_testing.reference.dense import _quantized_rows

from test_llm import MAX_CONTEXT, PREFILL, PROMPT, tiny_llama

# Against the float model: per-channel int8 moves each weight by at most scale / 2 =
# max|W[n, :]| / 254; these small models' outputs move by well under 2 % of their range.
FLOAT_RTOL = 2e-2


def _blobs(program):
    """The engine blobs (as IR) of every Kiln delegate of a lowered program."""
    return [read_blob(unwrap_state_keys(m.processed_bytes)[1])
            for _, m in program.graph_module.named_children() if hasattr(m, "processed_bytes")]


def _opcodes(graph):
    return [op.opcode for op in graph.ops]


class Block(nn.Module):
    """Linear + relu, a second linear with a residual add, and an mm / addmm of constants."""

    def __init__(self):
        super().__init__()
        self.up = nn.Linear(40, 24)
        self.down = nn.Linear(24, 40, bias=False)
        self.w = nn.Parameter(torch.randn(40, 9))
        self.b = nn.Parameter(torch.randn(9))

    def forward(self, x):
        h = x + self.down(torch.relu(self.up(x)))
        return torch.addmm(self.b, h, self.w), h @ self.w


def test_int8_scales_are_per_channel_max_over_127_and_a_zero_row_gets_one():
    w = torch.randn(5, 37)
    w[2] = 0
    w[3, 4] = 100.0
    packed, scales, bits, group = quantize.quantize(w)
    assert (bits, group) == (8, 37) and packed.dtype == torch.int32
    assert packed.shape == (5, 12)          # 37 bytes padded to 48 = 12 words
    want = w.abs().amax(1) / 127
    want[2] = 1
    assert torch.equal(scales.reshape(-1), want)
    q = quantize.unpack(packed, 37, 8)
    assert int(q.abs().max()) == 127 and int(q[3, 4]) == 127 and not q[2].any()
    assert torch.equal(q, torch.round(w / want[:, None]).clamp(-127, 127).to(torch.int8))
    assert not packed.view(torch.uint8)[:, 37:].any()         # the row padding is zero
    # The reference interpreter reads the packing independently.
    assert torch.equal(_quantized_rows(packed, 5, 37, 8), q.to(torch.int64))
    err = (quantize.fake_quantize(w) - w).abs()
    assert bool((err <= want[:, None] / 2 + 1e-6).all())


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_constant_weights_lower_to_quant_matmul_and_match_the_dequantized_model(precision):
    torch.manual_seed(0)
    model, x = Block().eval(), (torch.randn(3, 40),)
    program = lower(model, x, precision, weights="int8").exported_program()
    (g,) = _blobs(program)
    ops = [op for op in g.ops if op.opcode == bf.Opcode.QUANT_MATMUL]
    assert len(ops) == 4 and bf.Opcode.MATMUL not in _opcodes(g)
    up, down = ops[0], ops[1]
    assert up.operands["epilogue"] == bf.Epilogue.RELU          # relu fused, as for kMatmul
    assert down.operands["residual"] >= 0                       # x + down(..) fused
    for op in ops:
        assert g.tensors[op.operands["weight"]].dtype == torch.int32
        assert g.tensors[op.operands["scales"]].dtype == torch.float32   # in bf16 too
        assert (op.operands["bits"], op.operands["group_size"]) == (8, op.operands["K"])
    got = run_program(program, x, compute_dtype=torch.float32)
    fake = Block().eval()
    fake.load_state_dict(model.state_dict())
    quantize.fake_quantize_linears(fake)
    with torch.no_grad():
        fake.w.copy_(quantize.fake_quantize(model.w.t()).t())
        want, float_want = fake(*x), model(*x)
    tol = 1e-5 if precision == "fp32" else 3e-2
    for a, b, f in zip(got, want, float_want):
        assert a.dtype == torch.float32
        torch.testing.assert_close(a, b, atol=tol * float(b.abs().max()), rtol=0)
        assert float((a - f).abs().max()) <= FLOAT_RTOL * float(f.abs().max()) + tol
        assert float((a - f).abs().max()) > 0                   # it did quantize


def test_weights_none_is_unchanged_and_a_non_constant_weight_stays_a_matmul():
    torch.manual_seed(0)
    model, x = Block().eval(), (torch.randn(3, 40),)
    plain = _blobs(lower(model, x).exported_program())
    assert bf.Opcode.QUANT_MATMUL not in _opcodes(plain[0])

    class TwoInputs(nn.Module):
        def forward(self, a, b):
            return a @ b

    inputs = (torch.randn(4, 8), torch.randn(8, 5))
    program = lower(TwoInputs(), inputs, weights="int8").exported_program()
    (g,) = _blobs(program)
    assert _opcodes(g) == [bf.Opcode.MATMUL]
    torch.testing.assert_close(run_program(program, inputs)[0], inputs[0] @ inputs[1])


def test_an_unknown_weights_choice_is_refused_naming_the_choices():
    with pytest.raises(ValueError, match=r"weights='int3'; choose one of None, int8, int4, "
                                         r"int4_g64, int4_g32"):
        KilnPartitioner(weights="int3")


def test_tiny_llama_int8_quantizes_every_projection_and_the_lm_head():
    model = tiny_llama()
    edge = llm.lower_llm(model, MAX_CONTEXT, PREFILL, precision="fp32", weights="int8")
    for method in llm.METHODS:
        (g,) = _blobs(edge.exported_program(method))
        ops = [op for op in g.ops if op.opcode == bf.Opcode.QUANT_MATMUL]
        assert bf.Opcode.MATMUL not in _opcodes(g), method
        # Per layer: merged q/k/v, o, merged gate/up (or gate and up), down; then the LM head.
        widths = sorted({op.operands["N"] for op in ops})
        assert 256 in widths, widths                            # the LM head (vocab 256)
        assert 64 + 2 * 32 in widths, widths                    # q/k/v merged: 64 + 2 x 32
        assert len(ops) >= 2 * 4 + 1, len(ops)
    ref = ReferenceProgram(edge, torch.float32)
    tokens, logits = llm.run_generation(ref.run, PROMPT, 24, PREFILL, MAX_CONTEXT)
    fake = quantize.fake_quantize_linears(tiny_llama())
    want, want_logits = llm.greedy_reference(fake, PROMPT, 24)
    assert tokens == want
    err = max(float((a - b).abs().max()) for a, b in zip(logits, want_logits))
    assert err < 1e-4, err
    # Against the float model: the quantization error itself (stated tolerance).
    _, float_logits = llm.greedy_reference(model, PROMPT, 1)
    scale = float(float_logits[0].abs().max())
    assert float((logits[0] - float_logits[0]).abs().max()) <= FLOAT_RTOL * scale


def test_int4_groups_scale_by_max_over_7_and_pack_low_nibble_first():
    w = torch.randn(3, 64)
    w[1, 32:] = 0
    packed, scales, bits, group = quantize.quantize(w, "int4_g32")
    assert (bits, group) == (4, 32) and packed.shape == (3, 8) and scales.shape == (3, 2)
    want = w.reshape(3, 2, 32).abs().amax(2) / 7
    want[1, 1] = 1
    assert torch.equal(scales, want)
    q = quantize.unpack(packed, 64, 4)
    assert int(q.min()) >= -7 and int(q.max()) == 7 and not q[1, 32:].any()
    assert torch.equal(q, torch.round(w / want.repeat_interleave(32, 1)).clamp(-7, 7)
                       .to(torch.int8))
    first = int(packed.view(torch.uint8)[0, 0])
    assert (first & 0xF, first >> 4) == (int(q[0, 0]) & 0xF, int(q[0, 1]) & 0xF)
    assert torch.equal(_quantized_rows(packed, 3, 64, 4), q.to(torch.int64))
    assert quantize.supports("int4", 256) and not quantize.supports("int4", 96)
    assert quantize.supports("int4_g32", 96) and quantize.supports("int8", 37)


def test_int4_lowers_where_the_group_divides_k_and_matches_the_dequantized_model():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 24), nn.GELU(), nn.Linear(24, 5)).eval()
    x = (torch.randn(2, 64),)
    program = lower(model, x, weights="int4_g32").exported_program()
    (g,) = _blobs(program)
    ops = [op for op in g.ops if op.opcode in (bf.Opcode.QUANT_MATMUL, bf.Opcode.MATMUL)]
    assert [op.opcode for op in ops] == [bf.Opcode.QUANT_MATMUL, bf.Opcode.MATMUL]  # K = 24
    assert (ops[0].operands["bits"], ops[0].operands["group_size"]) == (4, 32)
    (got,) = run_program(program, x, compute_dtype=torch.float32)
    fake = nn.Sequential(nn.Linear(64, 24), nn.GELU(), nn.Linear(24, 5)).eval()
    fake.load_state_dict(model.state_dict())
    with torch.no_grad():
        fake[0].weight.copy_(quantize.fake_quantize(model[0].weight, "int4_g32"))
        want, float_want = fake(*x), model(*x)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    # int4 moves each weight by up to max|W| / 14 of its group: a looser bound on the float model.
    assert float((got - float_want).abs().max()) <= 0.1 * float(float_want.abs().max())


def test_tiny_llama_int4_gives_the_dequantized_models_greedy_tokens():
    edge = llm.lower_llm(tiny_llama(), MAX_CONTEXT, PREFILL, precision="fp32",
                         weights="int4_g32")
    (g,) = _blobs(edge.exported_program("decode"))
    assert bf.Opcode.MATMUL not in _opcodes(g)
    assert {op.operands["bits"] for op in g.ops if op.opcode == bf.Opcode.QUANT_MATMUL} == {4}
    ref = ReferenceProgram(edge, torch.float32)
    tokens, logits = llm.run_generation(ref.run, PROMPT, 16, PREFILL, MAX_CONTEXT)
    fake = quantize.fake_quantize_linears(tiny_llama(), "int4_g32")
    want, want_logits = llm.greedy_reference(fake, PROMPT, 16)
    assert tokens == want
    assert max(float((a - b).abs().max()) for a, b in zip(logits, want_logits)) < 1e-4
