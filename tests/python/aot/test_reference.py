"""The reference interpreter on hand-built blobs: semantics the lowering does not reach from
PyTorch, and the run-time rules it enforces for the engine's sake."""

import math

import pytest
import torch
import torch.nn.functional as F

from kiln_executorch.aot.blob_format import (BinaryKind, Epilogue, Opcode, ReduceKind, Storage,
                                             UnaryKind)
from kiln_executorch.aot import builder
from kiln_executorch.aot.ir import Graph
from kiln_testing.reference import BlobExecutionError, run_blob

gen = torch.Generator().manual_seed(3)


def graph_io(inputs, outputs):
    """A graph with kInput tensors like `inputs` and kOutput tensors of the (dtype, shape)s."""
    g = Graph()
    g.inputs = [g.add_tensor(x.dtype, x.shape, storage=Storage.INPUT, offset=i)
                for i, x in enumerate(inputs)]
    g.outputs = [g.add_tensor(dtype, shape, storage=Storage.OUTPUT, offset=i)
                 for i, (dtype, shape) in enumerate(outputs)]
    return g


def write_blob(g):
    """The hand-made graph written as it is (its arena is planned by hand), unchecked: several
    tests give the interpreter blobs the runtime's reader would refuse."""
    return builder.build_blob(g, builder.UNCHECKED)


def run(g, inputs, **kwargs):
    return run_blob(write_blob(g), list(inputs), **kwargs)


def test_matmul_transposes_batch_strides_bias_and_epilogue():
    a = torch.randn(3, 5, 4, generator=gen)       # read as A[g]^T: M=4, K=5
    b = torch.randn(5, 6, generator=gen)          # shared by every batch (stride 0)
    bias = torch.randn(4, 1, generator=gen)       # one value per row
    g = graph_io([a, b, bias], [(torch.float32, (3, 4, 6))])
    ta, tb, tbias = g.inputs
    g.add_op(Opcode.MATMUL, a=ta, b=tb, bias=tbias, out=g.outputs[0], batch=3, M=4, N=6, K=5,
             trans_a=1, trans_b=0, a_batch_stride=20, b_batch_stride=0, bias_row_stride=1,
             bias_col_stride=0, alpha=0.5, beta=2.0, epilogue=Epilogue.GELU_TANH, residual=-1)
    (out,) = run(g, [a, b, bias])
    expected = F.gelu(0.5 * a.transpose(1, 2) @ b + 2.0 * bias, approximate="tanh")
    torch.testing.assert_close(out, expected)


def test_integer_division_kinds():
    a = torch.tensor([7, -7, 7, -7])
    b = torch.tensor([2, 2, -2, -2])
    kinds = [BinaryKind.DIV, BinaryKind.FLOOR_DIV, BinaryKind.REMAINDER]
    g = graph_io([a, b], [(torch.int64, (4,))] * 3)
    for kind, out in zip(kinds, g.outputs):
        g.add_op(Opcode.BINARY, kind=kind, a=g.inputs[0], b=g.inputs[1], out=out, alpha=1.0,
                 scalar=0.0, rank=1, sizes=[4], a_strides=[1], b_strides=[1])
    trunc, floor, rem = run(g, [a, b])
    assert trunc.tolist() == [3, -3, -3, 3]
    assert floor.tolist() == [3, -4, -4, 3]
    assert rem.tolist() == [1, 1, -1, -1]


def test_unary_identity_casts_and_erfinv():
    x = torch.tensor([-0.9, -2.5, 0.0, 0.5, 0.999])
    g = graph_io([x], [(torch.int32, (5,)), (torch.bool, (5,)), (torch.float32, (5,))])
    for kind, out in zip([UnaryKind.IDENTITY, UnaryKind.IDENTITY, UnaryKind.ERFINV], g.outputs):
        g.add_op(Opcode.UNARY, kind=kind, x=g.inputs[0], out=out, p0=0.0, p1=0.0)
    as_int, as_bool, erfinv = run(g, [x])
    assert as_int.tolist() == [0, -2, 0, 0, 0]
    assert as_bool.tolist() == [True, True, False, True, True]
    torch.testing.assert_close(erfinv, torch.erfinv(x), equal_nan=True)


def test_copy_writes_pieces_at_offsets():
    x = torch.arange(6.0).reshape(2, 3)
    g = graph_io([x], [(torch.float32, (3, 4))])
    out = g.outputs[0]
    # out[:, 0:2] = x^T, out[:, 2:4] = x^T reversed along rows.
    g.add_op(Opcode.COPY, x=g.inputs[0], out=out, rank=2, sizes=[3, 2], in_offset=0,
             in_strides=[1, 3], out_offset=0, out_strides=[4, 1])
    g.add_op(Opcode.COPY, x=g.inputs[0], out=out, rank=2, sizes=[3, 2], in_offset=2,
             in_strides=[-1, 3], out_offset=2, out_strides=[4, 1])
    (y,) = run(g, [x])
    assert torch.equal(y, torch.cat([x.t(), x.t().flip(0)], dim=1))


def test_reduce_amin_and_any_over_the_middle_axis():
    x = torch.randn(2, 3, 4, generator=gen)
    g = graph_io([x], [(torch.float32, (2, 4)), (torch.bool, (2, 4))])
    g.add_op(Opcode.REDUCE, kind=ReduceKind.AMIN, x=g.inputs[0], out=g.outputs[0], outer=2,
             reduce=3, inner=4)
    g.add_op(Opcode.REDUCE, kind=ReduceKind.ANY, x=g.inputs[0], out=g.outputs[1], outer=2,
             reduce=3, inner=4)
    amin, any_ = run(g, [x])
    assert torch.equal(amin, x.amin(1)) and torch.equal(any_, (x != 0).any(1))


def test_float32_compute_is_available():
    x = torch.randn(8, generator=gen)
    g = graph_io([x], [(torch.float32, (8,))])
    g.add_op(Opcode.UNARY, kind=UnaryKind.EXP, x=g.inputs[0], out=g.outputs[0], p0=0, p1=0)
    assert torch.equal(run(g, [x], compute_dtype=torch.float32)[0], torch.exp(x))


def arena_graph():
    """x -> exp -> t (arena) -> neg -> out."""
    x = torch.randn(16, generator=gen)
    g = graph_io([x], [(torch.float32, (16,))])
    t = g.add_tensor(torch.float32, (16,), offset=0)
    g.arena_size = 256
    g.add_op(Opcode.UNARY, kind=UnaryKind.EXP, x=g.inputs[0], out=t, p0=0, p1=0)
    g.add_op(Opcode.UNARY, kind=UnaryKind.NEG, x=t, out=g.outputs[0], p0=0, p1=0)
    return g, x, t


def test_arena_round_trip():
    g, x, _ = arena_graph()
    torch.testing.assert_close(run(g, [x])[0], -torch.exp(x))


def test_writing_an_operand_is_an_error():
    g, x, t = arena_graph()
    g.ops[1].operands["out"] = t
    with pytest.raises(BlobExecutionError, match="overlaps its operand x"):
        run(g, [x])


def test_reading_bytes_another_tensor_wrote_is_an_error():
    g, x, t = arena_graph()
    other = g.add_tensor(torch.float32, (8,), offset=0)      # the first half of t's bytes
    g.ops.insert(1, g.ops[0].__class__(Opcode.FILL, {"out": other, "value": 1.0}))
    with pytest.raises(BlobExecutionError, match="not last written as this tensor"):
        run(g, [x])


def test_writing_an_input_is_an_error():
    g, x, _ = arena_graph()
    g.ops[1].operands["out"] = g.inputs[0]
    with pytest.raises(BlobExecutionError, match="writes INPUT tensor"):
        run(g, [x])


def test_embedding_index_out_of_range_is_an_error():
    weight = torch.randn(4, 3, generator=gen)
    ids = torch.tensor([1, 4])
    g = graph_io([weight, ids], [(torch.float32, (2, 3))])
    g.add_op(Opcode.EMBEDDING, weight=g.inputs[0], indices=g.inputs[1], out=g.outputs[0],
             num_indices=2, dim=3, vocab=4)
    with pytest.raises(BlobExecutionError, match=r"embedding index 4 outside \[0, 4\)"):
        run(g, [weight, ids])


def test_inputs_must_match_the_blob():
    g, x, _ = arena_graph()
    with pytest.raises(ValueError, match="blob declares torch.float32"):
        run(g, [x.double()])
    with pytest.raises(ValueError, match="takes 1 inputs, got 0"):
        run(g, [])


def test_unwritten_output_reads_as_nan():
    x = torch.randn(4, generator=gen)
    g = graph_io([x], [(torch.float32, (4,))])
    g.add_op(Opcode.COPY, x=g.inputs[0], out=g.outputs[0], rank=1, sizes=[2], in_offset=0,
             in_strides=[1], out_offset=0, out_strides=[1])
    (y,) = run(g, [x])
    assert torch.equal(y[:2], x[:2]) and all(math.isnan(v) for v in y[2:].tolist())


def state_graph(initial, values_shape, positions_dtype, num_positions):
    """state <- values at positions (rows of dim 1 of [outer, len, inner]); out = the state."""
    outer, length, inner = initial.shape
    values = torch.zeros(values_shape)
    positions = torch.zeros(num_positions, dtype=positions_dtype)
    g = graph_io([values, positions], [(initial.dtype, initial.shape)])
    state = g.add_state(initial, name="cache")
    g.add_op(Opcode.INDEX_PUT, values=g.inputs[0], positions=g.inputs[1], out=state, outer=outer,
             dim_size=length, inner=inner, num_positions=num_positions)
    n = initial.numel()
    g.add_op(Opcode.COPY, x=state, out=g.outputs[0], rank=1, sizes=[n], in_offset=0,
             in_strides=[1], out_offset=0, out_strides=[1])
    return g


@pytest.mark.parametrize("positions_dtype", [torch.int64, torch.int32])
def test_index_put_writes_rows_into_state_that_persists(positions_dtype):
    from kiln_testing.reference import ReferenceEngine
    initial = torch.randn(3, 6, 4, generator=gen)
    engine = ReferenceEngine(write_blob(state_graph(initial, (3, 2, 4), positions_dtype, 2)))
    want = initial.clone()
    for positions in ([0, 5], [2, 3], [5, 1]):
        values = torch.randn(3, 2, 4, generator=gen)
        (out,) = engine.run([values, torch.tensor(positions, dtype=positions_dtype)])
        want[:, positions, :] = values
        assert torch.equal(out, want)
        assert torch.equal(engine.states()[0], want)
    # run_blob starts from the initial value every time.
    values = torch.randn(3, 2, 4, generator=gen)
    (out,) = run_blob(write_blob(state_graph(initial, (3, 2, 4), positions_dtype, 2)),
                      [values, torch.tensor([1, 2], dtype=positions_dtype)])
    fresh = initial.clone()
    fresh[:, [1, 2], :] = values
    assert torch.equal(out, fresh)


@pytest.mark.parametrize("position", [6, -1])
def test_index_put_rejects_positions_outside_the_state(position):
    from kiln_testing.reference import ReferenceEngine
    initial = torch.randn(2, 6, 4, generator=gen)
    engine = ReferenceEngine(write_blob(state_graph(initial, (2, 1, 4), torch.int64, 1)))
    with pytest.raises(BlobExecutionError, match=f"index_put position {position} outside"):
        engine.run([torch.randn(2, 1, 4, generator=gen), torch.tensor([position])])
    assert torch.equal(engine.states()[0], initial)


def test_index_put_writes_only_state_and_only_index_put_writes_it():
    initial = torch.randn(2, 6, 4, generator=gen)
    g = state_graph(initial, (2, 1, 4), torch.int64, 1)
    g.ops[0].operands["out"] = g.outputs[0]             # index_put into an output
    with pytest.raises(BlobExecutionError, match="only INDEX_PUT writes state, and only state"):
        run(g, [torch.randn(2, 1, 4), torch.tensor([0])])
    g = state_graph(initial, (2, 1, 4), torch.int64, 1)
    g.add_op(Opcode.FILL, out=g.ops[0].operands["out"], value=1.0)   # fill into the state
    with pytest.raises(BlobExecutionError, match="only INDEX_PUT writes state"):
        run(g, [torch.randn(2, 1, 4), torch.tensor([0])])
