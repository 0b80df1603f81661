"""The lowering and the C++ builder's passes, seen in the built blob read back as IR: folding,
in-place transposes, views, epilogue fusion, precision conversion, output binding and memory
planning."""

import math
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import models  # noqa: E402

from kiln_executorch.aot import lower  # noqa: E402
from kiln_executorch.aot.blob_format import (FUSED_INSTR_WIDTH, BinaryKind, DType,  # noqa: E402
                                             Epilogue, Opcode, Precision, Storage, UnaryKind)
from kiln_executorch.aot.backend import build_blob, state_names, unwrap_state_keys  # noqa: E402
from kiln_testing.blob_reader import build_graph, read_blob  # noqa: E402
from kiln_testing.reference import run_program  # noqa: E402

FIXTURES = models.all_fixtures()


class Fn(nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, *args):
        return self.fn(*args)


def partitions(module, inputs, precision="fp32"):
    """[(partition edge program, blob)] of a lowered module, in graph order."""
    program = lower(module, inputs, precision).exported_program()
    return [(m.original_module, m.processed_bytes)
            for _, m in program.graph_module.named_children() if hasattr(m, "processed_bytes")]


def graphs(module, inputs, precision="fp32"):
    """The built IR of every Kiln partition (read back from the blob: views are records over
    their root's storage, no alias_of), checked to be what preprocess wrote into the program."""
    found = []
    for ep, blob in partitions(module, inputs, precision):
        built = build_blob(ep, Precision[precision.upper()])
        keys, payload = unwrap_state_keys(blob)     # a stateful partition names its states
        assert built == payload and keys == state_names(ep)
        found.append(read_blob(built))
    return found


def only_graph(module, inputs, precision="fp32"):
    (graph,) = graphs(module, inputs, precision)
    return graph


def opcodes(graph):
    return [op.opcode for op in graph.ops]


def fixture_graphs(name, precision="fp32"):
    f = FIXTURES[name]
    return graphs(f.module, f.inputs, precision)


def fixture_graph(name, precision="fp32"):
    (graph,) = fixture_graphs(name, precision)
    return graph


def test_batch_norm_folds_into_convolution():
    """The folded scale goes into the convolution's weights and the folded shift into its bias;
    the ReLU runs in its epilogue: one op per convolution. Channels-last: the input is made NHWC
    once, the weights are KRSC, the pool and the global average pool read NHWC."""
    g = fixture_graph("cnn_small")
    assert opcodes(g) == [Opcode.COPY, Opcode.CONV2D, Opcode.POOL2D, Opcode.CONV2D, Opcode.REDUCE,
                          Opcode.MATMUL]
    m = FIXTURES["cnn_small"].module
    scale = m.bn.weight / torch.sqrt(m.bn.running_var + m.bn.eps)
    conv = g.ops[1].operands
    assert (conv["epilogue"], conv["channels_last"], conv["residual"]) == (Epilogue.RELU, 1, -1)
    assert g.ops[2].operands["channels_last"] == 1
    assert conv["x"] == g.ops[0].operands["out"]
    krsc = (m.conv1.weight * scale.reshape(-1, 1, 1, 1)).permute(0, 2, 3, 1)
    torch.testing.assert_close(g.tensors[conv["weight"]].data.reshape(krsc.shape), krsc)
    torch.testing.assert_close(g.tensors[conv["bias"]].data,
                               (m.conv1.bias - m.bn.running_mean) * scale + m.bn.bias)
    reduce = g.ops[4].operands
    assert (reduce["outer"], reduce["reduce"], reduce["inner"]) == (1, 16 * 16, 32)


def test_convolution_keeps_its_bias():
    """A convolution's own bias stays in kConv2d (its epilogue adds it); with layout="nchw" the
    convolution reads and writes NCHW as the graph does."""
    conv = torch.nn.Conv2d(3, 8, 3, padding=1)
    (ep, _), = partitions(conv.eval(), (torch.randn(2, 3, 6, 6),))
    g = build_graph(ep, fuse=False, layout="nchw")
    assert opcodes(g) == [Opcode.CONV2D]
    c = g.ops[0].operands
    assert c["channels_last"] == 0 and c["epilogue"] == Epilogue.NONE
    assert torch.equal(g.tensors[c["bias"]].data, conv.bias.detach())
    assert torch.equal(g.tensors[c["weight"]].data.reshape(8, 3, 3, 3), conv.weight.detach())


def test_linear_reads_its_weight_in_place_and_fuses_relu():
    g = fixture_graph("mlp")
    m = FIXTURES["mlp"].module
    assert opcodes(g) == [Opcode.MATMUL, Opcode.MATMUL]
    first, second = (op.operands for op in g.ops)
    assert torch.equal(g.tensors[first["b"]].data, m.fc1.weight)          # [512, 256] as stored
    assert (first["trans_b"], first["M"], first["N"], first["K"]) == (1, 8, 512, 256)
    assert (first["bias_row_stride"], first["bias_col_stride"]) == (0, 1)
    assert (first["epilogue"], second["epilogue"]) == (Epilogue.RELU, Epilogue.NONE)
    weights = [t for t in g.tensors if t.storage == Storage.WEIGHT]
    assert sum(t.nbytes for t in weights) == sum(p.numel() * 4 for p in m.parameters())


def test_gelu_fuses_into_the_matmul_that_feeds_it():
    g = fixture_graph("transformer_block")
    epilogues = [op.operands["epilogue"] for op in g.ops if op.opcode == Opcode.MATMUL]
    assert epilogues.count(Epilogue.GELU_ERF) == 1
    assert not any(op.opcode == Opcode.UNARY and op.operands["kind"] == UnaryKind.GELU_ERF
                   for op in g.ops)


def test_residual_adds_become_matmul_residuals():
    """x + o(attn) and x + fc2(...): each add is the matmul's residual (cuBLASLt's C), so no add
    of a matmul result is left; the first one reads the delegate input x in place."""
    for precision in ("fp32", "bf16"):
        g = fixture_graph("transformer_block", precision)
        mms = [op.operands for op in g.ops if op.opcode == Opcode.MATMUL]
        fused = [mm for mm in mms if mm["residual"] >= 0]
        assert len(fused) == 2, precision
        assert all(mm["bias"] >= 0 and mm["epilogue"] == Epilogue.NONE for mm in fused)
        assert g.tensors[fused[0]["residual"]].storage == (
            Storage.INPUT if precision == "fp32" else Storage.ARENA)   # bf16: the cast input
        mm_outs = {mm["out"] for mm in mms}
        assert not any(op.opcode == Opcode.BINARY and {op.operands["a"], op.operands["b"]} & mm_outs
                       for op in g.ops)


def test_views_share_storage_instead_of_copying():
    g = fixture_graph("embedding_lm")
    assert opcodes(g) == [Opcode.EMBEDDING, Opcode.MATMUL, Opcode.SOFTMAX]
    emb_out = g.tensors[g.ops[0].out]
    # The matmul reads a [12, 32] view: its own record over the embedding's bytes, no copy.
    view = g.tensors[g.ops[1].operands["a"]]
    assert view.id != emb_out.id and view.shape == (12, 32) and emb_out.shape != view.shape
    assert (view.storage, view.offset, view.nbytes) == \
        (emb_out.storage, emb_out.offset, emb_out.nbytes)


def test_constant_subgraphs_fold_into_weights():
    # Attention left to decompose: its causal mask is computed from constants and folds into one
    # weight.
    f = FIXTURES["transformer_block"]
    sdpa = torch.ops.aten.scaled_dot_product_attention.default
    program = lower(f.module, f.inputs, exclude_ops=[sdpa]).exported_program()
    (g,) = [read_blob(m.processed_bytes) for _, m in program.graph_module.named_children()
            if hasattr(m, "processed_bytes")]
    masks = [t for t in g.tensors if t.storage == Storage.WEIGHT and t.shape == (16, 16)]
    assert len(masks) == 1 and torch.isinf(masks[0].data).sum() == 16 * 15 // 2
    assert opcodes(g).count(Opcode.WHERE) == 1        # only the fully-masked-row guard remains
    assert Opcode.FILL not in opcodes(g)              # full_like(0) is read as one broadcast value
    # Kept whole, the same attention is one kAttention op with the causal flag and no mask.
    g = fixture_graph("transformer_block")
    (att,) = [op.operands for op in g.ops if op.opcode == Opcode.ATTENTION]
    assert (att["causal"], att["mask"]) == (1, -1)
    assert Opcode.WHERE not in opcodes(g) and Opcode.SOFTMAX not in opcodes(g)


def test_computed_uniform_constant_is_filled_not_stored():
    g = only_graph(Fn(lambda x: x @ torch.ones(5, 3)), (torch.randn(4, 5),))
    assert opcodes(g) == [Opcode.FILL, Opcode.MATMUL]
    assert g.ops[0].operands["value"] == 1.0
    assert not any(t.storage == Storage.WEIGHT for t in g.tensors)


def test_scalar_operands_and_swapped_comparisons():
    g = only_graph(Fn(lambda x: (torch.full((4, 5), 2.0) < x) & (x * 3 > 0)), (torch.randn(4, 5),))
    kinds = [BinaryKind(op.operands["kind"]) for op in g.ops]
    assert kinds == [BinaryKind.GT, BinaryKind.MUL, BinaryKind.GT, BinaryKind.LOGICAL_AND]
    assert [op.operands["b"] for op in g.ops[:3]] == [-1, -1, -1]
    assert [op.operands["scalar"] for op in g.ops[:3]] == [2.0, 3.0, 0.0]


@pytest.mark.parametrize("precision, dtype", [("bf16", torch.bfloat16), ("fp16", torch.float16)])
def test_low_precision_casts_at_the_delegate_boundary(precision, dtype):
    g = fixture_graph("mlp", precision)
    assert g.precision == Precision[precision.upper()]
    assert opcodes(g) == [Opcode.COPY, Opcode.MATMUL, Opcode.MATMUL, Opcode.COPY]
    (x,), (y,) = g.inputs, g.outputs
    assert g.tensors[x].dtype == g.tensors[y].dtype == torch.float32
    assert g.ops[0].operands["x"] == x and g.tensors[g.ops[0].out].dtype == dtype
    assert g.ops[-1].out == y and g.tensors[g.ops[-1].operands["x"]].dtype == dtype
    assert all(t.data.dtype == dtype for t in g.tensors if t.storage == Storage.WEIGHT)


def test_tf32_only_marks_the_header():
    g = fixture_graph("mlp", "tf32")
    assert g.precision == Precision.TF32 and opcodes(g) == [Opcode.MATMUL, Opcode.MATMUL]
    assert all(t.dtype == torch.float32 for t in g.tensors)


def test_integer_inputs_are_not_cast():
    g = fixture_graph("embedding_lm", "bf16")
    assert g.tensors[g.inputs[0]].dtype == torch.int64
    assert g.ops[0].opcode == Opcode.EMBEDDING and g.ops[0].operands["indices"] == g.inputs[0]


def test_delegate_inputs_follow_the_call_order():
    module = Fn(lambda x, y: torch.relu(y).sum(0) - x)
    inputs = (torch.randn(5), torch.randn(3, 5))
    program = lower(module, inputs).exported_program()
    torch.testing.assert_close(run_program(program, inputs)[0], module(*inputs))
    (ep, _), = partitions(module, inputs)
    g = build_graph(ep)
    assert [g.tensors[t].shape for t in g.inputs] == [(5,), (3, 5)]


def twice_viewed_and_plus_one(x):
    y = x * 2
    return y.reshape(20), y, x + 1


def test_outputs_sharing_storage_get_their_own_memory():
    module = Fn(twice_viewed_and_plus_one)
    inputs = (torch.randn(4, 5),)
    g = only_graph(module, inputs)
    roots = [g.tensors[g.root(t)] for t in g.outputs]
    assert [(t.storage, t.offset) for t in roots] == [(Storage.OUTPUT, i) for i in range(3)]
    assert opcodes(g).count(Opcode.COPY) == 1
    program = lower(module, inputs).exported_program()
    for actual, expected in zip(run_program(program, inputs), module(*inputs)):
        torch.testing.assert_close(actual, expected)


@pytest.mark.parametrize("fn, kept", [
    (lambda x: torch.cumsum(x.reshape(20), 0), ["view_copy", "cumsum"]),
    (lambda x: torch.cumsum(torch.full((4, 5), 0.5).exp(), 0) * x,
     ["full", "exp", "cumsum", "executorch_call_delegate", "getitem"]),
])
def test_view_only_or_constant_only_partitions_are_not_delegated(fn, kept):
    # cumsum stays on ExecuTorch's CPU kernel (exclude_ops): what is left around it is views or
    # constants only.
    program = lower(Fn(fn), (torch.randn(4, 5),),
                    exclude_ops=[torch.ops.aten.cumsum.default]).exported_program()
    names = [getattr(n.target, "__name__", str(n.target)) for n in program.graph.nodes
             if n.op == "call_function"]
    assert [n.split(".")[-2] if "." in n else n for n in names] == kept


def lifetimes(g):
    first, last = {}, {}
    for i, op in enumerate(g.ops):
        for t in [op.out] + op.reads():
            r = g.root(t)
            first.setdefault(r, i)
            last[r] = i
    return first, last


@pytest.mark.parametrize("name", FIXTURES)
def test_memory_plan_never_overlaps_live_tensors(name):
    for g in fixture_graphs(name):
        check_plan(g)


def written_arena(g):
    """The planned arena tensors: the arena records some op writes (a view is a record over its
    root's bytes that ops only read; the blob keeps no alias links)."""
    outs = {op.out for op in g.ops}
    return [t for t in g.tensors if t.storage == Storage.ARENA and t.id in outs]


def check_plan(g):
    first, last = lifetimes(g)
    records = [t for t in g.tensors if t.storage == Storage.ARENA and t.id in first]
    written = {op.out for op in g.ops}
    for t in records:
        # Planned tensors are aligned; a view of a block of one (view_contiguous_copies) starts
        # inside it, wherever the block does.
        assert t.offset + t.nbytes <= g.arena_size
        assert t.id not in written or t.offset % 256 == 0, t.id

    def view_inside(a, b):   # a is a record no op writes, over bytes within b's
        return a.id not in written and b.offset <= a.offset and \
            a.offset + a.nbytes <= b.offset + b.nbytes

    for a in records:
        for b in records:
            # A view and its root are records over the same bytes (or a view over a block of
            # its root's). Two distinct tensors placed at the same offset with the same size are
            # skipped too; the builder's unit tests (tests/builder) check that case against the
            # exact lifetimes.
            if (a.offset, a.nbytes) == (b.offset, b.nbytes) or view_inside(a, b) or \
                    view_inside(b, a):
                continue
            if a.id < b.id and first[a.id] <= last[b.id] and first[b.id] <= last[a.id]:
                assert a.offset + a.nbytes <= b.offset or b.offset + b.nbytes <= a.offset, \
                    (a.id, b.id)
    assert g.arena_size <= sum(math.ceil(t.nbytes / 256) * 256 for t in written_arena(g))


def test_memory_plan_reuses_dead_tensors():
    # Tensors whose lifetimes do not overlap share bytes: the arena holds well under the sum of
    # what the ops write (0.55 of it for this block, whose attention writes its transposed
    # result in place; without reuse it would be the whole sum).
    g = fixture_graph("transformer_block")
    assert g.arena_size <= 0.6 * sum(t.nbytes for t in written_arena(g))


def test_low_precision_keeps_an_elementwise_float_output_in_float32():
    # tanh rounds to exactly 1.0 in bf16 for |x| > ~3; a CPU erfinv after the delegate (erfinv
    # excluded from Kiln here) would then give inf and cos NaN. The delegate's float32 output is
    # written by tanh in float32.
    module = models.Coalesced().eval()
    x = torch.linspace(-6, 6, 64 * 64).reshape(64, 64)
    edge = lower(module, (x,), precision="bf16", exclude_ops=[torch.ops.aten.erfinv.default])
    program = edge.exported_program()
    blobs = [m.processed_bytes for _, m in program.graph_module.named_children()
             if hasattr(m, "processed_bytes")]
    first = read_blob(blobs[0])
    (out,) = first.outputs
    assert first.tensors[out].dtype == torch.float32
    assert [op.opcode for op in first.ops] == [Opcode.COPY, Opcode.UNARY]  # cast in, tanh out
    with torch.no_grad():
        want = module(x)
    got = run_program(program, (x,), compute_dtype=torch.float32)[0]
    assert not torch.isnan(got).any()
    assert (got - want).abs().max() <= 2e-2 * want.abs().max()


@pytest.mark.parametrize("precision, low", [("bf16", torch.bfloat16), ("fp16", torch.float16)])
def test_low_precision_keeps_erfinv_and_its_operand_in_float32(precision, low):
    # torch.autocast runs erfinv in float32; Kiln keeps its operand unrounded too, so tanh(x)
    # never becomes exactly 1.0 (erfinv(1) = inf, cos(inf) = NaN) where float32 tanh is below 1.
    module = models.Coalesced().eval()
    x = torch.linspace(-6, 6, 64 * 64).reshape(64, 64)
    program = lower(module, (x,), precision=precision).exported_program()
    ((ep, blob),) = [(m.original_module, m.processed_bytes)
                     for _, m in program.graph_module.named_children()
                     if hasattr(m, "processed_bytes")]
    unfused = build_graph(ep, Precision[precision.upper()], fuse=False)
    tanh, erfinv, cos = [op for op in unfused.ops if op.opcode == Opcode.UNARY]
    assert [UnaryKind(op.operands["kind"]) for op in (tanh, erfinv, cos)] == \
        [UnaryKind.TANH, UnaryKind.ERFINV, UnaryKind.COS]
    assert unfused.tensors[tanh.operands["x"]].dtype == low          # the input cast in
    assert unfused.tensors[erfinv.operands["x"]].dtype == torch.float32
    assert unfused.tensors[erfinv.operands["out"]].dtype == torch.float32
    fused = read_blob(blob)
    assert opcodes(fused) == [Opcode.COPY, Opcode.FUSED_ELEMENTWISE]
    steps = fused.ops[1].operands["program"]
    assert [steps[j * FUSED_INSTR_WIDTH + 7] for j in range(3)] == [DType.FLOAT32] * 3
    with torch.no_grad():
        want = module(x)
    got = run_program(program, (x,), compute_dtype=torch.float32)[0]
    assert not torch.isnan(got).any()
    assert (got - want).abs().max() <= 2e-2 * want.abs().max()


def test_a_1x1_convolution_of_a_1x1_image_is_a_gemm_with_its_relu_in_the_epilogue():
    # Squeeze-and-excitation: conv1x1 -> relu -> conv1x1 on a [N, C, 1, 1] tensor.
    module = nn.Sequential(nn.Conv2d(16, 8, 1), nn.ReLU(), nn.Conv2d(8, 16, 1)).eval()
    x = torch.randn(2, 16, 1, 1)
    program = lower(module, (x,)).exported_program()
    (blob,) = [m.processed_bytes for _, m in program.graph_module.named_children()
               if hasattr(m, "processed_bytes")]
    ops = read_blob(blob).ops
    assert [op.opcode for op in ops] == [Opcode.MATMUL, Opcode.MATMUL]
    assert ops[0].operands["epilogue"] == Epilogue.RELU
    assert ops[0].operands["trans_b"] == 1 and ops[0].operands["bias_col_stride"] == 1
    with torch.no_grad():
        want = module(x)
    got = run_program(program, (x,), compute_dtype=torch.float32)[0]
    assert (got - want).abs().max() < 1e-5
