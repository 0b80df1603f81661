"""The C++ builder's blob writer (passes off: the graph written as it is) and the Python reader:
round trip, section alignment, weight placement, rejected blobs; the builder's errors and its
fp32 -> bf16/fp16 weight rounding against torch."""

import ctypes
import struct

import pytest
import torch

from kiln_executorch.aot import blob_format as bf
from kiln_executorch.aot import builder
from kiln_executorch.aot.ir import Graph
from kiln_testing.blob_reader import read_blob


def write_blob(g):
    """A planned graph written as it is, checked by the runtime's blob reader."""
    return builder.build_blob(g, builder.WRITE_ONLY)


def small_graph():
    """out0 = relu(x @ W + b) viewed as [2, 2, 3]; out1 = x cast to bf16 (x: input [4, 5])."""
    g = Graph(precision=bf.Precision.TF32, arena_size=512)
    x = g.add_tensor(torch.float32, (4, 5), storage=bf.Storage.INPUT, offset=0)
    w = g.add_weight(torch.arange(15, dtype=torch.float32).reshape(5, 3))
    b = g.add_weight(torch.tensor([1.0, -2.0, 3.0]))
    y = g.add_tensor(torch.float32, (4, 3), storage=bf.Storage.OUTPUT, offset=0)
    view = g.add_alias(y, (2, 2, 3))
    cast = g.add_tensor(torch.bfloat16, (4, 5), storage=bf.Storage.OUTPUT, offset=1)
    g.add_op(bf.Opcode.MATMUL, a=x, b=w, bias=b, out=y, batch=1, M=4, N=3, K=5, trans_a=0,
             trans_b=0, a_batch_stride=0, b_batch_stride=0, bias_row_stride=0, bias_col_stride=1,
             alpha=1.0, beta=1.0, epilogue=bf.Epilogue.RELU, residual=-1)
    g.add_op(bf.Opcode.COPY, x=x, out=cast, rank=1, sizes=[20], in_offset=0, in_strides=[1],
             out_offset=0, out_strides=[1])
    g.inputs, g.outputs = [x], [view, cast]
    return g


def header(blob):
    return dict(zip(bf.HEADER_FIELDS, bf.HEADER.unpack_from(blob)))


def test_round_trip_preserves_everything():
    g = small_graph()
    blob = write_blob(g)
    back = read_blob(blob)
    assert back.precision == bf.Precision.TF32 and back.arena_size == 512
    assert back.inputs == g.inputs and back.outputs == g.outputs
    assert [(op.opcode, op.operands) for op in back.ops] == [(op.opcode, op.operands)
                                                             for op in g.ops]
    for t, r in zip(g.tensors, back.tensors):
        assert (r.dtype, r.shape) == (t.dtype, t.shape)
        root = g.tensors[g.root(t.id)]
        assert r.storage == root.storage
        if t.data is not None:
            assert torch.equal(r.data, t.data)
    # The view is its own record over its root's output binding.
    assert (back.tensors[4].storage, back.tensors[4].offset) == (bf.Storage.OUTPUT, 0)
    assert write_blob(back) == blob


def test_header_and_section_alignment():
    blob = write_blob(small_graph())
    h = header(blob)
    assert h["magic"] == bf.MAGIC and h["header_size"] == 128
    assert h["format_version"] == bf.FORMAT_VERSION
    assert h["blob_size"] == len(blob)
    assert (h["num_tensors"], h["num_ops"], h["num_inputs"], h["num_outputs"]) == (6, 2, 1, 2)
    assert h["tensors_offset"] == 128
    for name in ("tensors", "ops", "operands", "io"):
        assert h[f"{name}_offset"] % 8 == 0, name
    assert h["weights_offset"] % bf.WEIGHT_ALIGNMENT == 0
    assert h["flags"] == 0 and h["reserved"] == bytes(16)
    assert h["ops_offset"] == h["tensors_offset"] + 6 * bf.TENSOR_RECORD.size
    assert h["operands_offset"] == h["ops_offset"] + 2 * bf.OP_RECORD.size


def test_weights_are_64_byte_aligned_and_deduplicated():
    g = Graph()
    x = g.add_tensor(torch.float32, (3,), storage=bf.Storage.INPUT)
    first = g.add_weight(torch.ones(3))
    second = g.add_weight(torch.full((5,), 2.0))
    again = g.add_weight(torch.ones(3))
    outs = []
    for i, w in enumerate((first, second, again)):
        n = g.tensors[w].numel
        outs.append(g.add_tensor(torch.float32, (n,), storage=bf.Storage.OUTPUT, offset=i))
        g.add_op(bf.Opcode.COPY, x=w, out=outs[-1], rank=1, sizes=[n], in_offset=0,
                 in_strides=[1], out_offset=0, out_strides=[1])
    g.inputs, g.outputs = [x], outs
    blob = write_blob(g)
    back = read_blob(blob)
    offsets = [back.tensors[t].offset for t in (first, second, again)]
    assert offsets == [0, 64, 0]
    assert header(blob)["weights_size"] == 64 + 5 * 4


def test_empty_graph_has_an_empty_weights_section():
    blob = write_blob(Graph())
    h = header(blob)
    assert h["weights_size"] == 0 and h["num_tensors"] == 0 and len(blob) == h["weights_offset"]


def corrupt(blob, field, value):
    h = header(blob)
    h[field] = value
    return bf.HEADER.pack(*h.values()) + blob[bf.HEADER_SIZE:]


@pytest.mark.parametrize("mutate, message", [
    (lambda b: b[:100], "shorter than the header"),
    (lambda b: b[:-1], "blob_size"),
    (lambda b: corrupt(b, "magic", b"KILNBLOX"), "magic"),
    (lambda b: corrupt(b, "format_version", 1), "format_version 1"),
    (lambda b: corrupt(b, "precision", 9), "precision 9"),
    (lambda b: corrupt(b, "num_tensors", 1000), "tensors section"),
    (lambda b: corrupt(b, "weights_size", 1 << 20), "weights section"),
    (lambda b: corrupt(b, "arena_size", 8), "arena extent"),
])
def test_reader_rejects_malformed_blobs(mutate, message):
    g = small_graph()
    g.tensors[3].storage, g.tensors[3].offset = bf.Storage.ARENA, 0     # y: 48 arena bytes
    blob = builder.build_blob(g, builder.UNCHECKED)     # outputs no longer bound: not a program
    with pytest.raises(ValueError, match=message):
        read_blob(mutate(blob))


def test_reader_rejects_bad_tensor_ids_and_opcodes():
    blob = bytearray(write_blob(small_graph()))
    h = header(blob)
    bad_op = bytearray(blob)
    struct.pack_into("<I", bad_op, h["ops_offset"], 99)
    with pytest.raises(ValueError, match="opcode 99"):
        read_blob(bytes(bad_op))
    bad_id = bytearray(blob)
    struct.pack_into("<q", bad_id, h["operands_offset"], 42)      # MATMUL's `a`
    with pytest.raises(ValueError, match="op 0 a = 42"):
        read_blob(bytes(bad_id))


def test_rank_above_limit_is_refused():
    g = Graph()
    g.add_tensor(torch.float32, (1,) * 9)
    with pytest.raises(builder.KilnBuilderError, match="tensor 0 has rank 9 > 8"):
        write_blob(g)


def test_builder_errors_name_the_op_and_tensor():
    g = small_graph()
    g.ops[0].operands["a"] = 42
    with pytest.raises(builder.KilnBuilderError, match="op 0: a = 42 is not a tensor id"):
        write_blob(g)
    g = small_graph()
    g.ops[1].operands["sizes"] = [21]       # the copy reads past x: the runtime's reader refuses
    with pytest.raises(builder.KilnBuilderError, match="runtime's blob reader rejects"):
        write_blob(g)


def test_a_truncated_ir_buffer_is_an_error_not_a_crash():
    ir = builder.serialize(small_graph())
    lib = builder._library()
    for n in (0, 7, 63, 64, len(ir) // 2, len(ir) - 1):
        with pytest.raises(builder.KilnBuilderError, match="IR"):
            builder._call(lib.kiln_builder_build_blob, (ir[:n], n, builder.PASSES_ALL))


def test_blob_bytes_are_read_with_a_64_bit_size():
    # ctypes.string_at's size is a C int: 2**31 reads as negative (ViT-H/14's 2.5 GB blob).
    data = ctypes.create_string_buffer(b"kiln blob", 9)
    assert builder._bytes_at(ctypes.addressof(data), 9) == b"kiln blob"
    assert builder._bytes_at(None, 0) == b""


def test_missing_library_is_a_loud_error(monkeypatch, tmp_path):
    monkeypatch.setenv("KILN_BUILDER_LIBRARY", str(tmp_path / "libkiln_builder.so"))
    monkeypatch.setattr(builder, "_lib", None)
    with pytest.raises(RuntimeError, match="cmake --build build --target kiln_builder"):
        write_blob(small_graph())


def special_floats():
    bits = torch.tensor([0x7FC00000, 0xFFC00000, 0x7F800001, 0xFFC12345, 0x7FFFFFFF, 0x7F800000,
                         0xFF800000, 0x00000001, 0x80000001, 0x00008000, 0x00018000, 0x007FFFFF,
                         0x33000000, 0x33000001, 0x33800000, 0x33C00000, 0x387FC000, 0x387FF000,
                         0x477FE000, 0x477FEFFF, 0x477FF000, 0x3F801000, 0x3F803000, 0x3F808000,
                         0x3F818000, 0x7F7FFFFF, 0x80000000, 0x00000000], dtype=torch.int64)
    special = bits.to(torch.int32).view(torch.float32)
    random = torch.randint(-2 ** 31, 2 ** 31, (1 << 16,), dtype=torch.int64,
                           generator=torch.Generator().manual_seed(0)).to(torch.int32)
    return torch.cat([special, random.view(torch.float32), torch.randn(4099) * 1e-6])


@pytest.mark.parametrize("precision, dtype", [(bf.Precision.BF16, torch.bfloat16),
                                              (bf.Precision.FP16, torch.float16)])
def test_weights_round_to_low_precision_exactly_as_torch(precision, dtype):
    data = special_floats()
    g = Graph(precision=precision)
    x = g.add_tensor(torch.float32, data.shape, storage=bf.Storage.INPUT, offset=0)
    w = g.add_weight(data)
    y = g.add_tensor(torch.float32, data.shape)
    g.add_op(bf.Opcode.BINARY, kind=bf.BinaryKind.ADD, a=x, b=w, out=y, alpha=1.0, scalar=0.0,
             rank=1, sizes=[data.numel()], a_strides=[1], b_strides=[1])
    g.inputs, g.outputs = [x], [y]
    back = read_blob(builder.build_blob(g))
    (weight,) = [t for t in back.tensors if t.storage == bf.Storage.WEIGHT]
    assert weight.dtype == dtype
    want = data.to(dtype).view(torch.int16)
    got = weight.data.reshape(-1).view(torch.int16)
    assert torch.equal(got, want), (got != want).nonzero()[:8]
