"""Rotary position embedding in HF's rotate-half form as one kRope op: the slices, neg, cat,
multiplies and add the model wrote (and the head transpose before them) cost no op, x is read in
place from the projection output (a column block of the merged q/k projection), and the result
equals eager in every precision. Forms that are not rotate-half stay the ops they were."""

import pytest
import torch
from torch import nn

from kiln_executorch.aot import lower
from kiln_executorch.aot.blob_format import Opcode, UnaryKind
from kiln_testing.reference import run_program

from test_attention import blobs, cpu_ops, opcodes  # noqa: E402  (beside this file)
from test_operators import randn  # noqa: E402


def rotate_half(x):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


class Rotary(nn.Module):
    """HF Llama's attention prologue: q/k projections viewed [B, S, H, D] and transposed, cos/sin
    from the positions (inv_freq outer product), q * cos + rotate_half(q) * sin."""

    def __init__(self, width=64, heads=4, kv_heads=2, swap=False):
        super().__init__()
        self.h, self.kvh, self.d, self.swap = heads, kv_heads, width // heads, swap
        self.q = nn.Linear(width, width, bias=False)
        self.k = nn.Linear(width, kv_heads * self.d, bias=False)
        self.register_buffer("inv_freq", 1.0 / 10000 ** (torch.arange(0, self.d, 2) / self.d),
                             persistent=False)

    def forward(self, x, positions):
        b, s, _ = x.shape
        q = self.q(x).view(b, s, self.h, self.d).transpose(1, 2)
        k = self.k(x).view(b, s, self.kvh, self.d).transpose(1, 2)
        freqs = positions[:, :, None].float() * self.inv_freq[None, None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos()[:, None], emb.sin()[:, None]
        if self.swap:   # the other operand orders of the add and the multiplies
            return sin * rotate_half(q) + cos * q, rotate_half(k) * sin + k * cos
        return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin


def inputs(s=12):
    return randn(1, s, 64), torch.arange(3, 3 + s)[None]


@pytest.mark.parametrize("swap", [False, True])
def test_rope_is_one_op_reading_the_projection_in_place(swap):
    module, x = Rotary(swap=swap).eval(), inputs()
    program = lower(module, x).exported_program()
    assert cpu_ops(program) == []
    (graph,) = blobs(program)
    ops = opcodes(graph)
    assert ops.count(Opcode.ROPE) == 2, ops
    # No transpose, slice, cat or neg of q or k is left: the projections, the cos/sin math (the
    # positions' cast and cat(freqs, freqs) are its 3 copies) and the two ropes.
    assert ops.count(Opcode.COPY) == 3, ops
    assert UnaryKind.NEG not in [op.operands["kind"] for op in graph.ops
                                 if op.opcode == Opcode.UNARY], ops
    # q and k are one matmul (ops/matmul.py merges sibling projections read in place), so each
    # rope reads its column block of the [1, 12, 64 + 32] output: heads 16 apart, positions 96.
    assert ops.count(Opcode.MATMUL) == 1, ops
    q_rope, k_rope = (op for op in graph.ops if op.opcode == Opcode.ROPE)
    assert q_rope.operands["sizes"] == [1, 4, 12, 16]
    assert q_rope.operands["x_strides"] == [1152, 16, 96, 1]
    assert (q_rope.operands["x_offset"], k_rope.operands["x_offset"]) == (0, 64)
    rope = q_rope
    # cos/sin [1, 1, 12, 16] broadcast over the heads.
    assert rope.operands["cos_strides"][1] == 0
    actual = run_program(program, x)
    for a, e in zip(actual, module(*x)):
        torch.testing.assert_close(a, e, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("precision, tol", [("bf16", 3e-2), ("fp16", 5e-3)])
def test_rope_in_low_precision(precision, tol):
    module, x = Rotary().eval(), inputs()
    program = lower(module, x, precision=precision).exported_program()
    (graph,) = blobs(program)
    assert opcodes(graph).count(Opcode.ROPE) == 2
    for a, e in zip(run_program(program, x), module(*x)):
        torch.testing.assert_close(a, e, atol=tol, rtol=tol)


class NotRotateHalf(nn.Module):
    """Look-alikes that are not RoPE: halves in the wrong order, and a rotation of another
    tensor than the one multiplied by cos."""

    def forward(self, x, y, cos, sin):
        h = x.shape[-1] // 2
        wrong_order = x * cos + torch.cat((x[..., :h], -x[..., h:]), -1) * sin
        other = x * cos + rotate_half(y) * sin
        return wrong_order, other


def test_look_alikes_stay_the_ops_they_were():
    x = tuple(randn(1, 4, 6, 16) for _ in range(4))
    module = NotRotateHalf().eval()
    program = lower(module, x).exported_program()
    (graph,) = blobs(program)
    assert Opcode.ROPE not in opcodes(graph)
    for a, e in zip(run_program(program, x), module(*x)):
        torch.testing.assert_close(a, e, atol=1e-5, rtol=1e-5)
