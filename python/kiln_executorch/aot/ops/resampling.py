"""Resampling of NCHW images along H and W: nearest and bilinear upsampling, adaptive average and
max pooling. No opcode of their own: each axis is a read at source positions known ahead of time
(kGather with a constant index, or one kCopy for whole nearest factors), combined by kBinary
weights (bilinear), a kReduce (adaptive max) or a kMatmul by an averaging matrix (adaptive
average); a uniform adaptive pool is a kPool2d, and one to the input's own size a view.

The source positions and weights are torch's own: the lowering runs the ATen operator on an
identity basis ([1, n, 1, n] for W, [1, n, n, 1] for H), which gives the interpolation matrix
[n_out, n_in] torch uses, with its scale rules (a given scale factor, not out / in, sets the
source coordinate; align_corners; the clamp at the border) and its float32 weights."""

import math

import torch

from ..blob_format import BinaryKind, Opcode, PoolKind, ReduceKind
from .common import (Value, arguments, contiguous_strides, dtype, floating_input,
                     reads_output, shape, val)
from .registry import Family

aten = torch.ops.aten
family = Family(__name__)


def _image_check(node, ctx):
    if val(node.args[0]).dim() != 4:
        return (f"input of rank {val(node.args[0]).dim()}: Kiln resamples and pools NCHW (rank 4) "
                "images")
    if 0 in shape(node.args[0]) or 0 in shape(node):
        return "an empty input or output"
    return floating_input(node, ctx)


def _matrix(op, axis, n_in, n_out):
    """torch's interpolation matrix [n_out, n_in] along `axis` (2: H, 3: W): op(basis, sizes,
    scales) resamples the identity basis, one channel per source position; sizes and scales
    are for (H, W) of the basis, the other axis of which has size 1."""
    if axis == 3:
        basis = torch.eye(n_in).reshape(1, n_in, 1, n_in)
        return op(basis, 0)[0, :, 0, :].T.contiguous()
    basis = torch.eye(n_in).reshape(1, n_in, n_in, 1)
    return op(basis, 1)[0, :, :, 0].T.contiguous()


def _resampler(node, aten_op, *extra):
    """op(basis, other) for _matrix: node's operator with its own output size or scale factor
    along the resampled axis and 1 along the other (index `other` of the pair)."""
    args = arguments(node)
    size, scales = args["output_size"], args["scale_factors"]

    def op(basis, other):
        s = None if size is None else [1 if k == other else int(size[k]) for k in (0, 1)]
        f = None if scales is None else [1.0 if k == other else float(scales[k]) for k in (0, 1)]
        return aten_op(basis, s, *extra, f)
    return op


def _gather_axis(lw, x, x_shape, axis, index, out_dtype, name):
    """x (an IR tensor of x_shape) read along `axis` at the constant positions `index`."""
    out_shape = list(x_shape)
    out_shape[axis] = len(index)
    x_strides = contiguous_strides(x_shape)
    step, x_strides[axis] = x_strides[axis], 0
    index_strides = [0] * len(x_shape)
    index_strides[axis] = 1
    out = lw.g.add_tensor(out_dtype, out_shape, name=name)
    lw.g.add_op(Opcode.GATHER, x=x, index=lw.g.add_weight(index.to(torch.int64),
                                                          name=f"{name}_index"),
                out=out, rank=len(out_shape), sizes=out_shape, x_strides=x_strides,
                index_strides=index_strides, index_stride=step, dim_size=x_shape[axis])
    return out, out_shape


def _linear_axis(lw, x, x_shape, axis, matrix, out_dtype, name):
    """out = sum_k matrix[i, k] x[..., k, ...] along `axis`, matrix having at most two nonzeros a
    row (nearest: one of 1): one or two gathers and their weighted sum. An identity is no op."""
    n_out, n_in = matrix.shape
    nonzero = matrix != 0
    if int(nonzero.sum(1).max()) > 2:
        raise ValueError("an interpolation row with more than two sources")
    first = nonzero.int().argmax(1)
    last = n_in - 1 - nonzero.flip(1).int().argmax(1)
    rows = torch.arange(n_out)
    w0 = matrix[rows, first]
    w1 = torch.where(last != first, matrix[rows, last], 0.0)
    if n_out == n_in and bool((first == rows).all()) and bool((w0 == 1).all()) and \
            not bool(w1.any()):
        return x, list(x_shape)
    a, out_shape = _gather_axis(lw, x, x_shape, axis, first, out_dtype, f"{name}_0")
    if not bool(w1.any()) and bool((w0 == 1).all()):
        return a, out_shape
    weight_shape = (n_out,) + (1,) * (len(x_shape) - 1 - axis)
    terms = [lw.binary(BinaryKind.MUL, Value(a, out_shape), w0.reshape(weight_shape)
                       .to(out_dtype), out_shape, out_dtype)]
    if bool(w1.any()):
        b, _ = _gather_axis(lw, x, x_shape, axis, last, out_dtype, f"{name}_1")
        terms.append(lw.binary(BinaryKind.MUL, Value(b, out_shape),
                               w1.reshape(weight_shape).to(out_dtype), out_shape, out_dtype))
        terms = [lw.binary(BinaryKind.ADD, Value(terms[0], out_shape), Value(terms[1], out_shape),
                           out_shape, out_dtype, name=name)]
    return terms[0], out_shape


def _separable(lw, node, op):
    """W first, then H (torch's bilinear sums along W inside each source row)."""
    x = node.args[0]
    (_, _, h, w), (_, _, ho, wo) = shape(x), shape(node)
    cur, cur_shape = lw.tensor(x), list(shape(x))
    cur, cur_shape = _linear_axis(lw, cur, cur_shape, 3, _matrix(op, 3, w, wo), dtype(node),
                                  f"{node.name}_w")
    cur, cur_shape = _linear_axis(lw, cur, cur_shape, 2, _matrix(op, 2, h, ho), dtype(node),
                                  node.name)
    if cur == lw.tid.get(x, None):   # resampling to the same size: a copy still owns the value
        out = lw.new(node)
        lw.copy(cur, out, cur_shape, 0, contiguous_strides(cur_shape), 0,
                contiguous_strides(cur_shape))
        return out
    return cur


@family.lowers(aten.upsample_bilinear2d.vec, check=_image_check)
def _upsample_bilinear(lw, node):
    return _separable(lw, node, _resampler(node, aten.upsample_bilinear2d.vec,
                                           bool(arguments(node)["align_corners"])))


def _whole_factors(node):
    """(sh, sw) when nearest upsampling reads source i // s along each axis, else None."""
    (_, _, h, w), (_, _, ho, wo) = shape(node.args[0]), shape(node)
    if ho % h or wo % w:
        return None
    op = _resampler(node, aten.upsample_nearest2d.vec)
    for axis, n_in, n_out in ((2, h, ho), (3, w, wo)):
        source = _matrix(op, axis, n_in, n_out).argmax(1)
        if not bool((source == torch.arange(n_out) // (n_out // n_in)).all()):
            return None
    return ho // h, wo // w


@family.lowers(aten.upsample_nearest2d.vec, check=_image_check)
def _upsample_nearest(lw, node):
    """By whole factors (sh, sw): out viewed as [N, C, H, sh, W, sw] reads x[n, c, h, w] with
    zero strides along the repeats, one kCopy. Otherwise a gather along each resized axis."""
    factors = _whole_factors(node)
    if factors is None:
        return _separable(lw, node, _resampler(node, aten.upsample_nearest2d.vec))
    (n, c, h, w), (sh, sw) = shape(node.args[0]), factors
    out = lw.new(node)
    sizes = [n, c, h, sh, w, sw]
    lw.copy(lw.tensor(node.args[0]), out, sizes, 0, [c * h * w, h * w, w, 0, 1, 0], 0,
            contiguous_strides(sizes))
    return out


# Adaptive pooling: output cell i along an axis of n_in -> n_out pools source positions
# [floor(i * n_in / n_out), ceil((i + 1) * n_in / n_out)).

def _windows(n_in, n_out):
    return [(i * n_in // n_out, -(-(i + 1) * n_in // n_out)) for i in range(n_out)]


def _uniform(n_in, n_out):
    return n_in % n_out == 0


def _uniform_pool(lw, node, kind):
    """A kPool2d of the uniform windows; pooling to the input's own size (VGG's 7x7 -> 7x7) is a
    view: every window is one element."""
    (n, c, h, w), (_, _, ho, wo) = shape(node.args[0]), shape(node)
    if (h, w) == (ho, wo):
        return lw.g.add_alias(lw.tensor(node.args[0]), shape(node), name=node.name)
    kh, kw = h // ho, w // wo
    out = lw.new(node)
    lw.g.add_op(Opcode.POOL2D, kind=kind, x=lw.tensor(node.args[0]), out=out, N=n, C=c, H=h,
                W=w, kH=kh, kW=kw, stride_h=kh, stride_w=kw, pad_h=0, pad_w=0, dil_h=1,
                dil_w=1, H_out=ho, W_out=wo, count_include_pad=1, channels_last=0)
    return out


def _average_axis(lw, x, x_shape, axis, n_out, out_dtype, name):
    """Mean over each adaptive window along axis 3 (W: x [.., W] @ A^T) or 2 (H: A @ x[g] per
    image), A [n_out, n_in] the averaging matrix."""
    n_in = x_shape[axis]
    if n_in == n_out:
        return x, x_shape
    a = torch.zeros(n_out, n_in, dtype=torch.float64)
    for i, (s, e) in enumerate(_windows(n_in, n_out)):
        a[i, s:e] = 1.0 / (e - s)
    weight = lw.g.add_weight(a.to(out_dtype), name=f"{name}_mean")
    out_shape = list(x_shape)
    out_shape[axis] = n_out
    out = lw.g.add_tensor(out_dtype, out_shape, name=name)
    n, c, h, w = x_shape
    if axis == 3:
        lw.matmul(out, (x, False), (weight, True), -1, 1, n * c * h, n_out, n_in)
    else:
        lw.matmul(out, (weight, False), (x, False), -1, n * c, n_out, w, n_in, a_batch=0,
                  b_batch=h * w)
    return out, out_shape


@family.lowers(aten._adaptive_avg_pool2d.default, check=_image_check)
def _adaptive_avg(lw, node):
    """Uniform windows (the input divides the output along both axes): a kPool2d. Otherwise a
    mean matrix per axis (the windows' sums are separable), W then H."""
    (_, _, h, w), (_, _, ho, wo) = shape(node.args[0]), shape(node)
    if _uniform(h, ho) and _uniform(w, wo):
        return _uniform_pool(lw, node, PoolKind.AVG)
    cur, cur_shape = lw.tensor(node.args[0]), list(shape(node.args[0]))
    cur, cur_shape = _average_axis(lw, cur, cur_shape, 3, wo, dtype(node), f"{node.name}_w")
    cur, _ = _average_axis(lw, cur, cur_shape, 2, ho, dtype(node), node.name)
    return cur


def _max_axis(lw, x, x_shape, axis, n_out, out_dtype, name):
    """Max over each adaptive window along `axis`: one gather of every window padded to the
    widest by repeating its last position (a repeat leaves a max unchanged), then a kReduce."""
    n_in = x_shape[axis]
    if n_in == n_out:
        return x, x_shape
    windows = _windows(n_in, n_out)
    k = max(e - s for s, e in windows)
    index = torch.tensor([[min(s + j, e - 1) for j in range(k)] for s, e in windows])
    gathered, g_shape = _gather_axis(lw, x, x_shape, axis, index.reshape(-1), out_dtype,
                                     f"{name}_windows")
    out_shape = list(x_shape)
    out_shape[axis] = n_out
    out = lw.g.add_tensor(out_dtype, out_shape, name=name)
    lw.g.add_op(Opcode.REDUCE, kind=ReduceKind.AMAX, x=gathered, out=out,
                outer=math.prod(x_shape[:axis]) * n_out, reduce=k,
                inner=math.prod(x_shape[axis + 1:]))
    return out, out_shape


@family.lowers(aten.adaptive_max_pool2d.default, check=_image_check)
def _adaptive_max(lw, node):
    """Uniform windows: a kPool2d. Otherwise the windows of W, then of H (max is separable).
    A program that reads the indices gets adaptive_max_with_indices instead."""
    if reads_output(node, 1):
        return adaptive_max_with_indices(lw, node, 2)
    (_, _, h, w), (_, _, ho, wo) = shape(node.args[0]), shape(node)
    if _uniform(h, ho) and _uniform(w, wo):
        return _uniform_pool(lw, node, PoolKind.MAX), None
    cur, cur_shape = lw.tensor(node.args[0]), list(shape(node.args[0]))
    cur, cur_shape = _max_axis(lw, cur, cur_shape, 3, wo, dtype(node), f"{node.name}_w")
    cur, _ = _max_axis(lw, cur, cur_shape, 2, ho, dtype(node), node.name)
    return cur, None


def _window_table(in_sizes, out_sizes):
    """[outputs, K] Int64: for each output position (row-major), the flat positions in the input
    plane of its adaptive window, row-major, padded to the widest window (K elements) by
    repeating the last position along each axis. A repeat always follows the position it
    repeats, so the first maximum over a row is the window's first in row-major order."""
    axes = []
    for n_in, n_out in zip(in_sizes, out_sizes):
        windows = torch.tensor(_windows(n_in, n_out))              # [n_out, 2]: start, end
        k = int((windows[:, 1] - windows[:, 0]).max())
        axes.append(torch.minimum(windows[:, :1] + torch.arange(k), windows[:, 1:] - 1))
    table = torch.zeros((1, 1), dtype=torch.int64)
    for positions, stride in zip(axes, contiguous_strides(list(in_sizes))):
        # [outputs, K] x [n_out, k] -> [outputs * n_out, K * k], this axis the faster one.
        table = (table[:, None, :, None] + positions[None, :, None, :] * stride).reshape(
            table.shape[0] * positions.shape[0], table.shape[1] * positions.shape[1])
    return table


def adaptive_max_with_indices(lw, node, spatial):
    """(values, indices) of adaptive_max_pool2d / 3d over the last `spatial` axes: every output's
    window gathered from the flattened plane (_window_table), a kReduce AMAX and ARGMAX over each
    window, and the argmax's flat position read from the table: torch's index within the plane
    (h * W + w; d * H * W + h * W + w). For a window with a NaN, torch names its last NaN, Kiln
    its first (the values agree)."""
    x = node.args[0]
    in_sizes, out_sizes = shape(x)[-spatial:], shape(node)[-spatial:]
    planes, plane = math.prod(shape(x)[:-spatial]), math.prod(in_sizes)
    table = _window_table(in_sizes, out_sizes)
    outputs, k = table.shape
    positions = lw.g.add_weight(table.reshape(-1), name=f"{node.name}_window_positions")
    windows = lw.g.add_tensor(dtype(node), (planes, outputs * k), name=f"{node.name}_windows")
    lw.g.add_op(Opcode.GATHER, x=lw.g.add_alias(lw.tensor(x), (planes, plane)), index=positions,
                out=windows, rank=2, sizes=[planes, outputs * k], x_strides=[plane, 0],
                index_strides=[0, 1], index_stride=1, dim_size=plane)
    values = lw.new(node)
    lw.g.add_op(Opcode.REDUCE, kind=ReduceKind.AMAX, x=windows, out=values,
                outer=planes * outputs, reduce=k, inner=1)
    arg = lw.g.add_tensor(torch.int64, (planes, outputs), name=f"{node.name}_argmax")
    lw.g.add_op(Opcode.REDUCE, kind=ReduceKind.ARGMAX, x=windows, out=arg,
                outer=planes * outputs, reduce=k, inner=1)
    # indices[p, o] = table[o, arg[p, o]]: the same table, read as [outputs, k]
    indices = lw.g.add_tensor(torch.int64, shape(node), name=f"{node.name}_indices")
    lw.g.add_op(Opcode.GATHER, x=positions, index=arg, out=indices, rank=2, sizes=[planes, outputs], x_strides=[0, k],
                index_strides=[outputs, 1], index_stride=1, dim_size=k)
    return values, indices
