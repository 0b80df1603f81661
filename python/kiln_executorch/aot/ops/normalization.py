"""Softmax, log-softmax, layer norm (kSoftmax, kLayerNorm) and eval-mode batch norm, which is
folded into the convolution before it or else becomes a per-channel multiply and add."""

import math

import torch

from ..blob_format import BinaryKind, Opcode
from .common import (Value, arguments, dtype, floating_input, only_first_output_used, shape,
                     val, wrap_dim)
from .registry import Family

aten = torch.ops.aten
family = Family(__name__)


def _softmax_check(node, ctx):
    if arguments(node)["half_to_float"]:
        return "half_to_float=True"
    return floating_input(node, ctx)


def _layer_norm_check(node, ctx):
    return only_first_output_used(node, "mean/rstd") or floating_input(node, ctx)


def _batch_norm_check(node, ctx):
    args = arguments(node)
    x = args["input"]
    if val(x).dim() < 2:
        return "batch norm input of rank < 2"
    for name in ("weight", "bias", "running_mean", "running_var"):
        p = args[name]
        if p is not None and not ctx.is_constant(p):
            return f"{name} is not a constant (Kiln folds batch norm statistics ahead of time)"
    return only_first_output_used(node, "save_mean/save_invstd") or floating_input(node, ctx)


def _softmax(is_log):
    def lower(lw, node):
        x, dim = node.args[:2]
        sizes = shape(x)
        dim = wrap_dim(dim, len(sizes))
        out = lw.new(node)
        lw.g.add_op(Opcode.SOFTMAX, x=lw.tensor(x), out=out, outer=math.prod(sizes[:dim]),
                    dim=sizes[dim], inner=math.prod(sizes[dim + 1:]), is_log=int(is_log))
        return out
    return lower


family.register(aten._softmax.default, _softmax_check, _softmax(False))
family.register(aten._log_softmax.default, _softmax_check, _softmax(True))


@family.lowers(aten.native_layer_norm.default, check=_layer_norm_check)
def _layer_norm(lw, node):
    x, normalized_shape, weight, bias, eps = arguments(node).values()
    cols = math.prod(normalized_shape)
    out = lw.new(node)
    lw.g.add_op(Opcode.LAYER_NORM, x=lw.tensor(x),
                weight=-1 if weight is None else lw.tensor(weight),
                bias=-1 if bias is None else lw.tensor(bias), out=out,
                rows=math.prod(shape(x)) // cols, cols=cols, eps=float(eps), rms=0)
    return out, None, None


@family.lowers(aten._native_batch_norm_legit_no_training.default, check=_batch_norm_check)
def _batch_norm(lw, node):
    """Eval-mode batch norm: y = x * scale + shift per channel (dim 1), with scale and shift
    computed here; folded into the weights of a convolution that feeds only this node."""
    x, weight, bias, mean, var, _, eps = arguments(node).values()
    c = lw.const
    var64 = c[var].double()
    scale = torch.rsqrt(var64 + eps) * (c[weight].double() if weight is not None else 1.0)
    shift = (c[bias].double() if bias is not None else 0.0) - c[mean].double() * scale
    x_dtype = dtype(x)
    conv = lw.producer.get(x)
    if conv is not None and len(x.users) == 1:
        w_node, b_node = x.args[1], x.args[2]
        if w_node in c and (b_node is None or b_node in c):
            conv_bias = c[b_node].double() if b_node is not None else 0.0
            w = c[w_node].double()
            folded = w * scale.reshape((-1,) + (1,) * (w.dim() - 1))
            # In the shape the op reads (a 1-D convolution's weight is 4-D there).
            op_shape = lw.g.tensors[conv.operands["weight"]].shape
            conv.operands["weight"] = lw.g.add_weight(folded.reshape(op_shape).to(x_dtype))
            conv.operands["bias"] = lw.g.add_weight((conv_bias * scale + shift).to(x_dtype))
            return lw.tid[x], None, None
    sizes = shape(x)
    channel = (-1,) + (1,) * (len(sizes) - 2)
    scaled = lw.binary(BinaryKind.MUL, x, scale.reshape(channel).to(x_dtype), sizes, x_dtype)
    out = lw.binary(BinaryKind.ADD, Value(scaled, sizes), shift.reshape(channel).to(x_dtype),
                    sizes, x_dtype, name=node.name)
    return out, None, None
