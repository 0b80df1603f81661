"""Engine blob bytes (the format of format/blob_format.h, at blob_format.FORMAT_VERSION)
and variant sets -> Kiln IR, for tests and tools. The C++ builder writes them (builder.py;
builder/src/blob_writer.cpp). Not shipped: the wheel carries kiln_executorch only.

read_blob checks the structure enough to interpret the blob safely and raises ValueError naming
the offending field. The engine's C++ reader is the one that must reject every malformed blob;
this one trusts blobs it can parse.
"""

import torch

from kiln_executorch.aot import blob_format as bf
from kiln_executorch.aot.backend import build_blob, unwrap_state_keys
from kiln_executorch.aot.ir import Graph, Op, Tensor


def _check(cond, what):
    if not cond:
        raise ValueError(f"invalid Kiln blob: {what}")


def read_blob(blob: bytes, weights: bytes = None) -> Graph:
    """Parses a blob back into IR. Tensors keep the storage and offset written in the blob
    (alias_of is not recovered); weight tensors get their data from the weights section, or from
    `weights` (the variant set's shared section) when the blob's weights are external. A
    state-key container (format/state_keys.h) is read as the blob it wraps."""
    blob = unwrap_state_keys(blob)[1]
    _check(len(blob) >= bf.HEADER_SIZE, f"{len(blob)} bytes is shorter than the header")
    h = dict(zip(bf.HEADER_FIELDS, bf.HEADER.unpack_from(blob)))
    _check(h["magic"] == bf.MAGIC, f"magic {h['magic']!r}")
    _check(h["format_version"] == bf.FORMAT_VERSION, f"format_version {h['format_version']}")
    _check(h["header_size"] == bf.HEADER_SIZE, f"header_size {h['header_size']}")
    _check(h["blob_size"] == len(blob), f"blob_size {h['blob_size']} != buffer size {len(blob)}")
    _check(h["precision"] in bf.Precision._value2member_map_, f"precision {h['precision']}")
    _check(h["flags"] & ~bf.FLAG_EXTERNAL_WEIGHTS == 0, f"flags {h['flags']:#x}")
    external = bool(h["flags"] & bf.FLAG_EXTERNAL_WEIGHTS)
    _check(not external or (weights is not None and h["weights_size"] == 0),
           "external weights: the blob must have an empty weights section and be read with the "
           "variant set's weights")
    num_io = h["num_inputs"] + h["num_outputs"]
    for name, count, size in (("tensors", h["num_tensors"], bf.TENSOR_RECORD.size),
                              ("ops", h["num_ops"], bf.OP_RECORD.size),
                              ("operands", h["num_operands"], bf.OPERAND.size),
                              ("io", num_io, bf.IO_ENTRY.size),
                              ("weights", h["weights_size"], 1)):
        start = h[f"{name}_offset"]
        _check(bf.HEADER_SIZE <= start and start + count * size <= len(blob),
               f"{name} section [{start}, {start + count * size}) outside the blob")

    graph = Graph(precision=bf.Precision(h["precision"]), arena_size=h["arena_size"])
    if not external:
        weights = blob[h["weights_offset"]:h["weights_offset"] + h["weights_size"]]
    for i in range(h["num_tensors"]):
        values = bf.TENSOR_RECORD.unpack_from(blob, h["tensors_offset"] + i * bf.TENSOR_RECORD.size)
        dtype, rank, sizes = values[0], values[1], values[2:2 + bf.MAX_RANK]
        storage, _, offset, nbytes = values[2 + bf.MAX_RANK:]
        _check(dtype in bf.DType._value2member_map_, f"tensor {i} dtype {dtype}")
        _check(rank <= bf.MAX_RANK, f"tensor {i} rank {rank}")
        _check(storage in bf.Storage._value2member_map_, f"tensor {i} storage {storage}")
        t = Tensor(i, bf.TORCH_DTYPES[bf.DType(dtype)], tuple(sizes[:rank]), bf.Storage(storage),
                   offset)
        _check(nbytes == t.nbytes, f"tensor {i} nbytes {nbytes} != {t.nbytes}")
        if t.storage in (bf.Storage.WEIGHT, bf.Storage.STATE):
            _check(offset + nbytes <= len(weights), f"tensor {i} weight extent")
            raw = bytearray(weights[offset:offset + nbytes])
            t.data = torch.frombuffer(raw, dtype=t.dtype).reshape(t.shape) if nbytes else \
                torch.empty(t.shape, dtype=t.dtype)
        elif t.storage == bf.Storage.ARENA:
            _check(offset + nbytes <= h["arena_size"], f"tensor {i} arena extent")
        graph.tensors.append(t)

    pool = [bf.OPERAND.unpack_from(blob, h["operands_offset"] + bf.OPERAND.size * i)[0]
            for i in range(h["num_operands"])]
    for i in range(h["num_ops"]):
        opcode, n, first = bf.OP_RECORD.unpack_from(blob, h["ops_offset"] + i * bf.OP_RECORD.size)
        _check(opcode in bf.Opcode._value2member_map_, f"op {i} opcode {opcode}")
        _check(first + n <= len(pool), f"op {i} operands [{first}, {first + n})")
        opcode = bf.Opcode(opcode)
        operands = bf.decode_operands(opcode, pool[first:first + n])
        for name in bf.tensor_fields(opcode):
            _check(-1 <= operands[name] < len(graph.tensors), f"op {i} {name} = {operands[name]}")
        for name in bf.tensor_list_fields(opcode):
            _check(all(0 <= t < len(graph.tensors) for t in operands[name]), f"op {i} {name}")
        graph.ops.append(Op(opcode, operands))

    io = [bf.IO_ENTRY.unpack_from(blob, h["io_offset"] + bf.IO_ENTRY.size * i)[0]
          for i in range(num_io)]
    _check(all(t < len(graph.tensors) for t in io), "io table tensor id")
    graph.inputs, graph.outputs = io[:h["num_inputs"]], io[h["num_inputs"]:]
    return graph


def is_variant_set(data: bytes) -> bool:
    """Whether `data` is a variant set (bare or inside a state-key container)."""
    data = unwrap_state_keys(data)[1]
    return bytes(data[:len(bf.VSET_MAGIC)]) == bf.VSET_MAGIC


def _vcheck(cond, what):
    if not cond:
        raise ValueError(f"invalid Kiln variant set: {what}")


def read_variant_set(data: bytes):
    """Variant set bytes -> ([(blob bytes, [input shape tuple, ...])], shared weights or None).
    Checks the structure enough to slice it safely; the C++ reader is the strict one."""
    data = unwrap_state_keys(data)[1]
    _vcheck(len(data) >= bf.VSET_HEADER_SIZE, f"{len(data)} bytes is shorter than the header")
    h = dict(zip(bf.VSET_HEADER_FIELDS, bf.VSET_HEADER.unpack_from(data)))
    _vcheck(h["magic"] == bf.VSET_MAGIC, f"magic {h['magic']!r}")
    _vcheck(h["format_version"] == bf.VSET_FORMAT_VERSION, f"format_version {h['format_version']}")
    _vcheck(h["container_size"] == len(data), f"container_size {h['container_size']}")
    n, k = h["num_variants"], h["num_inputs"]
    _vcheck(1 <= n <= bf.MAX_VARIANTS, f"num_variants {n}")
    _vcheck(h["variants_offset"] + n * bf.VARIANT_RECORD.size <= len(data), "variants section")
    _vcheck(h["shapes_offset"] + n * k * bf.INPUT_SHAPE.size <= len(data), "shapes section")
    _vcheck(h["weights_offset"] + h["weights_size"] <= len(data), "weights section")
    weights = bytes(data[h["weights_offset"]:h["weights_offset"] + h["weights_size"]]) \
        if h["weights_size"] else None
    variants = []
    for v in range(n):
        offset, size = bf.VARIANT_RECORD.unpack_from(data, h["variants_offset"] +
                                                     v * bf.VARIANT_RECORD.size)
        _vcheck(offset + size <= len(data), f"variant {v} blob extent")
        shapes = []
        for i in range(k):
            rank, _, *sizes = bf.INPUT_SHAPE.unpack_from(
                data, h["shapes_offset"] + (v * k + i) * bf.INPUT_SHAPE.size)
            _vcheck(rank <= bf.MAX_RANK, f"variant {v} input {i} rank {rank}")
            shapes.append(tuple(sizes[:rank]))
        variants.append((bytes(data[offset:offset + size]), shapes))
    return variants, weights


def build_graph(edge_program, precision=bf.Precision.FP32, fuse=True,
                layout="channels_last") -> Graph:
    """The blob backend.build_blob builds for one partition, read back as IR: planned, with views
    as records over their root's storage and offset (alias_of and names are not kept)."""
    return read_blob(build_blob(edge_program, precision, fuse, layout))
