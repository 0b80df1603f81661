"""The C++ AOT builder (libkiln_builder.so), bound with ctypes.

Python lowers an edge program into Kiln IR (lowering.py: _Lowering, with batch-norm folding and
constant evaluation in torch); everything after that — dead-op elimination, matmul epilogue
fusion, precision conversion, elementwise fusion, output binding, compaction, memory planning and
writing the blob or variant set — runs in C++ (builder/, API in builder/include/kiln/builder.h).

The IR crosses as one buffer in the "KILNIR" interchange format that header defines (a versioned
header, fixed-size tensor and op entries, the blob's own operand encoding, names, raw weight
bytes). builder_library.py finds and loads the library; there is no Python fallback: a missing
library raises.
"""
from __future__ import annotations

import ctypes
import struct

import torch

from . import blob_format as bf
from . import builder_library
from .builder_library import API_VERSION, LIBRARY_NAME, library_path  # noqa: F401
from .ir import Graph

IR_MAGIC = b"KILNIR\0\0"
IR_VERSION = 2
IR_HEADER = struct.Struct("<8sIIIIIIIIQQQ")
IR_TENSOR = struct.Struct(f"<II{bf.MAX_RANK}qIiQQII")
IR_OP = struct.Struct("<II")
assert IR_HEADER.size == 64 and IR_TENSOR.size == 104 and IR_OP.size == 8

# Pass bits (kiln/builder.h).
PASS_DEAD_OPS = 1 << 0
PASS_MATMUL_EPILOGUES = 1 << 1
PASS_PRECISION = 1 << 2
PASS_FUSE_ELEMENTWISE = 1 << 3
PASS_BIND_OUTPUTS = 1 << 4
PASS_COMPACT = 1 << 5
PASS_PLAN_MEMORY = 1 << 6
PASS_FUSE_NORMS = 1 << 7
PASS_CHANNELS_LAST = 1 << 8
PASS_REDUNDANT_COPIES = 1 << 9
PASSES_ALL = 0x3FF
WRITE_ONLY = 0                  # the IR is already planned: write it as it is
UNCHECKED = 1 << 31             # skip the reader's check (deliberately malformed fuzz seeds only)

_ERROR_SIZE = 1024


class KilnBuilderError(RuntimeError):
    """The C++ builder refused the IR or could not build it; the message is the builder's."""


_lib = None   # the library builder.py uses; None makes the next call look for it again


def _library():
    global _lib
    if _lib is None:
        _lib = builder_library.load(use_cache=False)
    return _lib


def _raw(data: torch.Tensor):
    """The tensor's bytes as a buffer over its memory (no copy for a contiguous tensor)."""
    return memoryview(data.detach().contiguous().reshape(-1).view(torch.uint8).numpy())


def serialize(graph: Graph) -> bytes:
    """Kiln IR -> the KILNIR interchange buffer (kiln/builder.h). The weights are copied once, into
    the returned buffer (a billion-parameter model's IR is gigabytes)."""
    entries, names, data = bytearray(), bytearray(), []
    for t in graph.tensors:
        if len(t.shape) > bf.MAX_RANK:
            sizes = [0] * bf.MAX_RANK       # the builder rejects the rank and names the tensor
        else:
            sizes = list(t.shape) + [0] * (bf.MAX_RANK - len(t.shape))
        raw = b""
        if t.alias_of is None and t.storage in (bf.Storage.WEIGHT, bf.Storage.STATE) and \
                t.data is not None:
            raw = _raw(t.data)
        name = t.name.encode()
        entries += IR_TENSOR.pack(bf.DTYPES[t.dtype], len(t.shape), *sizes, int(t.storage),
                                  -1 if t.alias_of is None else t.alias_of, int(t.offset),
                                  len(raw), len(name), 0)
        names += name
        data.append(raw)
    ops, operands = bytearray(), []
    for op in graph.ops:
        slots = bf.encode_operands(op.opcode, op.operands)
        ops += IR_OP.pack(int(op.opcode), len(slots))
        operands += slots
    pool = struct.pack(f"<{len(operands)}q", *operands)
    io = struct.pack(f"<{len(graph.inputs) + len(graph.outputs)}I",
                     *graph.inputs, *graph.outputs)
    body = [entries, ops, pool, io, names, *data]
    header = IR_HEADER.pack(IR_MAGIC, IR_VERSION, IR_HEADER.size, int(graph.precision),
                            len(graph.tensors), len(graph.ops), len(graph.inputs),
                            len(graph.outputs), 0, len(operands), int(graph.arena_size),
                            IR_HEADER.size + sum(len(b) for b in body))
    return b"".join([header, *body])


def _bytes_at(address, size) -> bytes:
    """A copy of `size` bytes at `address`. Not ctypes.string_at: it takes the size as a C int,
    so a blob of 2 GiB or more (ViT-H/14's, RegNetY-128GF's fp32 weights) reads as a negative
    size."""
    if size == 0:
        return b""
    return bytes((ctypes.c_char * size).from_address(address))


def _call(fn, args) -> bytes:
    lib = _library()
    out = ctypes.c_void_p()
    size = ctypes.c_size_t()
    error = ctypes.create_string_buffer(_ERROR_SIZE)
    rc = fn(*args, ctypes.byref(out), ctypes.byref(size), error, _ERROR_SIZE)
    if rc != 0:
        raise KilnBuilderError(error.value.decode(errors="replace") or f"builder error {rc}")
    try:
        return _bytes_at(out.value, size.value)
    finally:
        lib.kiln_builder_free(out)


def build_blob(graph: Graph, passes: int = PASSES_ALL) -> bytes:
    """Lowered (unplanned) IR -> engine blob, through the C++ passes selected by `passes`.
    passes=WRITE_ONLY writes an IR whose arena is already planned, as it is."""
    ir = serialize(graph)
    lib = _library()
    return _call(lib.kiln_builder_build_blob, (ir, len(ir), passes))


def build_variant_set(graphs, passes: int = PASSES_ALL) -> bytes:
    """One lowered IR per shape assignment of a dynamic partition -> variant set bytes (each
    variant serves its own input tensors' shapes; identical weights sections stored once)."""
    irs = [serialize(g) for g in graphs]
    lib = _library()
    buffers = [ctypes.create_string_buffer(ir, len(ir)) for ir in irs]
    pointers = (ctypes.c_void_p * len(irs))(*[ctypes.cast(b, ctypes.c_void_p) for b in buffers])
    sizes = (ctypes.c_size_t * len(irs))(*[len(ir) for ir in irs])
    return _call(lib.kiln_builder_build_variant_set, (pointers, sizes, len(irs), passes))
