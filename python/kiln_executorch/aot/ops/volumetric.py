"""3-D (volumetric) convolution and pooling of NCDHW tensors, on the 2-D opcodes.

- A 3-D convolution unfolds depth into channels: for each output depth o and window tap j, the
  input slice at depth o * s + j * d - p is copied (kFill of the padding, one kCopy per tap) into
  U [N, D_out, C_in, kD, H, W]; U viewed [N * D_out, C_in * kD, H, W] convolved by the weight
  viewed [C_out, C_in / groups * kD, kH, kW] is the result for every (n, o) at once (one kConv2d,
  bias included, groups keep their channel blocks because C_in's blocks stay outermost in U),
  copied back to [N, C_out, D_out, H_out, W_out]. U holds kD * D_out / D times the input.
- A transposed 3-D convolution is the stride-1 convolution of its input spread out by the stride
  into a zero-filled buffer, by the weight with its channels swapped and its window flipped (as
  spatial._transposed does in 2-D).
- Max and average pooling are separable: the 3-D window is the product of per-axis windows, and
  an average's divisor (with or without the padding, ceil_mode's clipped windows included) is
  the product of per-axis counts. So a 3-D pool is a kPool2d over (H, W) of every depth slice
  followed by a kPool2d over (D, 1) of [N * C, 1, D, H_out * W_out].
- Adaptive pools are separable the same way: resampling.py's per-axis means and window maxima
  along W, H and then D.
"""

import torch

from ..blob_format import Epilogue, Opcode, PoolKind
from .common import (arguments, contiguous_strides, dtype, floating_input,
                     only_first_output_used, reads_output, shape, val)
from .resampling import _average_axis, _max_axis, adaptive_max_with_indices
from .registry import Family

aten = torch.ops.aten
family = Family(__name__)


def _triple(v):
    v = list(v) if isinstance(v, (list, tuple)) else [v]
    return tuple(v * 3 if len(v) == 1 else v)


def _conv2d(lw, x, weight, bias, out, n, c_in, h, w, c_out, kh, kw, stride, padding, dilation,
            groups, ho, wo):
    return lw.g.add_op(
        Opcode.CONV2D, x=x, weight=weight, bias=bias, out=out, N=n, C_in=c_in, H=h, W=w,
        C_out=c_out, kH=kh, kW=kw, stride_h=stride[0], stride_w=stride[1], pad_h=padding[0],
        pad_w=padding[1], dil_h=dilation[0], dil_w=dilation[1], groups=groups, H_out=ho,
        W_out=wo, epilogue=Epilogue.NONE, residual=-1, channels_last=0)


def _depth_taps(d, do, kd, stride, pad, dil):
    """(tap j, first output depth, count) of the output depths whose tap j reads inside the input
    (depth o * stride + j * dil - pad in [0, d))."""
    taps = []
    for j in range(kd):
        first = max(0, -((j * dil - pad) // stride))
        last = min(do - 1, (d - 1 + pad - j * dil) // stride)
        if last >= first:
            taps.append((j, first, last - first + 1))
    return taps


def _unfolded_conv(lw, node, x, x_shape, weight, w_shape, bias, stride, padding, dilation,
                   groups):
    """The 3-D convolution of IR tensor x [N, C, D, H, W] by `weight` [C_out, C_in / groups, kD,
    kH, kW] as one kConv2d of depth unfolded into channels (module docstring). A constant weight
    (a torch tensor) becomes a 4-D weight of its own, so the channels-last pass permutes its
    bytes ahead of time; an IR tensor is viewed."""
    n, c, d, h, w = x_shape
    c_out, c_g, kd, kh, kw = w_shape
    _, _, do, ho, wo = shape(node)
    hw = h * w
    unfold = lw.g.add_tensor(dtype(node), (n, do, c, kd, h, w), name=f"{node.name}_unfold")
    taps = _depth_taps(d, do, kd, stride[0], padding[0], dilation[0])
    if sum(count for _, _, count in taps) < do * kd:   # some taps read the zero padding
        lw.g.add_op(Opcode.FILL, out=unfold, value=0.0)
    for j, first, count in taps:
        source = first * stride[0] + j * dilation[0] - padding[0]
        lw.copy(x, unfold, [n, count, c, hw], source * hw, [c * d * hw, stride[0] * hw, d * hw, 1],
                first * c * kd * hw + j * hw, [do * c * kd * hw, c * kd * hw, kd * hw, 1])
    planes = lw.g.add_tensor(dtype(node), (n * do, c_out, ho, wo), name=f"{node.name}_planes")
    _conv2d(lw, lw.g.add_alias(unfold, (n * do, c * kd, h, w)),
            _weight_2d(lw, node, weight, (c_out, c_g * kd, kh, kw)), bias, planes, n * do,
            c * kd, h, w, c_out, kh, kw, stride[1:], padding[1:], dilation[1:], groups, ho, wo)
    if do == 1:
        return lw.g.add_alias(planes, shape(node), name=node.name)
    out = lw.new(node)
    sizes = [n, c_out, do, ho * wo]
    lw.copy(planes, out, sizes, 0, [do * c_out * ho * wo, ho * wo, c_out * ho * wo, 1], 0,
            contiguous_strides(sizes))
    return out


def _weight_2d(lw, node, weight, shape_2d):
    if isinstance(weight, torch.Tensor):
        return lw.g.add_weight(weight.reshape(shape_2d), name=f"{node.name}_weight_2d")
    return lw.g.add_alias(weight, shape_2d)


def spread(lw, x, x_shape, stride, lows, highs, out_dtype, name):
    """x [N, C, *spatial] spread `stride` apart into a zero-filled buffer with `lows` / `highs`
    elements before / after along each spatial axis (a negative one crops): a transposed
    convolution's input, 2-D (spatial._transposed) or 3-D. Returns the buffer and its shape."""
    n, c = x_shape[:2]
    spatial = x_shape[2:]
    extents = [(i - 1) * s + 1 + lo + hi for i, s, lo, hi in zip(spatial, stride, lows, highs)]
    buffer = lw.g.add_tensor(out_dtype, (n, c, *extents), name=f"{name}_spread")
    lw.g.add_op(Opcode.FILL, out=buffer, value=0.0)
    # The input positions i that land inside the buffer, at lo + i * s.
    first = [max(0, -(lo // s)) for lo, s in zip(lows, stride)]
    last = [min(i - 1, (e - 1 - lo) // s) for i, e, lo, s in zip(spatial, extents, lows, stride)]
    counts = [b - a + 1 for a, b in zip(first, last)]
    if min(counts) > 0:
        x_strides = contiguous_strides(x_shape)
        b_strides = contiguous_strides((n, c, *extents))
        lw.copy(x, buffer, [n, c, *counts], sum(f * st for f, st in zip(first, x_strides[2:])),
                x_strides, sum((lo + f * s) * st for lo, f, s, st in
                               zip(lows, first, stride, b_strides[2:])),
                b_strides[:2] + [s * st for s, st in zip(stride, b_strides[2:])])
    return buffer, (n, c, *extents)


def transposed_weight(weight, groups):
    """A transposed convolution's constant weight [C_in, C_out / groups, *k] as the weight of the
    equivalent convolution: [C_out, C_in / groups, *k], input and output channels swapped per
    group and the window flipped."""
    c_in, c_g, *k = weight.shape
    w = weight.reshape(groups, c_in // groups, c_g, *k).transpose(1, 2)
    return w.flip(tuple(range(3, 3 + len(k)))).reshape(groups * c_g, c_in // groups, *k)


def convolution3d(lw, node):
    """aten.convolution of rank-5 operands (spatial.py's _convolution hands them here)."""
    args = arguments(node)
    x, weight, bias, groups = args["input"], args["weight"], args["bias"], args["groups"]
    stride, padding, dilation = (_triple(args[k]) for k in ("stride", "padding", "dilation"))
    bias = -1 if bias is None else lw.tensor(bias)
    if not args["transposed"]:
        w = lw.const[weight] if weight in lw.const else lw.tensor(weight)
        return _unfolded_conv(lw, node, lw.tensor(x), shape(x), w, shape(weight), bias, stride,
                              padding, dilation, groups)
    flipped = transposed_weight(lw.const[weight], groups)
    lows = [dl * (kk - 1) - p for dl, kk, p in zip(dilation, shape(weight)[2:], padding)]
    highs = [lo + q for lo, q in zip(lows, _triple(args["output_padding"]))]
    buffer, b_shape = spread(lw, lw.tensor(x), shape(x), stride, lows, highs, dtype(node),
                             node.name)
    return _unfolded_conv(lw, node, buffer, b_shape, flipped, tuple(flipped.shape), bias,
                          (1, 1, 1), (0, 0, 0), dilation, groups)


# Pooling.

def _volume_check(node, ctx):
    if val(node.args[0]).dim() != 5:
        return f"input of rank {val(node.args[0]).dim()}: 3-D pooling takes NCDHW (rank 5)"
    if 0 in shape(node.args[0]) or 0 in shape(node):
        return "an empty input or output"
    return floating_input(node, ctx)


def _max_pool3d_check(node, ctx):
    return only_first_output_used(node, "the indices output") or _volume_check(node, ctx)


def _avg_pool3d_check(node, ctx):
    if arguments(node)["divisor_override"] is not None:
        return "divisor_override (the divisor is not the product of per-axis counts)"
    return _volume_check(node, ctx)


def _pool3d(lw, node, kind):
    args = arguments(node)
    n, c, d, h, w = shape(args["self"])
    _, _, do, ho, wo = shape(node)
    kd, kh, kw = _triple(args["kernel_size"])
    sd, sh, sw = _triple(args["stride"]) if args["stride"] else (kd, kh, kw)
    pd, ph, pw = _triple(args["padding"])
    dd, dh, dw = _triple(args.get("dilation", 1))
    include_pad = int(args.get("count_include_pad", True))

    def pool(x, out, n2, c2, h2, w2, k, s, p, dl, h_out, w_out):
        lw.g.add_op(Opcode.POOL2D, kind=kind, x=x, out=out, N=n2, C=c2, H=h2, W=w2, kH=k[0],
                    kW=k[1], stride_h=s[0], stride_w=s[1], pad_h=p[0], pad_w=p[1], dil_h=dl[0],
                    dil_w=dl[1], H_out=h_out, W_out=w_out, count_include_pad=include_pad,
                    channels_last=0)

    planes = lw.g.add_tensor(dtype(node), (n * c, d, ho, wo), name=f"{node.name}_hw")
    pool(lw.g.add_alias(lw.tensor(args["self"]), (n * c, d, h, w)), planes, n * c, d, h, w,
         (kh, kw), (sh, sw), (ph, pw), (dh, dw), ho, wo)
    out = lw.g.add_tensor(dtype(node), (n * c, 1, do, ho * wo), name=f"{node.name}_d")
    pool(lw.g.add_alias(planes, (n * c, 1, d, ho * wo)), out, n * c, 1, d, ho * wo, (kd, 1),
         (sd, 1), (pd, 0), (dd, 1), do, ho * wo)
    return lw.g.add_alias(out, shape(node), name=node.name)


@family.lowers(aten.max_pool3d_with_indices.default, check=_max_pool3d_check)
def _max_pool3d(lw, node):
    return _pool3d(lw, node, PoolKind.MAX), None


@family.lowers(aten.avg_pool3d.default, check=_avg_pool3d_check)
def _avg_pool3d(lw, node):
    return _pool3d(lw, node, PoolKind.AVG)


def _adaptive3d(lw, node, along):
    """W, then H, then D through `along` (resampling's per-axis mean or window max over a 4-D
    view); an axis already at its output size is no op."""
    x = node.args[0]
    n, c, d, h, w = shape(x)
    _, _, do, ho, wo = shape(node)
    cur = lw.tensor(x)
    cur, _ = along(lw, lw.g.add_alias(cur, (n * c, d, h, w)), [n * c, d, h, w], 3, wo,
                   dtype(node), f"{node.name}_w")
    cur, _ = along(lw, lw.g.add_alias(cur, (n * c, d, h, wo)), [n * c, d, h, wo], 2, ho,
                   dtype(node), f"{node.name}_h")
    cur, _ = along(lw, lw.g.add_alias(cur, (n, c, d, ho * wo)), [n, c, d, ho * wo], 2, do,
                   dtype(node), f"{node.name}_d")
    return lw.g.add_alias(cur, shape(node), name=node.name)


@family.lowers(aten._adaptive_avg_pool3d.default, check=_volume_check)
def _adaptive_avg_pool3d(lw, node):
    return _adaptive3d(lw, node, _average_axis)


@family.lowers(aten.adaptive_max_pool3d.default, check=_volume_check)
def _adaptive_max_pool3d(lw, node):
    if reads_output(node, 1):
        return adaptive_max_with_indices(lw, node, 3)
    return _adaptive3d(lw, node, _max_axis), None
