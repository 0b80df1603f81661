"""Elementwise binary operators (arithmetic, comparisons, logical) and where: kBinary / kWhere."""

import torch

from ..blob_format import BinaryKind, Opcode, UnaryKind
from .common import (FLOAT, any_input, arguments, bool_only, broadcast_strides, coalesce,
                     contiguous_strides, dtype, shape)
from . import rope
from .registry import Family

aten = torch.ops.aten
family = Family(__name__)


def _arithmetic_check(node, ctx):
    b = node.args[1]
    if dtype(node) == torch.bool:
        return "arithmetic with a Bool result"
    if not isinstance(b, (torch.fx.Node, int, float, bool)):
        return f"operand {b!r} is not a tensor or a number"
    alpha = arguments(node).get("alpha", 1)
    if not isinstance(alpha, (int, float)):
        return f"alpha {alpha!r} is not a number"
    return None


def _division_check(node, ctx):
    mode = arguments(node).get("rounding_mode")
    if mode not in (None, "floor", "trunc"):
        return f"rounding_mode={mode!r}"
    if mode is None and dtype(node) not in FLOAT:
        return "true division with an integer result"
    if mode == "trunc" and dtype(node) not in FLOAT:
        return "integer division with rounding_mode='trunc' (Kiln divides integers with floor)"
    return _arithmetic_check(node, ctx)


def _compare_check(node, ctx):
    b = node.args[1]
    if not isinstance(b, (torch.fx.Node, int, float, bool)):
        return f"operand {b!r} is not a tensor or a number"
    return None


def _pow_tensor_check(node, ctx):
    if dtype(node) not in FLOAT:
        return "integer power"
    return _arithmetic_check(node, ctx)


def _binary(kind):
    def lower(lw, node):
        if kind == BinaryKind.ADD:
            rotated = rope.lower(lw, node)   # x * cos + rotate_half(x) * sin: one kRope
            if rotated is not None:
                return rotated
        a, b = node.args[:2]
        return lw.binary(kind, a, b, shape(node), dtype(node), arguments(node).get("alpha", 1),
                         node.name)
    return lower


# {kind of the kBinary: the overloads lowered to it}, one table per check.
family.register_kinds(_arithmetic_check, _binary, {
    BinaryKind.ADD: (aten.add.Tensor, aten.add.Scalar),
    BinaryKind.SUB: (aten.sub.Tensor, aten.sub.Scalar),
    BinaryKind.MUL: (aten.mul.Tensor, aten.mul.Scalar),
    BinaryKind.REMAINDER: (aten.remainder.Tensor, aten.remainder.Scalar),
    BinaryKind.FMOD: (aten.fmod.Tensor, aten.fmod.Scalar),
    BinaryKind.MAXIMUM: aten.maximum.default, BinaryKind.MINIMUM: aten.minimum.default})
family.register_kinds(_division_check, _binary,
                      {BinaryKind.DIV: (aten.div.Tensor, aten.div.Scalar)})
family.register_kinds(_pow_tensor_check, _binary, {BinaryKind.POW: aten.pow.Tensor_Tensor})
family.register_kinds(_compare_check, _binary, {
    BinaryKind.EQ: (aten.eq.Tensor, aten.eq.Scalar),
    BinaryKind.NE: (aten.ne.Tensor, aten.ne.Scalar),
    BinaryKind.LT: (aten.lt.Tensor, aten.lt.Scalar),
    BinaryKind.LE: (aten.le.Tensor, aten.le.Scalar),
    BinaryKind.GT: (aten.gt.Tensor, aten.gt.Scalar),
    BinaryKind.GE: (aten.ge.Tensor, aten.ge.Scalar),
    BinaryKind.LOGICAL_AND: aten.logical_and.default,
    BinaryKind.LOGICAL_OR: aten.logical_or.default})
# Bitwise and/or of Bool tensors are the logical ones.
family.register_kinds(bool_only, _binary, {BinaryKind.LOGICAL_AND: aten.bitwise_and.Tensor,
                                           BinaryKind.LOGICAL_OR: aten.bitwise_or.Tensor})


@family.lowers(aten.div.Tensor_mode, check=_division_check)
def _div_mode(lw, node):
    mode = arguments(node)["rounding_mode"]
    if mode != "trunc":
        return _binary(BinaryKind.FLOOR_DIV if mode == "floor" else BinaryKind.DIV)(lw, node)
    # trunc(a / b), as eager computes it for floats: the true quotient, then kUnary TRUNC. (In a
    # bf16 / fp16 program the quotient is stored in that type before the trunc.)
    a, b = node.args[:2]
    quotient = lw.binary(BinaryKind.DIV, a, b, shape(node), dtype(node), 1, node.name + "_quotient")
    return lw.unary(node, UnaryKind.TRUNC, x=quotient)


@family.lowers(aten.where.self, check=any_input)
def _where(lw, node):
    out_shape = shape(node)
    operands = []
    for x in node.args[:3]:
        t, s = lw.operand(x, broadcast_scalar=True)
        operands.append((t, broadcast_strides(s, out_shape)))
    (tc, sc), (ta, sa), (tb, sb) = operands
    sizes, (sc, sa, sb, _) = coalesce(out_shape, sc, sa, sb, contiguous_strides(out_shape))
    out = lw.new(node)
    lw.g.add_op(Opcode.WHERE, cond=tc, a=ta, b=tb, out=out, rank=len(sizes), sizes=sizes,
                cond_strides=sc, a_strides=sa, b_strides=sb)
    return out
