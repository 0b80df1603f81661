"""2-D convolution and pooling over NCHW tensors: kConv2d (a 1x1 convolution of a 1x1 image is a
kMatmul) and kPool2d. The convolution keeps its bias (its own, or a folded batch norm's); the C++
builder folds a following residual add and activation into it and, by default, switches conv
nets to channels-last (NHWC) memory."""

import torch

from ..blob_format import Epilogue, Opcode, PoolKind
from .common import (arguments, floating_input, matmul_dtypes, only_first_output_used, pair,
                     shape, val)
from .registry import Family

aten = torch.ops.aten
family = Family(__name__)


def _convolution_check(node, ctx):
    args = arguments(node)
    x, weight = args["input"], args["weight"]
    if args["transposed"]:
        return "transposed convolution"
    if val(x).dim() != 4 or val(weight).dim() != 4:
        return f"{val(x).dim() - 2}-D convolution: Kiln runs 2-D only"
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


@family.lowers(aten.convolution.default, check=_convolution_check)
def _convolution(lw, node):
    x, weight, bias, stride, padding, dilation, _, _, groups = arguments(node).values()
    n, c_in, h, w = shape(x)
    c_out, _, kh, kw = shape(weight)
    out = lw.new(node)
    (sh, sw), (ph, pw), (dh, dw) = pair(stride), pair(padding), pair(dilation)
    if h == w == kh == kw == 1 and groups == 1 and ph == pw == 0:
        # A 1x1 convolution of a 1x1 image (squeeze-and-excitation blocks) is a GEMM:
        # out[n, :] = weight[C_out, C_in] @ x[n, :] + bias. cuBLASLt runs it with the bias and a
        # following ReLU in its epilogue; cuDNN's convolution paths are slow at this shape.
        # (No producer entry: batch-norm folding rewrites convolution weights only.)
        lw.matmul(out, (lw.tensor(x), False), (lw.tensor(weight), True),
                  -1 if bias is None else lw.tensor(bias), 1, n, c_out, c_in,
                  bias_shape=(c_out,), beta=1.0)
        return out
    lw.producer[node] = lw.g.add_op(
        Opcode.CONV2D, x=lw.tensor(x), weight=lw.tensor(weight),
        bias=-1 if bias is None else lw.tensor(bias), out=out, N=n, C_in=c_in, H=h, W=w,
        C_out=c_out, kH=kh, kW=kw, stride_h=sh, stride_w=sw, pad_h=ph, pad_w=pw, dil_h=dh,
        dil_w=dw, groups=groups, H_out=shape(node)[2], W_out=shape(node)[3],
        epilogue=Epilogue.NONE, residual=-1, channels_last=0)
    return out


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
