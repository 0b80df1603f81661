"""2-D convolution and pooling over NCHW tensors: kConv2d (a 1x1 convolution of a 1x1 image is a
kMatmul; a 1-D convolution is a kConv2d of height 1, a transposed one a kConv2d of its input
spread out by the stride; a 3-D one is volumetric.py's) and kPool2d. The convolution keeps its bias
(its own, or a folded batch norm's); the C++ builder folds a following residual add and
activation into it and, by default, switches conv nets to channels-last (NHWC) memory."""

import torch

from ..blob_format import Epilogue, Opcode, PoolKind
from .common import (arguments, dtype, floating_input, matmul_dtypes, only_first_output_used,
                     pair, shape, val)
from .registry import Family
from .volumetric import convolution3d, spread, transposed_weight

aten = torch.ops.aten
family = Family(__name__)


def _convolution_check(node, ctx):
    args = arguments(node)
    x, weight = args["input"], args["weight"]
    if val(x).dim() not in (3, 4, 5) or val(weight).dim() != val(x).dim():
        return f"{val(x).dim() - 2}-D convolution: Kiln runs 1-D, 2-D and 3-D ones"
    if args["transposed"] and not ctx.is_constant(weight):
        return ("transposed convolution with a weight computed at run time (Kiln flips and "
                "transposes the weight ahead of time)")
    return matmul_dtypes(node, x, weight, args["bias"])


def _pool_input_check(node, ctx):
    if val(node.args[0]).dim() != 4:
        return "pooling input is not NCHW (rank 4)"
    return floating_input(node, ctx)


def _max_pool_check(node, ctx):
    return only_first_output_used(node, "the indices output") or _pool_input_check(node, ctx)


def _avg_pool_check(node, ctx):
    if arguments(node)["divisor_override"] is not None:
        return "divisor_override"
    return _pool_input_check(node, ctx)


def _conv_weight_2d(lw, weight, shape_2d):
    """A 1-D convolution's weight [C_out, C_in / groups, K] as the [C_out, C_in / groups, 1, K]
    kConv2d reads: a weight of its own when constant (so the channels-last pass permutes its
    bytes ahead of time), else a view."""
    if weight in lw.const:
        return lw.g.add_weight(lw.const[weight].reshape(shape_2d), name=f"{weight.name}_2d")
    return lw.g.add_alias(lw.tensor(weight), shape_2d)


def _as_2d(v, fill, one_d):
    """A convolution's (H, W) parameter: a 1-D convolution's one value is W's, H's is `fill`."""
    return (fill, v[0]) if one_d else tuple(pair(v))


@family.lowers(aten.convolution.default, check=_convolution_check)
def _convolution(lw, node):
    """A 1-D convolution is a kConv2d of [N, C, 1, L] (x, weight and result viewed so); a
    transposed one a kConv2d of the zero-interleaved input (_transposed)."""
    args = arguments(node)
    x, weight, bias, groups = args["input"], args["weight"], args["bias"], args["groups"]
    if val(x).dim() == 5:
        return convolution3d(lw, node)
    one_d = val(x).dim() == 3
    lift = (lambda s: (s[0], s[1], 1, s[2])) if one_d else tuple
    x4, w4, out4 = lift(shape(x)), lift(shape(weight)), lift(shape(node))
    geometry = [_as_2d(args[k], f, one_d) for k, f in
                (("stride", 1), ("padding", 0), ("dilation", 1))]
    if args["transposed"]:
        xt, wt, geometry = _transposed(lw, node, x4, w4, out4, geometry)
    elif x4[2:] == w4[2:] == (1, 1) and groups == 1 and geometry[1] == (0, 0):
        # A 1x1 convolution of a 1x1 image (squeeze-and-excitation blocks) is a GEMM:
        # out[n, :] = weight[C_out, C_in] @ x[n, :] + bias. cuBLASLt runs it with the bias and a
        # following ReLU in its epilogue; cuDNN's convolution paths are slow at this shape.
        # (No producer entry: batch-norm folding rewrites convolution weights only.)
        out = lw.new(node)
        lw.matmul(out, (lw.tensor(x), False), (lw.tensor(weight), True),
                  -1 if bias is None else lw.tensor(bias), 1, x4[0], w4[0], x4[1],
                  bias_shape=(w4[0],), beta=1.0)
        return out
    elif one_d:
        xt, wt = lw.g.add_alias(lw.tensor(x), x4), _conv_weight_2d(lw, weight, w4)
    else:
        xt, wt = lw.tensor(x), lw.tensor(weight)
    out = lw.g.add_tensor(dtype(node), out4, name=f"{node.name}_2d") if one_d else lw.new(node)
    (sh, sw), (ph, pw), (dh, dw) = geometry
    op = lw.g.add_op(
        Opcode.CONV2D, x=xt, weight=wt, bias=-1 if bias is None else lw.tensor(bias), out=out,
        N=x4[0], C_in=lw.g.tensors[xt].shape[1], H=lw.g.tensors[xt].shape[2],
        W=lw.g.tensors[xt].shape[3], C_out=out4[1], kH=lw.g.tensors[wt].shape[2],
        kW=lw.g.tensors[wt].shape[3], stride_h=sh, stride_w=sw, pad_h=ph, pad_w=pw, dil_h=dh,
        dil_w=dw, groups=groups, H_out=out4[2], W_out=out4[3], epilogue=Epilogue.NONE,
        residual=-1, channels_last=0)
    if not args["transposed"]:   # batch-norm folding rewrites the weight the node names
        lw.producer[node] = op
    return lw.g.add_alias(out, shape(node), name=node.name) if one_d else out


def _transposed(lw, node, x4, w4, out4, geometry):
    """conv_transpose(x, w) with stride s, padding p, dilation d and output padding q is, per
    axis, the stride-1 convolution with dilation d of x spread s apart (s - 1 zeros between
    neighbours), padded by d * (k - 1) - p before and that + q after (a negative pad crops), by
    w with input and output channels swapped (per group) and its window flipped. Returns the
    kConv2d's input, weight and geometry. With stride 1 and the same pad on both sides, the
    convolution pads x itself; otherwise x is copied into a zero-filled buffer (kFill, kCopy)."""
    args = arguments(node)
    groups = args["groups"]
    (n, c_in, h, w), (_, c_g, kh, kw) = x4, w4
    (sh, sw), (ph, pw), (dh, dw) = geometry
    (qh, qw) = _as_2d(args["output_padding"], 0, len(shape(node)) == 3)
    flipped = transposed_weight(lw.const[args["weight"]].reshape(c_in, c_g, kh, kw), groups)
    wt = lw.g.add_weight(flipped.contiguous(), name=f"{node.name}_weight")
    lo = (dh * (kh - 1) - ph, dw * (kw - 1) - pw)
    hi = (lo[0] + qh, lo[1] + qw)
    if sh == sw == 1 and lo == hi and min(lo) >= 0:
        return lw.g.add_alias(lw.tensor(args["input"]), x4), wt, [(1, 1), lo, (dh, dw)]
    buffer, _ = spread(lw, lw.tensor(args["input"]), x4, (sh, sw), lo, hi,
                       dtype(node), node.name)
    return buffer, wt, [(1, 1), (0, 0), (dh, dw)]


def _pool(lw, node, kind):
    """max_pool2d_with_indices / avg_pool2d. H_out and W_out come from the node's shape, which
    already accounts for ceil_mode."""
    args = arguments(node)
    n, c, h, w = shape(args["self"])
    kh, kw = pair(args["kernel_size"])
    sh, sw = pair(args["stride"]) if args["stride"] else (kh, kw)
    (ph, pw), (dh, dw) = pair(args["padding"]), pair(args.get("dilation", 1))
    out = lw.new(node)
    lw.g.add_op(Opcode.POOL2D, kind=kind, x=lw.tensor(args["self"]), out=out, N=n, C=c, H=h,
                W=w, kH=kh, kW=kw, stride_h=sh, stride_w=sw, pad_h=ph, pad_w=pw, dil_h=dh,
                dil_w=dw, H_out=shape(node)[2], W_out=shape(node)[3],
                count_include_pad=int(args.get("count_include_pad", True)), channels_last=0)
    return out


@family.lowers(aten.max_pool2d_with_indices.default, check=_max_pool_check)
def _max_pool(lw, node):
    return _pool(lw, node, PoolKind.MAX), None


@family.lowers(aten.avg_pool2d.default, check=_avg_pool_check)
def _avg_pool(lw, node):
    return _pool(lw, node, PoolKind.AVG)
