"""Reference semantics of the elementwise opcodes: kCopy, kBinary, kUnary, kWhere,
kFusedElementwise, kRope and kFill, with the kind tables kFusedElementwise shares."""

import math

import torch
import torch.nn.functional as F

from kiln_executorch.aot.blob_format import (FUSED_INSTR_WIDTH, BinaryKind, DType, FusedForm,
                                             Opcode, TORCH_DTYPES, UnaryKind, bits_to_double)

from .machine import semantics, strided_index

_ARITHMETIC = {BinaryKind.ADD, BinaryKind.SUB, BinaryKind.MUL, BinaryKind.DIV, BinaryKind.POW,
               BinaryKind.MAXIMUM, BinaryKind.MINIMUM, BinaryKind.FLOOR_DIV, BinaryKind.REMAINDER,
               BinaryKind.FMOD}
_INT_UNARY = {UnaryKind.RELU, UnaryKind.NEG, UnaryKind.ABS, UnaryKind.CLAMP, UnaryKind.IDENTITY}


@semantics(Opcode.COPY)
def _copy(m, x, out, rank, sizes, in_offset, in_strides, out_offset, out_strides):
    src = in_offset + strided_index(sizes, in_strides)
    dst = out_offset + strided_index(sizes, out_strides)
    m.write(out, dst, m.gather(x, src))


@semantics(Opcode.ROPE)
def _rope(m, x, cos, sin, out, rank, sizes, x_offset, x_strides, cos_offset, cos_strides,
          sin_offset, sin_strides):
    def read(t, offset, strides):
        return m.gather(t, offset + strided_index(sizes, strides)).to(m.fp).reshape(sizes)
    v = read(x, x_offset, x_strides)
    h = sizes[-1] // 2
    rotated = torch.cat([-v[..., h:], v[..., :h]], dim=-1)
    m.write(out, None, v * read(cos, cos_offset, cos_strides) +
            rotated * read(sin, sin_offset, sin_strides))


@semantics(Opcode.BINARY)
def _binary(m, kind, a, b, out, alpha, scalar, rank, sizes, a_strides, b_strides):
    kind = BinaryKind(kind)
    va = m.gather(a, strided_index(sizes, a_strides))
    vb = m.gather(b, strided_index(sizes, b_strides)) if b >= 0 else None
    out_dtype = m.g.tensors[out].dtype
    if kind in _ARITHMETIC:
        floating = out_dtype.is_floating_point
    elif kind in (BinaryKind.LOGICAL_AND, BinaryKind.LOGICAL_OR):
        floating = False
    else:
        floating = va.dtype.is_floating_point or (
            vb.dtype.is_floating_point if vb is not None else not _integral(scalar))
    math_dtype = m.fp if floating else torch.int64
    va = va.to(math_dtype)
    vb = vb.to(math_dtype) if vb is not None else torch.tensor(
        scalar if floating else int(scalar), dtype=math_dtype)
    alpha = alpha if floating else int(alpha)
    m.write(out, None, _BINARY[kind](va, vb, alpha))


@semantics(Opcode.UNARY)
def _unary(m, kind, x, out, p0, p1):
    kind = UnaryKind(kind)
    v = m.read(x)
    integer = not v.dtype.is_floating_point and kind in _INT_UNARY
    v = v.to(torch.int64 if integer else m.fp)
    if kind == UnaryKind.CLAMP and integer:
        p0 = math.ceil(p0) if math.isfinite(p0) else None
        p1 = math.floor(p1) if math.isfinite(p1) else None
    m.write(out, None, _UNARY[kind](v, p0, p1))


@semantics(Opcode.WHERE)
def _where(m, cond, a, b, out, rank, sizes, cond_strides, a_strides, b_strides):
    c = m.gather(cond, strided_index(sizes, cond_strides)) != 0
    va = m.gather(a, strided_index(sizes, a_strides))
    vb = m.gather(b, strided_index(sizes, b_strides))
    dtype = m.fp if m.g.tensors[out].dtype.is_floating_point else torch.int64
    m.write(out, None, torch.where(c, va.to(dtype), vb.to(dtype)))


@semantics(Opcode.FUSED_ELEMENTWISE)
def _fused_elementwise(m, out, rank, sizes, num_inputs, inputs, strides, num_instrs,
                       program):
    # Each instruction computes as the op it replaces and rounds to that op's output dtype,
    # so a fused program gives the same values as the unfused ops.
    regs = [m.gather(t, strided_index(sizes, strides[i * rank:(i + 1) * rank]))
            .to(m.fp) for i, t in enumerate(inputs)]
    for j in range(num_instrs):
        form, kind, s0, s1, s2, p0, p1, rnd = program[j * FUSED_INSTR_WIDTH:
                                                      (j + 1) * FUSED_INSTR_WIDTH]
        p0, p1 = bits_to_double(p0), bits_to_double(p1)
        if form == FusedForm.UNARY:
            v = _UNARY[UnaryKind(kind)](regs[s0], p0, p1)
        elif form == FusedForm.BINARY:
            b = regs[s1] if s1 >= 0 else torch.tensor(p1, dtype=m.fp)
            v = _BINARY[BinaryKind(kind)](regs[s0], b, p0)
        else:
            v = torch.where(regs[s0] != 0, regs[s1], regs[s2])
        regs.append(v.to(TORCH_DTYPES[DType(rnd)]).to(m.fp))
    m.write(out, None, regs[-1])


@semantics(Opcode.FILL)
def _fill(m, out, value):
    m.write(out, None, torch.full((m.g.tensors[out].numel,), value, dtype=m.fp))


def _clamp(x, lo, hi):
    """min(max(x, lo), hi); None is an absent bound."""
    x = torch.clamp(x, min=lo) if lo is not None else x
    return torch.clamp(x, max=hi) if hi is not None else x


def _integral(x):
    return math.isfinite(x) and x == int(x)


def _int_div(a, b):
    return torch.div(a, b, rounding_mode="trunc")


_BINARY = {
    BinaryKind.ADD: lambda a, b, alpha: a + alpha * b,
    BinaryKind.SUB: lambda a, b, alpha: a - alpha * b,
    BinaryKind.MUL: lambda a, b, alpha: a * b,
    BinaryKind.DIV: lambda a, b, alpha: a / b if a.is_floating_point() else _int_div(a, b),
    BinaryKind.POW: lambda a, b, alpha: torch.pow(a, b),
    BinaryKind.MAXIMUM: lambda a, b, alpha: torch.maximum(a, b),
    BinaryKind.MINIMUM: lambda a, b, alpha: torch.minimum(a, b),
    BinaryKind.EQ: lambda a, b, alpha: a == b,
    BinaryKind.NE: lambda a, b, alpha: a != b,
    BinaryKind.LT: lambda a, b, alpha: a < b,
    BinaryKind.LE: lambda a, b, alpha: a <= b,
    BinaryKind.GT: lambda a, b, alpha: a > b,
    BinaryKind.GE: lambda a, b, alpha: a >= b,
    BinaryKind.LOGICAL_AND: lambda a, b, alpha: (a != 0) & (b != 0),
    BinaryKind.LOGICAL_OR: lambda a, b, alpha: (a != 0) | (b != 0),
    BinaryKind.FLOOR_DIV: lambda a, b, alpha: torch.div(a, b, rounding_mode="floor"),
    BinaryKind.REMAINDER: lambda a, b, alpha: torch.remainder(a, b),
    BinaryKind.FMOD: lambda a, b, alpha: torch.fmod(a, b),
}

_SQRT1_2 = math.sqrt(0.5)
_UNARY = {
    UnaryKind.RELU: lambda x, p0, p1: torch.relu(x),
    UnaryKind.GELU_ERF: lambda x, p0, p1: 0.5 * x * (1 + torch.erf(x * _SQRT1_2)),
    UnaryKind.GELU_TANH: lambda x, p0, p1: F.gelu(x, approximate="tanh"),
    UnaryKind.SIGMOID: lambda x, p0, p1: torch.sigmoid(x),
    UnaryKind.TANH: lambda x, p0, p1: torch.tanh(x),
    UnaryKind.SILU: lambda x, p0, p1: x * torch.sigmoid(x),
    UnaryKind.EXP: lambda x, p0, p1: torch.exp(x),
    UnaryKind.LOG: lambda x, p0, p1: torch.log(x),
    UnaryKind.COS: lambda x, p0, p1: torch.cos(x),
    UnaryKind.SIN: lambda x, p0, p1: torch.sin(x),
    UnaryKind.RSQRT: lambda x, p0, p1: torch.rsqrt(x),
    UnaryKind.SQRT: lambda x, p0, p1: torch.sqrt(x),
    UnaryKind.NEG: lambda x, p0, p1: -x,
    UnaryKind.ABS: lambda x, p0, p1: x.abs(),
    UnaryKind.HARDSWISH: lambda x, p0, p1: x * torch.clamp(x + 3, 0, 6) / 6,
    UnaryKind.HARDSIGMOID: lambda x, p0, p1: torch.clamp(x + 3, 0, 6) / 6,
    UnaryKind.CLAMP: lambda x, p0, p1: _clamp(x, p0, p1),
    UnaryKind.LOGICAL_NOT: lambda x, p0, p1: x == 0,
    UnaryKind.ERF: lambda x, p0, p1: torch.erf(x),
    UnaryKind.RECIPROCAL: lambda x, p0, p1: 1 / x,
    UnaryKind.POW_SCALAR: lambda x, p0, p1: torch.pow(x, p0),
    UnaryKind.LEAKY_RELU: lambda x, p0, p1: torch.where(x > 0, x, p0 * x),
    UnaryKind.IDENTITY: lambda x, p0, p1: x,
    UnaryKind.ERFINV: lambda x, p0, p1: torch.erfinv(x),
    UnaryKind.ELU: lambda x, p0, p1: p1 * torch.where(x > 0, x, p0 * torch.expm1(x)),
}
# Kinds that are one torch function of x.
_UNARY.update({kind: (lambda fn: lambda x, p0, p1: fn(x))(fn) for kind, fn in {
    UnaryKind.CEIL: torch.ceil, UnaryKind.FLOOR: torch.floor, UnaryKind.TRUNC: torch.trunc,
    UnaryKind.ROUND: torch.round, UnaryKind.LOG1P: torch.log1p, UnaryKind.LOG2: torch.log2,
    UnaryKind.LOG10: torch.log10}.items()})
