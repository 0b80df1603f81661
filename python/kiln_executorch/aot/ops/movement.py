"""Data movement beyond views.py's: split, flip, roll, constant padding, as_strided, slice_scatter
and copy, each one or more kCopy (kCopy reads and writes with any signed strides and offsets),
plus a kFill for the padding value; alias_copy is a view."""

import itertools
import math

import torch

from ..blob_format import Opcode
from .common import any_input, arguments, broadcast_strides, contiguous_strides, shape, val, \
    wrap_dim
from .registry import VIEW, Family
from .views import _view

aten = torch.ops.aten
family = Family(__name__)

family.register(aten.alias_copy.default, any_input, _view, traits=[VIEW])


def _split_check(node, ctx):
    sizes = arguments(node).get("split_sizes")
    if sizes is not None and not all(isinstance(s, int) for s in sizes):
        return f"split sizes {sizes!r} are not numbers"
    return None


@family.lowers(aten.split_with_sizes_copy.default, aten.split_copy.Tensor, check=_split_check)
def _split(lw, node):
    """One copy per piece that is read (a piece nobody reads is not computed)."""
    x = arguments(node)["self"]
    sizes = shape(x)
    dim = wrap_dim(arguments(node)["dim"], len(sizes))
    strides = contiguous_strides(sizes)
    used = {u.args[1] for u in node.users}
    out, at = [], 0
    for i, piece in enumerate(val(node)):
        piece_shape = tuple(int(n) for n in piece.shape)
        if i in used:
            t = lw.g.add_tensor(piece.dtype, piece_shape, name=f"{node.name}_{i}")
            lw.copy(lw.tensor(x), t, piece_shape, at * strides[dim], strides, 0,
                    contiguous_strides(piece_shape))
            out.append(t)
        else:
            out.append(None)
        at += piece_shape[dim]
    return tuple(out)


@family.lowers(aten.flip.default, check=any_input)
def _flip(lw, node):
    x = node.args[0]
    sizes = shape(x)
    strides = contiguous_strides(sizes)
    offset = 0
    for d in {wrap_dim(d, len(sizes)) for d in arguments(node)["dims"]}:
        offset += (sizes[d] - 1) * strides[d]
        strides[d] = -strides[d]
    return lw.strided_copy(node, offset, strides)


def _roll_check(node, ctx):
    args = arguments(node)
    if len(args["shifts"]) != max(len(args["dims"]), 1) or \
            (not args["dims"] and len(args["shifts"]) != 1):
        return f"roll shifts {list(args['shifts'])} and dims {list(args['dims'])} do not pair"
    return None


@family.lowers(aten.roll.default, check=_roll_check)
def _roll(lw, node):
    """out[(i + shift) mod n] = x[i] along each rolled dim: each dim splits into two runs, so
    the roll is one copy per combination of runs (2 for one dim, 4 for two)."""
    args = arguments(node)
    x, out_shape = args["self"], shape(node)
    sizes = list(out_shape) if args["dims"] else [math.prod(out_shape)]
    dims = [wrap_dim(d, len(sizes)) for d in args["dims"]] or [0]
    strides = contiguous_strides(sizes)
    out = lw.new(node)
    runs = []
    for d, shift in zip(dims, args["shifts"]):
        n = sizes[d]
        s = shift % n if n else 0
        # (source start, destination start, length) of the runs along d
        runs.append([(d, src, dst, length) for src, dst, length in
                     ((0, s, n - s), (n - s, 0, s)) if length > 0])
    for combo in itertools.product(*runs):
        piece, src, dst = list(sizes), 0, 0
        for d, a, b, length in combo:
            piece[d] = length
            src += a * strides[d]
            dst += b * strides[d]
        lw.copy(lw.tensor(x), out, piece, src, strides, dst, strides)
    return out


def _pad_check(node, ctx):
    pad = arguments(node)["pad"]
    if len(pad) % 2 or len(pad) // 2 > len(shape(node.args[0])):
        return f"pad {list(pad)} does not pair with the input's dims"
    return None


@family.lowers(aten.constant_pad_nd.default, check=_pad_check)
def _constant_pad(lw, node):
    """A kFill of the padding value (when anything is padded), then the kept part of the input
    copied inside (a negative pad crops)."""
    args = arguments(node)
    x, pad = args["self"], list(args["pad"])
    in_shape, out_shape = shape(x), shape(node)
    rank = len(in_shape)
    in_strides, out_strides = contiguous_strides(in_shape), contiguous_strides(out_shape)
    piece, src, dst = list(in_shape), 0, 0
    for k in range(len(pad) // 2):
        d, before, after = rank - 1 - k, pad[2 * k], pad[2 * k + 1]
        piece[d] = in_shape[d] + min(before, 0) + min(after, 0)
        src += max(-before, 0) * in_strides[d]
        dst += max(before, 0) * out_strides[d]
    out = lw.new(node)
    if any(p > 0 for p in pad) and math.prod(out_shape):
        lw.g.add_op(Opcode.FILL, out=out, value=float(args["value"]))
    if min(piece, default=1) > 0:
        lw.copy(lw.tensor(x), out, piece, src, in_strides, dst, out_strides)
    return out


def _as_strided_check(node, ctx):
    args = arguments(node)
    size, stride = args["size"], args["stride"]
    offset = args["storage_offset"] or 0
    if any(not isinstance(v, int) for v in list(size) + list(stride) + [offset]):
        return "as_strided with symbolic sizes"
    if math.prod(size) == 0:
        return None
    lo = offset + sum((n - 1) * s for n, s in zip(size, stride) if s < 0)
    hi = offset + sum((n - 1) * s for n, s in zip(size, stride) if s > 0)
    numel = math.prod(shape(args["self"]))
    if lo < 0 or hi >= numel:
        return f"as_strided reads elements [{lo}, {hi}] of a tensor of {numel}"
    return None


@family.lowers(aten.as_strided_copy.default, check=_as_strided_check)
def _as_strided(lw, node):
    args = arguments(node)
    return lw.strided_copy(node, args["storage_offset"] or 0, list(args["stride"]))


def _slice_scatter_check(node, ctx):
    step = arguments(node)["step"]
    if not isinstance(step, int) or step < 1:
        return f"slice step {step!r}"
    return None


@family.lowers(aten.slice_scatter.default, check=_slice_scatter_check)
def _slice_scatter(lw, node):
    """x copied whole, then src copied over the slice."""
    args = arguments(node)
    x, src = args["self"], args["src"]
    sizes = shape(x)
    dim = wrap_dim(args["dim"], len(sizes))
    start = slice(args["start"], args["end"], args["step"]).indices(sizes[dim])[0]
    strides = contiguous_strides(sizes)
    out = lw.new(node)
    lw.copy(lw.tensor(x), out, sizes, 0, strides, 0, strides)
    src_shape = shape(src)
    if math.prod(src_shape):
        slice_strides = list(strides)
        slice_strides[dim] *= args["step"]
        lw.copy(lw.tensor(src), out, src_shape, 0, contiguous_strides(src_shape),
                start * strides[dim], slice_strides)
    return out


@family.lowers(aten.copy.default, check=any_input)
def _copy(lw, node):
    """copy(self, src): src broadcast to self's shape, in self's dtype."""
    src = node.args[1]
    out_shape = shape(node)
    out = lw.new(node)
    lw.copy(lw.tensor(src), out, out_shape, 0, broadcast_strides(shape(src), out_shape), 0,
            contiguous_strides(out_shape))
    return out
