"""The Python mirror (kiln_executorch.aot.blob_format) equals format/blob_format.h.

Every number is parsed out of the header text, so a change on either side fails here."""

import re
from pathlib import Path

import pytest

from kiln_executorch.aot import blob_format as bf

HEADER = Path(__file__).resolve().parents[3] / "runtime" / "engine" / "blob_format.h"
TEXT = HEADER.read_text()
CODE = re.sub(r"//[^\n]*", "", TEXT)     # the header without comments

C_TYPES = {"uint32_t": "I", "uint64_t": "Q", "int64_t": "q"}


def constants():
    return {name: int(value) for name, value in
            re.findall(r"inline constexpr \w+ (k\w+) = (\d+);", CODE)}


def struct_fields(name):
    body = re.search(r"struct %s \{(.*?)\};" % name, CODE, re.S).group(1)
    return re.findall(r"(\w+) (\w+)(?:\[(\w+)\])?;", body)


def struct_format(name):
    """The struct's layout as a Python struct format, arrays as one item each."""
    fmt = "<"
    for ctype, _, count in struct_fields(name):
        n = constants().get(count, count)
        if ctype in ("char", "uint8_t"):
            fmt += f"{n}s"
        else:
            fmt += (f"{n}" if count else "") + C_TYPES[ctype]
    return fmt


def enum_values(name):
    body = re.search(r"enum class %s : \w+ \{(.*?)\};" % name, CODE, re.S).group(1)
    return {re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", k[1:]).upper(): int(v)
            for k, v in re.findall(r"(k\w+) = (\d+)", body)}


def operand_layouts():
    """{opcode name: layout tuple} from the "[t x, t out, ...]" comment above each opcode."""
    body = re.search(r"enum class Opcode : \w+ \{(.*?)\n\};", TEXT, re.S).group(1)
    layouts, pending = {}, []
    for line in body.splitlines():
        line = line.strip()
        if line.startswith("//"):
            pending.append(line[2:].strip())
            continue
        m = re.match(r"(k\w+) = \d+,", line)
        if m:
            comment = " ".join(pending)
            text = comment[comment.index("[t ") if "[t " in comment else comment.index("[n "):]
            text = text[1:text.rindex("]")]
            name = re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", m.group(1)[1:]).upper()
            layouts[name] = tuple(re.sub(r"\s+", " ", f).strip() for f in text.split(","))
            pending = []
    return layouts


def test_constants_match():
    c = constants()
    assert c["kFormatVersion"] == bf.FORMAT_VERSION
    assert c["kHeaderSize"] == bf.HEADER_SIZE
    assert c["kMaxRank"] == bf.MAX_RANK
    assert c["kWeightAlignment"] == bf.WEIGHT_ALIGNMENT


def test_magic_matches():
    chars = re.search(r"kMagic\[8\] = \{(.*?)\};", CODE).group(1)
    assert "".join(re.findall(r"'(.)'", chars)).encode() == bf.MAGIC


@pytest.mark.parametrize("name, fmt, fields", [
    ("Header", bf.HEADER, bf.HEADER_FIELDS),
    ("TensorRecord", bf.TENSOR_RECORD, bf.TENSOR_RECORD_FIELDS),
    ("OpRecord", bf.OP_RECORD, bf.OP_RECORD_FIELDS),
])
def test_record_layouts_match(name, fmt, fields):
    assert struct_format(name) == fmt.format
    assert tuple(f for _, f, _ in struct_fields(name)) == fields
    size = re.search(r"static_assert\(sizeof\(%s\) == (\w+)" % name, CODE).group(1)
    assert constants().get(size, size) in (fmt.size, str(fmt.size))


@pytest.mark.parametrize("enum", [bf.DType, bf.Storage, bf.Precision, bf.Opcode, bf.BinaryKind,
                                  bf.UnaryKind, bf.ReduceKind, bf.PoolKind, bf.Epilogue,
                                  bf.FusedForm])
def test_enum_matches(enum):
    assert enum_values(enum.__name__) == {m.name: m.value for m in enum}


def test_operand_layouts_match():
    parsed = operand_layouts()
    assert set(parsed) == {op.name for op in bf.Opcode}
    for op in bf.Opcode:
        assert parsed[op.name] == bf.OPERAND_LAYOUTS[op], op.name


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


# The variant set: format/variant_set.h against the VSET_* mirror.
VSET_HEADER = HEADER.parent / "variant_set.h"
VSET_CODE = re.sub(r"//[^\n]*", "", VSET_HEADER.read_text())


def vset_struct(name):
    body = re.search(r"struct %s \{(.*?)\};" % name, VSET_CODE, re.S).group(1)
    fields = re.findall(r"(\w+) (\w+)(?:\[([\w:]+)\])?;", body)
    fmt = "<"
    for ctype, _, count in fields:
        n = {"blob::kMaxRank": bf.MAX_RANK}.get(count, count)
        fmt += f"{n}s" if ctype == "char" else (f"{n}" if count else "") + C_TYPES[ctype]
    return fmt, tuple(f for _, f, _ in fields)


def test_variant_set_constants_match():
    c = {name: int(value) for name, value in
         re.findall(r"inline constexpr \w+ (k\w+) = (\d+);", VSET_CODE)}
    assert c == {"kFormatVersion": bf.VSET_FORMAT_VERSION, "kHeaderSize": bf.VSET_HEADER_SIZE,
                 "kMaxVariants": bf.MAX_VARIANTS, "kMaxInputs": bf.MAX_VSET_INPUTS,
                 "kBlobAlignment": bf.VSET_BLOB_ALIGNMENT}
    chars = re.search(r"kMagic\[8\] = \{(.*?)\};", VSET_CODE).group(1)
    assert "".join(re.findall(r"'(.)'", chars)).encode() == bf.VSET_MAGIC
    assert constants()["kFlagExternalWeights"] == bf.FLAG_EXTERNAL_WEIGHTS


@pytest.mark.parametrize("name, fmt, fields", [
    ("VariantSetHeader", bf.VSET_HEADER, bf.VSET_HEADER_FIELDS),
    ("VariantRecord", bf.VARIANT_RECORD, bf.VARIANT_RECORD_FIELDS),
    ("InputShape", bf.INPUT_SHAPE, bf.INPUT_SHAPE_FIELDS),
])
def test_variant_set_layouts_match(name, fmt, fields):
    assert vset_struct(name) == (fmt.format, fields)
    size = re.search(r"static_assert\(sizeof\(%s\) == (\w+)" % name, VSET_CODE).group(1)
    assert size in (str(fmt.size), "kHeaderSize")
