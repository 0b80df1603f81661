"""Kiln IR <-> engine blob bytes (format v1, runtime/engine/blob_format.h).

write_blob lays the sections out in the header's order, each 8-byte aligned, the weights section
and every weight in it 64-byte aligned. Views are written as their own TensorRecords pointing at
their root tensor's storage and offset. Identical weights are stored once; the initial value of
each state tensor is stored on its own (its offset is the state's identity in the blob).

read_blob is the inverse for tests and tools; it checks the structure enough to interpret the blob
safely and raises ValueError naming the offending field. The engine's C++ reader is the one that
must reject every malformed blob; this one trusts blobs it can parse.
"""

import torch

from . import blob_format as bf
from .ir import Graph, Op, Tensor


def _align(n, a):
    return (n + a - 1) // a * a


def write_blob(graph: Graph) -> bytes:
    weights = bytearray()
    weight_offsets = {}     # root tensor id -> offset in the weights section
    by_content = {}
    for t in graph.tensors:
        if t.storage not in (bf.Storage.WEIGHT, bf.Storage.STATE) or t.alias_of is not None:
            continue
        raw = t.data.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
        key = (t.dtype, raw) if t.storage == bf.Storage.WEIGHT else ("state", t.id)
        if key not in by_content:
            by_content[key] = _align(len(weights), bf.WEIGHT_ALIGNMENT)
            weights.extend(b"\0" * (by_content[key] - len(weights)))
            weights.extend(raw)
        weight_offsets[t.id] = by_content[key]

    records = bytearray()
    for t in graph.tensors:
        if len(t.shape) > bf.MAX_RANK:
            raise ValueError(f"tensor {t.id} ({t.name}) has rank {len(t.shape)} > {bf.MAX_RANK}")
        root = graph.tensors[graph.root(t.id)]
        offset = weight_offsets[root.id] if root.storage in (bf.Storage.WEIGHT, bf.Storage.STATE) \
            else root.offset
        sizes = list(t.shape) + [0] * (bf.MAX_RANK - len(t.shape))
        records += bf.TENSOR_RECORD.pack(bf.DTYPES[t.dtype], len(t.shape), *sizes, root.storage, 0,
                                         offset, t.nbytes)

    ops = bytearray()
    operands = []
    for op in graph.ops:
        slots = bf.encode_operands(op.opcode, op.operands)
        ops += bf.OP_RECORD.pack(op.opcode, len(slots), len(operands))
        operands += slots

    tensors_offset = bf.HEADER_SIZE
    ops_offset = _align(tensors_offset + len(records), bf.SECTION_ALIGNMENT)
    operands_offset = _align(ops_offset + len(ops), bf.SECTION_ALIGNMENT)
    io_offset = _align(operands_offset + len(operands) * bf.OPERAND.size, bf.SECTION_ALIGNMENT)
    io = graph.inputs + graph.outputs
    weights_offset = _align(io_offset + len(io) * bf.IO_ENTRY.size, bf.WEIGHT_ALIGNMENT)
    blob_size = weights_offset + len(weights)

    blob = bytearray(blob_size)
    blob[:bf.HEADER_SIZE] = bf.HEADER.pack(
        bf.MAGIC, bf.FORMAT_VERSION, bf.HEADER_SIZE, blob_size, len(graph.tensors), len(graph.ops),
        len(graph.inputs), len(graph.outputs), tensors_offset, ops_offset, operands_offset,
        len(operands), io_offset, weights_offset, len(weights), graph.arena_size,
        graph.precision, 0, bytes(16))
    blob[tensors_offset:tensors_offset + len(records)] = records
    blob[ops_offset:ops_offset + len(ops)] = ops
    for i, v in enumerate(operands):
        bf.OPERAND.pack_into(blob, operands_offset + i * bf.OPERAND.size, v)
    for i, tid in enumerate(io):
        bf.IO_ENTRY.pack_into(blob, io_offset + i * bf.IO_ENTRY.size, tid)
    blob[weights_offset:] = weights
    return bytes(blob)


def _check(cond, what):
    if not cond:
        raise ValueError(f"invalid Kiln blob: {what}")


def read_blob(blob: bytes, weights: bytes = None) -> Graph:
    """Parses a blob back into IR. Tensors keep the storage and offset written in the blob
    (alias_of is not recovered); weight tensors get their data from the weights section, or from
    `weights` (the variant set's shared section) when the blob's weights are external."""
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
    return bytes(data[:len(bf.VSET_MAGIC)]) == bf.VSET_MAGIC


def _weights_section(blob):
    h = dict(zip(bf.HEADER_FIELDS, bf.HEADER.unpack_from(blob)))
    return bytes(blob[h["weights_offset"]:h["weights_offset"] + h["weights_size"]]), h


def _without_weights(blob, h):
    """The blob with its weights section cut off and the external-weights flag set."""
    size = h["weights_offset"]
    fields = dict(h, blob_size=size, weights_size=0, flags=h["flags"] | bf.FLAG_EXTERNAL_WEIGHTS)
    out = bytearray(blob[:size])
    out[:bf.HEADER_SIZE] = bf.HEADER.pack(*(fields[f] for f in bf.HEADER_FIELDS))
    return bytes(out)


def write_variant_set(variants) -> bytes:
    """variants: [(v1 blob bytes, [input shape, ...])] -> variant set bytes (variant_set.h).
    When every blob has the same non-empty weights section it is stored once and the blobs refer
    to it (Header.flags bit 0); otherwise each blob keeps its own."""
    if not 1 <= len(variants) <= bf.MAX_VARIANTS:
        raise ValueError(f"a variant set holds 1..{bf.MAX_VARIANTS} variants, not {len(variants)}")
    num_inputs = len(variants[0][1])
    if any(len(shapes) != num_inputs for _, shapes in variants):
        raise ValueError("variants disagree on the number of delegate inputs")
    sections = [_weights_section(b) for b, _ in variants]
    shared = b""
    blobs = [b for b, _ in variants]
    if sections[0][0] and all(w == sections[0][0] for w, _ in sections):
        shared = sections[0][0]
        blobs = [_without_weights(b, h) for b, (_, h) in zip(blobs, sections)]

    variants_offset = bf.VSET_HEADER_SIZE
    shapes_offset = _align(variants_offset + len(blobs) * bf.VARIANT_RECORD.size,
                           bf.SECTION_ALIGNMENT)
    cursor = shapes_offset + len(blobs) * num_inputs * bf.INPUT_SHAPE.size
    blob_offsets = []
    for b in blobs:
        cursor = _align(cursor, bf.VSET_BLOB_ALIGNMENT)
        blob_offsets.append(cursor)
        cursor += len(b)
    weights_offset = _align(cursor, bf.WEIGHT_ALIGNMENT) if shared else 0
    size = weights_offset + len(shared) if shared else cursor

    out = bytearray(size)
    bf.VSET_HEADER.pack_into(out, 0, bf.VSET_MAGIC, bf.VSET_FORMAT_VERSION, bf.VSET_HEADER_SIZE,
                             size, len(blobs), num_inputs, variants_offset, shapes_offset,
                             weights_offset, len(shared))
    for v, (b, offset) in enumerate(zip(blobs, blob_offsets)):
        bf.VARIANT_RECORD.pack_into(out, variants_offset + v * bf.VARIANT_RECORD.size, offset,
                                    len(b))
        out[offset:offset + len(b)] = b
        for i, shape in enumerate(variants[v][1]):
            if len(shape) > bf.MAX_RANK:
                raise ValueError(f"variant {v} input {i} has rank {len(shape)}")
            sizes = [int(n) for n in shape] + [0] * (bf.MAX_RANK - len(shape))
            bf.INPUT_SHAPE.pack_into(out, shapes_offset + (v * num_inputs + i) *
                                     bf.INPUT_SHAPE.size, len(shape), 0, *sizes)
    if shared:
        out[weights_offset:] = shared
    return bytes(out)


def _vcheck(cond, what):
    if not cond:
        raise ValueError(f"invalid Kiln variant set: {what}")


def read_variant_set(data: bytes):
    """Variant set bytes -> ([(v1 blob bytes, [input shape tuple, ...])], shared weights or None).
    Checks the structure enough to slice it safely; the C++ reader is the strict one."""
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
