"""Python mirror of the Kiln engine blob format, version 4 (format/blob_format.h and the op table
format/op_table.def).

Nothing here is kept by hand: the constants, the enums (DType, Storage, Precision, Opcode and the
op kinds) and the operand layouts come from libkiln_builder.so's kiln_builder_format_description()
(the C++ table as JSON), loaded when this module is imported. Python adds only the struct formats
of the records, and tests/python/aot/test_blob_format.py checks those against the offsets and
sizes the same description gives. The module encodes IR operands for the builder (builder.py) and
reads blobs back (blob_reader.py).
"""

import struct
from enum import IntEnum

import torch

from .builder_library import format_description

_FORMAT = format_description()

MAGIC = _FORMAT["magic"].encode()
FORMAT_VERSION = _FORMAT["format_version"]
HEADER_SIZE = _FORMAT["header_size"]
MAX_RANK = _FORMAT["max_rank"]
WEIGHT_ALIGNMENT = _FORMAT["weight_alignment"]
# The header asks for 8-byte aligned sections; the arena alignment is the builder's choice
# (256 bytes: the widest vector access any kernel makes, and cuBLASLt's preferred alignment).
SECTION_ALIGNMENT = 8
ARENA_ALIGNMENT = 256
FLAG_EXTERNAL_WEIGHTS = _FORMAT["flag_external_weights"]  # Header.flags bit 0: shared weights

# The records, field by field as the header declares them (arrays are one struct item: bytes for
# char/uint8_t arrays, MAX_RANK integers for sizes). test_blob_format.py checks every offset and
# size against the description's "records".
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

# The variant set (format/variant_set.h): the engine blobs of one dynamic partition, each with the
# delegate input shapes it serves, and optionally one weights section they share.
_VSET = _FORMAT["vset"]
VSET_MAGIC = _VSET["magic"].encode()
VSET_FORMAT_VERSION = _VSET["format_version"]
VSET_HEADER_SIZE = _VSET["header_size"]
MAX_VARIANTS = _VSET["max_variants"]
MAX_VSET_INPUTS = _VSET["max_inputs"]
VSET_BLOB_ALIGNMENT = _VSET["blob_alignment"]
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

# The state-key container (format/state_keys.h): names the program states of a delegate's blob or
# variant set, so the delegates of one loaded program share them (a prefill and a decode method).
_SKEYS = _FORMAT["skeys"]
SKEYS_MAGIC = _SKEYS["magic"].encode()
(SKEYS_FORMAT_VERSION, SKEYS_HEADER_SIZE, MAX_STATE_KEYS, MAX_STATE_KEY_LENGTH,
 SKEYS_PAYLOAD_ALIGNMENT) = (_SKEYS[k] for k in ("format_version", "header_size", "max_states",
                                                 "max_key_length", "payload_alignment"))
SKEYS_HEADER_FIELDS = ("magic", "format_version", "header_size", "num_states", "reserved",
                       "container_size", "payload_offset", "payload_size")
SKEYS_HEADER = struct.Struct("<8sIIIIQQQ")

assert SKEYS_HEADER.size == SKEYS_HEADER_SIZE


def _python_name(name):
    """"Float32" -> "FLOAT32", "gelu_erf" -> "GELU_ERF"."""
    return name.upper()


DType = IntEnum("DType", [(_python_name(name), value) for name, value, _, _ in _FORMAT["dtypes"]])
DType.__doc__ = "ExecuTorch ScalarType codes."
Opcode = IntEnum("Opcode", [(_python_name(op["name"]), op["value"]) for op in _FORMAT["opcodes"]])


def _enum(name):
    return IntEnum(name, [(_python_name(k), v) for k, v in _FORMAT["enums"][name]])


Storage = _enum("Storage")
Precision = _enum("Precision")
BinaryKind = _enum("BinaryKind")
UnaryKind = _enum("UnaryKind")
FusedForm = _enum("FusedForm")
ReduceKind = _enum("ReduceKind")
PoolKind = _enum("PoolKind")
Epilogue = _enum("Epilogue")
BagMode = _enum("BagMode")
for _e in (DType, Opcode, Storage, Precision, BinaryKind, UnaryKind, FusedForm, ReduceKind,
           PoolKind, Epilogue, BagMode):
    _e.__module__ = __name__

MAX_FUSED_INPUTS = _FORMAT["max_fused_inputs"]
MAX_FUSED_INSTRS = _FORMAT["max_fused_instrs"]
FUSED_INSTR_WIDTH = _FORMAT["fused_instr_width"]
MAX_SCATTER_INDICES = _FORMAT["max_scatter_indices"]


def _layout_entry(field):
    """One field of the description as the layout strings below spell it."""
    kind, name = field["kind"], field["name"]
    if kind == "tensor":
        return f"t {name}"
    if kind == "tensor_list":
        return f"t[{field['count']}] {name}"
    if kind == "int_list":
        return f"[{field['count']}] {name}"
    if kind == "double":
        return f"f {name}"
    if kind == "enum":
        return f"n {name}({field['enum']})"
    return f"n {name}"


# Operand layouts, one tuple per opcode, from the op table.
# "t name": tensor id (-1 = none where allowed), "f name": double, "n name": integer,
# "[rank] name": `rank` consecutive integers ("[a*b] name": a * b of them, both earlier "n" fields
# or numbers); "t[k] name": k tensor ids. A "(Kind)" suffix names the enum the integer holds.
OPERAND_LAYOUTS = {Opcode(op["value"]): tuple(_layout_entry(f) for f in op["fields"])
                   for op in _FORMAT["opcodes"]}


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
