"""The Python mirror (kiln_executorch.aot.blob_format) equals the C++ format definition.

The mirror is built from libkiln_builder.so's kiln_builder_format_description(); these tests check
that it says what the description says, that every opcode has a layout, and that the struct
formats Python keeps for the records have the offsets and sizes of the C++ structs."""

import struct

import pytest

from kiln_executorch.aot import blob_format as bf
from kiln_executorch.aot.builder_library import format_description

DESC = format_description()


def test_constants_match():
    assert bf.MAGIC == DESC["magic"].encode() == b"KILNBLOB"
    assert (bf.FORMAT_VERSION, bf.HEADER_SIZE, bf.MAX_RANK, bf.WEIGHT_ALIGNMENT) == (
        DESC["format_version"], DESC["header_size"], DESC["max_rank"], DESC["weight_alignment"])
    assert bf.FLAG_EXTERNAL_WEIGHTS == DESC["flag_external_weights"]
    assert (bf.MAX_FUSED_INPUTS, bf.MAX_FUSED_INSTRS, bf.FUSED_INSTR_WIDTH) == (
        DESC["max_fused_inputs"], DESC["max_fused_instrs"], DESC["fused_instr_width"])
    vset = DESC["vset"]
    assert (bf.VSET_MAGIC, bf.VSET_FORMAT_VERSION, bf.VSET_HEADER_SIZE, bf.MAX_VARIANTS,
            bf.MAX_VSET_INPUTS, bf.VSET_BLOB_ALIGNMENT) == (
        vset["magic"].encode(), vset["format_version"], vset["header_size"],
        vset["max_variants"], vset["max_inputs"], vset["blob_alignment"])


def _struct_members(fmt, names):
    """[(name, offset, size)] of a little-endian struct format, one item per name."""
    items = []
    for token in struct.Struct(fmt).format[1:].replace("s", "s ").replace("q", "q ").replace(
            "Q", "Q ").replace("I", "I ").split():
        items.append(token)
    out, offset = [], 0
    for name, item in zip(names, items, strict=True):
        size = struct.calcsize("<" + item)
        out.append([name, offset, size])
        offset += size
    return out


@pytest.mark.parametrize("name, fmt, fields", [
    ("Header", bf.HEADER, bf.HEADER_FIELDS),
    ("TensorRecord", bf.TENSOR_RECORD, bf.TENSOR_RECORD_FIELDS),
    ("OpRecord", bf.OP_RECORD, bf.OP_RECORD_FIELDS),
    ("VariantSetHeader", bf.VSET_HEADER, bf.VSET_HEADER_FIELDS),
    ("VariantRecord", bf.VARIANT_RECORD, bf.VARIANT_RECORD_FIELDS),
    ("InputShape", bf.INPUT_SHAPE, bf.INPUT_SHAPE_FIELDS),
])
def test_record_layouts_match(name, fmt, fields):
    assert _struct_members(fmt.format, fields) == DESC["records"][name]


@pytest.mark.parametrize("enum", [bf.Storage, bf.Precision, bf.BinaryKind, bf.UnaryKind,
                                  bf.ReduceKind, bf.PoolKind, bf.Epilogue, bf.FusedForm,
                                  bf.BagMode])
def test_enum_matches(enum):
    assert {m.name: m.value for m in enum} == {
        k.upper(): v for k, v in DESC["enums"][enum.__name__]}


def test_dtypes_and_opcodes_match():
    assert {m.name: m.value for m in bf.DType} == {n.upper(): v for n, v, _, _ in DESC["dtypes"]}
    assert {m.name: m.value for m in bf.Opcode} == {
        op["name"].upper(): op["value"] for op in DESC["opcodes"]}


def test_every_opcode_has_its_layout():
    assert set(bf.OPERAND_LAYOUTS) == set(bf.Opcode)
    for op in DESC["opcodes"]:
        layout = bf.OPERAND_LAYOUTS[bf.Opcode(op["value"])]
        assert [bf.parse_field(s)[1] for s in layout] == [f["name"] for f in op["fields"]]


def test_known_layouts_are_unchanged():
    """A few layouts spelled out, so a table edit that changes the wire format shows here."""
    assert bf.OPERAND_LAYOUTS[bf.Opcode.UNARY] == ("n kind(UnaryKind)", "t x", "t out", "f p0",
                                                   "f p1")
    assert bf.OPERAND_LAYOUTS[bf.Opcode.FUSED_ELEMENTWISE] == (
        "t out", "n rank", "[rank] sizes", "n num_inputs", "t[num_inputs] inputs",
        "[num_inputs*rank] strides", "n num_instrs", "[num_instrs*8] program")
    assert len(bf.UnaryKind) == 32 and bf.UnaryKind.ERFINV == 23 and bf.UnaryKind.ELU == 31
    assert bf.Opcode.FUSED_ELEMENTWISE == 14
    assert bf.Opcode.GATHER == 17 and bf.OPERAND_LAYOUTS[bf.Opcode.GATHER] == (
        "t x", "t index", "t out", "n rank", "[rank] sizes", "[rank] x_strides",
        "[rank] index_strides", "n index_stride", "n dim_size")


def test_dtype_codes_are_executorch_scalar_types():
    from executorch.exir.scalar_type import ScalarType
    for dtype in bf.DType:
        assert ScalarType[{"INT32": "INT", "INT64": "LONG", "FLOAT16": "HALF", "FLOAT32": "FLOAT",
                           "BOOL": "BOOL", "BFLOAT16": "BFLOAT16"}[dtype.name]] == dtype.value


def test_operands_round_trip():
    operands = dict(kind=bf.BinaryKind.SUB, a=0, b=-1, out=1, alpha=0.5, scalar=float("-inf"),
                    rank=2, sizes=[3, 4], a_strides=[4, 1], b_strides=[0, 0])
    slots = bf.encode_operands(bf.Opcode.BINARY, operands)
    assert len(slots) == 7 + 3 * 2
    assert bf.decode_operands(bf.Opcode.BINARY, slots) == operands
    with pytest.raises(ValueError, match="sizes has 1 entries, rank is 2"):
        bf.encode_operands(bf.Opcode.BINARY, {**operands, "sizes": [3]})
