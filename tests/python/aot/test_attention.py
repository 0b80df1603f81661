"""aten.scaled_dot_product_attention as one kAttention op: kept whole through
to_edge_transform_and_lower, q/k/v read in place through their strides, HF's repeat_kv read as
grouped-query attention, constant masks folded, the transpose back after it folded into its out
strides, bf16, and the reasons explain() gives when Kiln
refuses (the node then decomposes as before and the pieces still run on Kiln)."""

import operator

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from kiln_executorch.aot import KilnPartitioner, lower
from kiln_executorch.aot.blob_format import Opcode
from kiln_executorch.aot.ops import attention
from kiln_testing.blob_reader import read_blob
from kiln_testing.reference import run_program

from test_operators import Fn, randn  # noqa: E402  (beside this file; pytest puts it on the path)

SDPA = torch.ops.aten.scaled_dot_product_attention.default


def blobs(program):
    return [read_blob(m.processed_bytes) for _, m in program.graph_module.named_children()
            if hasattr(m, "processed_bytes")]


def cpu_ops(program):
    return [str(n.target) for n in program.graph.nodes if n.op == "call_function"
            and n.target is not operator.getitem and "call_delegate" not in str(n.target)]


def opcodes(graph):
    return [op.opcode for op in graph.ops]


class Heads(nn.Module):
    """Projections viewed [B, S, H, D] and transposed, as every transformer block does."""

    def __init__(self, width=64, heads=4, kv_heads=4, mask=None, causal=False):
        super().__init__()
        self.h, self.kvh, self.d = heads, kv_heads, width // heads
        self.q = nn.Linear(width, width)
        self.k = nn.Linear(width, kv_heads * self.d)
        self.v = nn.Linear(width, kv_heads * self.d)
        self.mask, self.causal = mask, causal

    def forward(self, x):
        b, s, _ = x.shape
        q = self.q(x).view(b, s, self.h, self.d).transpose(1, 2)
        k = self.k(x).view(b, s, self.kvh, self.d).transpose(1, 2)
        v = self.v(x).view(b, s, self.kvh, self.d).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=self.mask, is_causal=self.causal,
                                           enable_gqa=self.kvh != self.h)
        return y.transpose(1, 2).reshape(b, s, -1)


def test_projections_are_read_in_place_without_copies():
    module, x = Heads(kv_heads=2, causal=True).eval(), (randn(1, 12, 64),)
    program = lower(module, x).exported_program()
    assert cpu_ops(program) == []
    (graph,) = blobs(program)
    assert opcodes(graph).count(Opcode.ATTENTION) == 1
    att = next(op for op in graph.ops if op.opcode == Opcode.ATTENTION)
    assert (att.operands["heads_q"], att.operands["heads_kv"], att.operands["causal"]) == (4, 2, 1)
    # q, k and v are one matmul writing [1, 12, 64 + 32 + 32] (ops/matmul.py); q read from its
    # first 64 columns as [1, 4, 12, 16]: heads 16 apart, positions 128 apart.
    assert opcodes(graph).count(Opcode.MATMUL) == 1
    assert (att.operands["q_stride_h"], att.operands["q_stride_s"]) == (16, 128)
    assert (att.operands["k_stride_h"], att.operands["k_stride_s"]) == (16, 128)
    assert (att.operands["q_offset"], att.operands["k_offset"], att.operands["v_offset"]) == \
        (0, 64, 96)
    # The output's transpose back to [B, S, H * D] is folded in: the attention writes
    # [1, 12, 4, 16] through its out strides, so there is no copy at all.
    assert opcodes(graph).count(Opcode.COPY) == 0, opcodes(graph)
    assert (att.operands["out_stride_b"], att.operands["out_stride_h"],
            att.operands["out_stride_s"]) == (768, 16, 64)
    (actual,) = run_program(program, x)
    torch.testing.assert_close(actual, module(*x), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("precision, tol", [("fp32", 1e-5), ("bf16", 3e-2), ("fp16", 5e-3)])
def test_precisions(precision, tol):
    mask = torch.zeros(1, 1, 12, 12)
    mask[..., 3] = -2.0
    module, x = Heads(mask=mask).eval(), (randn(2, 12, 64),)
    program = lower(module, x, precision=precision).exported_program()
    assert cpu_ops(program) == []
    (graph,) = blobs(program)
    assert Opcode.ATTENTION in opcodes(graph)
    (actual,) = run_program(program, x, compute_dtype=torch.float32)
    with torch.no_grad():
        expected = module(*x)
    assert float((actual - expected).abs().max()) <= tol * float(expected.abs().max())


def test_hf_repeat_kv_and_a_constant_causal_mask_fold_into_flags():
    def fn(m, q, k, v):
        k, v = (t[:, :, None].expand(1, 2, 4, 9, 16).reshape(1, 8, 9, 16) for t in (k, v))
        return F.scaled_dot_product_attention(q, k, v, attn_mask=m.mask)
    module = Fn(fn).eval()
    module.register_buffer("mask", torch.full((9, 9), -1e9).triu(1)[None, None])
    inputs = (randn(1, 8, 9, 16), randn(1, 2, 9, 16), randn(1, 2, 9, 16))
    program = lower(module, inputs).exported_program()
    (graph,) = blobs(program)
    assert opcodes(graph) == [Opcode.ATTENTION]
    att = graph.ops[0].operands
    assert (att["heads_kv"], att["causal"], att["mask"]) == (2, 1, -1)
    (actual,) = run_program(program, inputs)
    torch.testing.assert_close(actual, module(*inputs), atol=1e-5, rtol=1e-5)


def test_refused_attention_decomposes_and_says_why():
    module = Fn(lambda m, q, k, v: F.scaled_dot_product_attention(q, k, v, dropout_p=0.5))
    inputs = (randn(1, 2, 4, 8),) * 3
    ep = torch.export.export(module, inputs)
    nodes = [n for n in ep.graph.nodes if n.target == SDPA]
    assert len(nodes) == 1 and "dropout_p=0.5" in attention.check(nodes[0])
    assert KilnPartitioner().ops_to_not_decompose(ep) == ([], None)
    wide = Fn(lambda m, q, k, v: F.scaled_dot_product_attention(q, k, v))
    ep = torch.export.export(wide, (randn(1, 2, 3, 300),) * 3)
    node = next(n for n in ep.graph.nodes if n.target == SDPA)
    assert "head_dim 300 / 300" in attention.check(node)
    program = lower(wide, (randn(1, 2, 3, 300),) * 3).exported_program()
    assert cpu_ops(program) == []
    (graph,) = blobs(program)
    assert Opcode.ATTENTION not in opcodes(graph) and Opcode.SOFTMAX in opcodes(graph)


def test_excluded_attention_is_not_kept_whole():
    ep = torch.export.export(Heads().eval(), (randn(1, 12, 64),))
    assert KilnPartitioner().ops_to_not_decompose(ep) == ([SDPA], None)
    assert KilnPartitioner(exclude_ops=[SDPA]).ops_to_not_decompose(ep) == ([], None)
    program = lower(Heads().eval(), (randn(1, 12, 64),), exclude_ops=[SDPA]).exported_program()
    (graph,) = blobs(program)
    assert Opcode.ATTENTION not in opcodes(graph) and Opcode.SOFTMAX in opcodes(graph)


def test_packed_qkv_thirds_are_read_in_place():
    # nn.MultiheadAttention (as torchvision's ViT uses it) splits one packed in-projection into
    # q, k and v with selects and permutes: each is read at its offset, none is copied.
    mha = nn.MultiheadAttention(32, 2).eval()
    module = Fn(lambda m, x: m.mha(x, x, x, need_weights=False)[0], mha=mha)
    x = (randn(5, 1, 32),)
    program = lower(module, x).exported_program()
    assert cpu_ops(program) == []
    (graph,) = blobs(program)
    att = next(op.operands for op in graph.ops if op.opcode == Opcode.ATTENTION)
    assert (att["q_offset"], att["k_offset"], att["v_offset"]) == (0, 32, 64)
    assert (att["q_stride_h"], att["q_stride_s"]) == (16, 96)
    # The [S, B, H, D] permute of the result is folded into the out strides as well.
    assert (att["out_stride_h"], att["out_stride_s"]) == (16, 32)
    assert opcodes(graph).count(Opcode.COPY) == 0, opcodes(graph)
    (actual,) = run_program(program, x)
    with torch.no_grad():
        torch.testing.assert_close(actual, module(*x), atol=1e-5, rtol=1e-5)


class SharedInput(nn.Module):
    """Projections of one input: q/k/v for attention (merged into one matmul) and a fourth
    projection read by an elementwise op (left alone: merging it would add a copy)."""

    def __init__(self):
        super().__init__()
        self.heads = Heads()
        self.gate = nn.Linear(64, 64)

    def forward(self, x):
        return self.heads(x) + torch.sigmoid(self.gate(x))


@pytest.mark.parametrize("precision, tol", [("fp32", 1e-5), ("bf16", 3e-2)])
def test_only_projections_read_in_place_are_merged(precision, tol):
    module, x = SharedInput().eval(), (randn(1, 12, 64),)
    program = lower(module, x, precision=precision).exported_program()
    (graph,) = blobs(program)
    matmuls = [op for op in graph.ops if op.opcode == Opcode.MATMUL]
    assert sorted(op.operands["N"] for op in matmuls) == [64, 192], opcodes(graph)
    # The blocks' copies are dropped; bf16 has the input's cast.
    assert opcodes(graph).count(Opcode.COPY) == (precision == "bf16"), opcodes(graph)
    (actual,) = run_program(program, x)
    torch.testing.assert_close(actual, module(*x), atol=tol, rtol=tol)


class SwiGlu(nn.Module):
    """A Llama MLP: down(silu(gate(x)) * up(x))."""

    def __init__(self, width=64, hidden=96):
        super().__init__()
        self.gate = nn.Linear(width, hidden, bias=False)
        self.up = nn.Linear(width, hidden, bias=False)
        self.down = nn.Linear(hidden, width, bias=False)

    def forward(self, x):
        return self.down(F.silu(self.gate(x)) * self.up(x))


@pytest.mark.parametrize("precision, tol", [("fp32", 1e-5), ("bf16", 3e-2)])
@pytest.mark.parametrize("make", [SharedInput, SwiGlu])
def test_projections_of_one_row_are_merged_whatever_reads_them(make, precision, tol):
    # A decoder's token: every projection of the one row shares one matmul, and each block of it
    # is a view inside the merged row (the builder's view_contiguous_copies), not a copy.
    module, x = make().eval(), (randn(1, 1, 64),)
    program = lower(module, x, precision=precision).exported_program()
    (graph,) = blobs(program)
    matmuls = [op for op in graph.ops if op.opcode == Opcode.MATMUL]
    widths = sorted(op.operands["N"] for op in matmuls)
    assert widths == ([256] if make is SharedInput else [64, 192]), opcodes(graph)
    # No copy of a block is left; bf16 keeps its casts at the delegate's edges (the input, and
    # SwiGlu's matmul result into the float32 output).
    casts = 0 if precision == "fp32" else 1 if make is SharedInput else 2
    assert opcodes(graph).count(Opcode.COPY) == casts, opcodes(graph)
    (actual,) = run_program(program, x)
    torch.testing.assert_close(actual, module(*x), atol=tol, rtol=tol)
    # More than one row: the elementwise readers keep their own matmuls.
    rows = (randn(1, 3, 64),)
    (graph,) = blobs(lower(module, rows, precision=precision).exported_program())
    widths = sorted(op.operands["N"] for op in graph.ops if op.opcode == Opcode.MATMUL)
    assert widths == ([64, 192] if make is SharedInput else [64, 96, 96]), opcodes(graph)


class PackedSplit(nn.Module):
    """GPT-2's attention: one packed c_attn projection split into q, k and v with
    split(width, dim=2), each viewed [B, S, H, D] and transposed."""

    def __init__(self, width=64, heads=4):
        super().__init__()
        self.h, self.d = heads, width // heads
        self.c_attn = nn.Linear(width, 3 * width)
        self.c_proj = nn.Linear(width, width)

    def forward(self, x):
        b, s, w = x.shape
        q, k, v = (t.view(b, s, self.h, self.d).transpose(1, 2)
                   for t in self.c_attn(x).split(w, dim=2))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.c_proj(y.transpose(1, 2).reshape(b, s, w))


def test_split_qkv_pieces_are_read_in_place():
    # The pieces come through getitem of a split_with_sizes_copy: each is read at its offset in
    # the packed projection output, and the split's copies go unread (the builder drops them).
    module, x = PackedSplit().eval(), (randn(2, 7, 64),)
    program = lower(module, x).exported_program()
    assert cpu_ops(program) == []
    (graph,) = blobs(program)
    att = next(op.operands for op in graph.ops if op.opcode == Opcode.ATTENTION)
    assert (att["q_offset"], att["k_offset"], att["v_offset"]) == (0, 64, 128)
    assert (att["q_stride_b"], att["q_stride_h"], att["q_stride_s"]) == (7 * 192, 16, 192)
    assert att["causal"] == 1
    assert opcodes(graph).count(Opcode.COPY) == 0, opcodes(graph)
    (actual,) = run_program(program, x)
    with torch.no_grad():
        torch.testing.assert_close(actual, module(*x), atol=1e-5, rtol=1e-5)


def test_a_query_from_another_multi_output_operator_is_read_as_its_value():
    # getitem of an operator that is no split (max_pool2d_with_indices' values) cannot be read
    # in place: the attention reads the pooled tensor itself.
    def fn(m, x, k, v):
        q = F.max_pool2d(x, (1, 2), return_indices=True)[0]
        return F.scaled_dot_product_attention(q, k, v)
    module = Fn(fn).eval()
    inputs = (randn(1, 2, 5, 16), randn(1, 2, 6, 8), randn(1, 2, 6, 8))
    program = lower(module, inputs).exported_program()
    assert cpu_ops(program) == []
    (graph,) = blobs(program)
    att = next(op.operands for op in graph.ops if op.opcode == Opcode.ATTENTION)
    assert (att["q_offset"], att["q_stride_h"], att["q_stride_s"]) == (0, 40, 8)
    (actual,) = run_program(program, inputs)
    torch.testing.assert_close(actual, module(*inputs), atol=1e-5, rtol=1e-5)
