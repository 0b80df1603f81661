"""Python mirror of format/blob_format.h, the Kiln engine blob format v1.

The header is the definition; the C++ builder (builder/) writes blobs from it. This module repeats
its numbers so Python can encode IR operands for the builder (builder.py) and read blobs back
(blob_reader.py). tests/python/aot/test_blob_format.py parses the header text and compares
every constant, enum value, record layout and operand layout with this file, so the two cannot
drift apart silently.
"""

import struct
from enum import IntEnum

import torch

MAGIC = b"KILNBLOB"
FORMAT_VERSION = 2
HEADER_SIZE = 128
MAX_RANK = 8
WEIGHT_ALIGNMENT = 64
# The header asks for 8-byte aligned sections; the arena alignment is the builder's choice
# (256 bytes: the widest vector access any kernel makes, and cuBLASLt's preferred alignment).
SECTION_ALIGNMENT = 8
ARENA_ALIGNMENT = 256
FLAG_EXTERNAL_WEIGHTS = 1       # Header.flags bit 0: weights live in the variant set's section

# The records, field by field as the header declares them (arrays are one struct item: bytes for
# char/uint8_t arrays, MAX_RANK integers for sizes).
HEADER_FIELDS = ("magic", "format_version", "header_size", "blob_size", "num_tensors", "num_ops",
                 "num_inputs", "num_outputs", "tensors_offset", "ops_offset", "operands_offset",
                 "num_operands", "io_offset", "weights_offset", "weights_size", "arena_size",
                 "precision", "flags", "reserved")
HEADER = struct.Struct("<8sIIQIIIIQQQQQQQQII16s")
TENSOR_RECORD_FIELDS = ("dtype", "rank", "sizes", "storage", "reserved", "offset", "nbytes")
TENSOR_RECORD = struct.Struct(f"<II{MAX_RANK}qIIQQ")
OP_RECORD_FIELDS = ("opcode", "num_operands", "first_operand")
OP_RECORD = struct.Struct("<IIQ")
OPERAND = struct.Struct("<q")
IO_ENTRY = struct.Struct("<I")

assert HEADER.size == HEADER_SIZE and TENSOR_RECORD.size == 96 and OP_RECORD.size == 16

# The variant set (format/variant_set.h): N v1 blobs of one dynamic partition, each with the
# delegate input shapes it serves, and optionally one weights section they share.
VSET_MAGIC = b"KILNVSET"
VSET_FORMAT_VERSION = 1
VSET_HEADER_SIZE = 64
MAX_VARIANTS = 64
MAX_VSET_INPUTS = 1024
VSET_BLOB_ALIGNMENT = 8
VSET_HEADER_FIELDS = ("magic", "format_version", "header_size", "container_size", "num_variants",
                      "num_inputs", "variants_offset", "shapes_offset", "weights_offset",
                      "weights_size")
VSET_HEADER = struct.Struct("<8sIIQIIQQQQ")
VARIANT_RECORD_FIELDS = ("blob_offset", "blob_size")
VARIANT_RECORD = struct.Struct("<QQ")
INPUT_SHAPE_FIELDS = ("rank", "reserved", "sizes")
INPUT_SHAPE = struct.Struct(f"<II{MAX_RANK}q")

assert VSET_HEADER.size == VSET_HEADER_SIZE and VARIANT_RECORD.size == 16
assert INPUT_SHAPE.size == 72


class DType(IntEnum):
    """ExecuTorch ScalarType codes."""
    INT32 = 3
    INT64 = 4
    FLOAT16 = 5
    FLOAT32 = 6
    BOOL = 11
    BFLOAT16 = 15


class Storage(IntEnum):
    ARENA = 0
    WEIGHT = 1
    INPUT = 2
    OUTPUT = 3
    STATE = 4


class Precision(IntEnum):
    FP32 = 0
    TF32 = 1
    FP16 = 2
    BF16 = 3


class Opcode(IntEnum):
    COPY = 1
    BINARY = 2
    UNARY = 3
    WHERE = 4
    MATMUL = 5
    SOFTMAX = 6
    LAYER_NORM = 7
    REDUCE = 8
    EMBEDDING = 9
    FILL = 10
    CONV2D = 11
    POOL2D = 12
    INDEX_PUT = 13
    FUSED_ELEMENTWISE = 14


class BinaryKind(IntEnum):
    ADD = 0
    SUB = 1
    MUL = 2
    DIV = 3
    POW = 4
    MAXIMUM = 5
    MINIMUM = 6
    EQ = 7
    NE = 8
    LT = 9
    LE = 10
    GT = 11
    GE = 12
    LOGICAL_AND = 13
    LOGICAL_OR = 14
    FLOOR_DIV = 15
    REMAINDER = 16


class UnaryKind(IntEnum):
    RELU = 0
    GELU_ERF = 1
    GELU_TANH = 2
    SIGMOID = 3
    TANH = 4
    SILU = 5
    EXP = 6
    LOG = 7
    COS = 8
    SIN = 9
    RSQRT = 10
    SQRT = 11
    NEG = 12
    ABS = 13
    HARDSWISH = 14
    HARDSIGMOID = 15
    CLAMP = 16
    LOGICAL_NOT = 17
    ERF = 18
    RECIPROCAL = 19
    POW_SCALAR = 20
    LEAKY_RELU = 21
    IDENTITY = 22
    ERFINV = 23


MAX_FUSED_INPUTS = 8
MAX_FUSED_INSTRS = 16
FUSED_INSTR_WIDTH = 8


class FusedForm(IntEnum):
    UNARY = 0
    BINARY = 1
    WHERE = 2


class ReduceKind(IntEnum):
    SUM = 0
    MEAN = 1
    AMAX = 2
    AMIN = 3
    ANY = 4


class PoolKind(IntEnum):
    MAX = 0
    AVG = 1


class Epilogue(IntEnum):
    NONE = 0
    RELU = 1
    GELU_ERF = 2
    GELU_TANH = 3


# Operand layouts, copied verbatim from the comment above each opcode in blob_format.h.
# "t name": tensor id (-1 = none where allowed), "f name": double, "n name": integer,
# "[rank] name": `rank` consecutive integers ("[a*b] name": a * b of them, both earlier "n" fields
# or numbers); "t[k] name": k tensor ids. A "(Kind)" suffix names the enum the integer holds.
OPERAND_LAYOUTS = {
    Opcode.COPY: ("t x", "t out", "n rank", "[rank] sizes", "n in_offset", "[rank] in_strides",
                  "n out_offset", "[rank] out_strides"),
    Opcode.BINARY: ("n kind(BinaryKind)", "t a", "t b", "t out", "f alpha", "f scalar", "n rank",
                    "[rank] sizes", "[rank] a_strides", "[rank] b_strides"),
    Opcode.UNARY: ("n kind(UnaryKind)", "t x", "t out", "f p0", "f p1"),
    Opcode.WHERE: ("t cond", "t a", "t b", "t out", "n rank", "[rank] sizes", "[rank] cond_strides",
                   "[rank] a_strides", "[rank] b_strides"),
    Opcode.MATMUL: ("t a", "t b", "t bias", "t out", "n batch", "n M", "n N", "n K", "n trans_a",
                    "n trans_b", "n a_batch_stride", "n b_batch_stride", "n bias_row_stride",
                    "n bias_col_stride", "f alpha", "f beta", "n epilogue(Epilogue)",
                    "t residual"),
    Opcode.SOFTMAX: ("t x", "t out", "n outer", "n dim", "n inner", "n is_log"),
    Opcode.LAYER_NORM: ("t x", "t weight", "t bias", "t out", "n rows", "n cols", "f eps"),
    Opcode.REDUCE: ("n kind(ReduceKind)", "t x", "t out", "n outer", "n reduce", "n inner"),
    Opcode.EMBEDDING: ("t weight", "t indices", "t out", "n num_indices", "n dim", "n vocab"),
    Opcode.FILL: ("t out", "f value"),
    Opcode.CONV2D: ("t x", "t weight", "t bias", "t out", "n N", "n C_in", "n H", "n W", "n C_out",
                    "n kH", "n kW", "n stride_h", "n stride_w", "n pad_h", "n pad_w", "n dil_h",
                    "n dil_w", "n groups", "n H_out", "n W_out"),
    Opcode.POOL2D: ("n kind(PoolKind)", "t x", "t out", "n N", "n C", "n H", "n W", "n kH", "n kW",
                    "n stride_h", "n stride_w", "n pad_h", "n pad_w", "n dil_h", "n dil_w",
                    "n H_out", "n W_out", "n count_include_pad"),
    Opcode.INDEX_PUT: ("t values", "t positions", "t out", "n outer", "n dim_size", "n inner",
                       "n num_positions"),
    Opcode.FUSED_ELEMENTWISE: ("t out", "n rank", "[rank] sizes", "n num_inputs",
                               "t[num_inputs] inputs", "[num_inputs*rank] strides", "n num_instrs",
                               "[num_instrs*8] program"),
}


def parse_field(spec):
    """"n kind(BinaryKind)" -> ("n", "kind"); "[rank] sizes" -> ("[rank]", "sizes")."""
    kind, name = spec.split(" ", 1)
    return kind, name.split("(", 1)[0]


FIELDS = {op: tuple(parse_field(s) for s in layout) for op, layout in OPERAND_LAYOUTS.items()}


def tensor_fields(opcode):
    """Names of the operands of `opcode` that hold one tensor id each."""
    return tuple(name for kind, name in FIELDS[opcode] if kind == "t")


def tensor_list_fields(opcode):
    """Names of the operands of `opcode` that hold a list of tensor ids ("t[k]")."""
    return tuple(name for kind, name in FIELDS[opcode] if kind.startswith("t["))


def _count(kind, values):
    """The element count of a "[a*b]" or "t[a]" field from the fields decoded before it."""
    n = 1
    for factor in kind[kind.index("[") + 1:-1].split("*"):
        n *= int(factor) if factor.isdigit() else int(values[factor])
    return n


def double_to_bits(value):
    return struct.unpack("<q", struct.pack("<d", float(value)))[0]


def bits_to_double(bits):
    return struct.unpack("<d", struct.pack("<q", bits))[0]


def encode_operands(opcode, operands):
    """Flattens the operand dict of one op into the int64 slots of the operand pool."""
    out = []
    for kind, name in FIELDS[opcode]:
        value = operands[name]
        if kind == "f":
            out.append(double_to_bits(value))
        elif "[" in kind:
            n = _count(kind, operands)
            if len(value) != n:
                what = "rank" if kind == "[rank]" else kind[kind.index("[") + 1:-1]
                raise ValueError(f"{opcode.name}.{name} has {len(value)} entries, {what} is {n}")
            out.extend(int(v) for v in value)
        else:
            out.append(int(value))
    return out


def decode_operands(opcode, slots):
    """Inverse of encode_operands: int64 slots -> operand dict (lists for "[k]" fields)."""
    operands = {}
    pos = 0
    for kind, name in FIELDS[opcode]:
        if "[" in kind:
            n = _count(kind, operands)
            if n < 0 or pos + n > len(slots):
                raise ValueError(f"{opcode.name}.{name}: {n} entries past the {len(slots)} "
                                 "operands")
            operands[name] = [int(v) for v in slots[pos:pos + n]]
            pos += n
        else:
            if pos >= len(slots):
                raise ValueError(f"{opcode.name}: {len(slots)} operands, layout needs more")
            operands[name] = bits_to_double(slots[pos]) if kind == "f" else int(slots[pos])
            pos += 1
    if pos != len(slots):
        raise ValueError(f"{opcode.name}: {len(slots)} operands, layout uses {pos}")
    return operands


TORCH_DTYPES = {
    DType.INT32: torch.int32,
    DType.INT64: torch.int64,
    DType.FLOAT16: torch.float16,
    DType.FLOAT32: torch.float32,
    DType.BOOL: torch.bool,
    DType.BFLOAT16: torch.bfloat16,
}
DTYPES = {v: k for k, v in TORCH_DTYPES.items()}
