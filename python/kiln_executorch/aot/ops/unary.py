"""Elementwise unary operators (activations, math functions, clamps, logical not): kUnary."""

import math

import torch

from ..blob_format import BinaryKind, UnaryKind
from .common import (Value, any_input, arguments, bool_only, dtype, floating_input, numeric_input,
                     shape)
from .registry import Family

aten = torch.ops.aten
family = Family(__name__)


def _clamp_check(node, ctx):
    args = arguments(node)
    for bound in (args["min"], args["max"]):
        if bound is not None and not isinstance(bound, (int, float)):
            return f"clamp bound {bound!r} is not a number (tensor bounds are not supported)"
    return numeric_input(node, ctx)


def _gelu_check(node, ctx):
    approximate = arguments(node)["approximate"]
    if approximate not in ("none", "tanh"):
        return f"gelu approximate={approximate!r}"
    return floating_input(node, ctx)


def _pow_scalar_check(node, ctx):
    if not isinstance(node.args[1], (int, float)):
        return f"exponent {node.args[1]!r} is not a number"
    return floating_input(node, ctx)


def _unary(kind):
    return lambda lw, node: lw.unary(node, kind)


# {kind of the parameterless kUnary: the overload lowered to it}, one table per check.
family.register_kinds(floating_input, _unary, {
    UnaryKind.SIGMOID: aten.sigmoid.default,
    UnaryKind.TANH: aten.tanh.default,
    UnaryKind.SILU: aten.silu.default,
    UnaryKind.EXP: aten.exp.default,
    UnaryKind.LOG: aten.log.default,
    UnaryKind.COS: aten.cos.default,
    UnaryKind.SIN: aten.sin.default,
    UnaryKind.RSQRT: aten.rsqrt.default,
    UnaryKind.SQRT: aten.sqrt.default,
    UnaryKind.ERF: aten.erf.default,
    UnaryKind.ERFINV: aten.erfinv.default,
    UnaryKind.RECIPROCAL: aten.reciprocal.default,
    UnaryKind.HARDSWISH: aten.hardswish.default,
    UnaryKind.HARDSIGMOID: aten.hardsigmoid.default,
    UnaryKind.CEIL: aten.ceil.default,
    UnaryKind.FLOOR: aten.floor.default,
    UnaryKind.TRUNC: aten.trunc.default,
    UnaryKind.ROUND: aten.round.default,
    UnaryKind.LOG1P: aten.log1p.default,
    UnaryKind.LOG2: aten.log2.default,
    UnaryKind.LOG10: aten.log10.default,
})
family.register_kinds(numeric_input, _unary, {UnaryKind.RELU: aten.relu.default,
                                              UnaryKind.NEG: aten.neg.default,
                                              UnaryKind.ABS: aten.abs.default})
family.register_kinds(any_input, _unary, {UnaryKind.LOGICAL_NOT: aten.logical_not.default})
# Bitwise not of a Bool tensor is the logical one.
family.register_kinds(bool_only, _unary, {UnaryKind.LOGICAL_NOT: aten.bitwise_not.default})


@family.lowers(aten.round.decimals, check=floating_input)
def _round_decimals(lw, node):
    """round(x * 10^d) / 10^d (d < 0: round(x / 10^-d) * 10^-d), eager's order of operations with
    the power of ten as a float: kBinary, kUnary ROUND (half to even), kBinary."""
    decimals = arguments(node)["decimals"]
    if decimals == 0:
        return lw.unary(node, UnaryKind.ROUND)
    power = float(10.0 ** abs(decimals))
    into, back = (BinaryKind.MUL, BinaryKind.DIV) if decimals > 0 else (BinaryKind.DIV, BinaryKind.MUL)
    out_shape, out_dtype = shape(node), dtype(node)
    scaled = lw.binary(into, node.args[0], power, out_shape, out_dtype, 1, node.name + "_scaled")
    rounded = lw.unary_of(UnaryKind.ROUND, scaled, out_shape, out_dtype, name=node.name + "_rounded")
    return lw.binary(back, Value(rounded, out_shape), power, out_shape, out_dtype, 1, node.name)


@family.lowers(aten.gelu.default, check=_gelu_check)
def _gelu(lw, node):
    tanh = arguments(node)["approximate"] == "tanh"
    return lw.unary(node, UnaryKind.GELU_TANH if tanh else UnaryKind.GELU_ERF)


@family.lowers(aten.leaky_relu.default, check=floating_input)
def _leaky_relu(lw, node):
    return lw.unary(node, UnaryKind.LEAKY_RELU, arguments(node)["negative_slope"])


@family.lowers(aten.pow.Tensor_Scalar, check=_pow_scalar_check)
def _pow_scalar(lw, node):
    return lw.unary(node, UnaryKind.POW_SCALAR, node.args[1])


@family.lowers(aten.clamp.default, check=_clamp_check)
def _clamp(lw, node):
    args = arguments(node)
    lo = -math.inf if args["min"] is None else args["min"]
    hi = math.inf if args["max"] is None else args["max"]
    return lw.unary(node, UnaryKind.CLAMP, lo, hi)


@family.lowers(aten.hardtanh.default, check=floating_input)
def _hardtanh(lw, node):
    args = arguments(node)
    return lw.unary(node, UnaryKind.CLAMP, args["min_val"], args["max_val"])


def _elu_check(node, ctx):
    args = arguments(node)
    for name in ("alpha", "scale", "input_scale"):
        if not isinstance(args[name], (int, float)):
            return f"elu {name} {args[name]!r} is not a number"
    if args["input_scale"] != 1:
        return f"elu input_scale={args['input_scale']} (Kiln's elu has input_scale 1)"
    return floating_input(node, ctx)


@family.lowers(aten.elu.default, check=_elu_check)
def _elu(lw, node):
    args = arguments(node)
    return lw.unary(node, UnaryKind.ELU, args["alpha"], args["scale"])
