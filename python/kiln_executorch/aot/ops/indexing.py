"""Reads and writes at indices held in tensors. gather, index_select and index (advanced
indexing with one index tensor) are kGather, which reads the Int64 / Int32 indices on the device
at run time (a negative index counts from the end; one out of range is an execution error, never
a crash).
Indexing whose operands are all known ahead of time (the masks and position tables HF models
build from arange) is evaluated by the lowering instead, whatever the number of index tensors;
several index tensors known ahead of time on a value computed at run time are one kGather of that
value read flat at offsets the lowering computes.
index_put (accumulate too, up to MAX_SCATTER_INDICES index tensors) is a copy and a kScatter."""

import math

import torch

from ..blob_format import MAX_SCATTER_INDICES, Opcode
from .common import (INT, KilnLoweringError, arguments, broadcast_strides, contiguous_strides,
                     dtype, shape, wrap_dim)
from .registry import Family

aten = torch.ops.aten
family = Family(__name__)


def _constant(nodes, ctx):
    is_constant = getattr(ctx, "is_constant", None)
    return is_constant is not None and all(is_constant(n) for n in nodes)


def _index_dtype(index):
    if dtype(index) not in INT:
        return f"index dtype {dtype(index)}: Kiln gathers with Int64 or Int32 indices"
    return None


def _gather_check(node, ctx):
    args = arguments(node)
    x, index = args["self"], args["index"]
    if args.get("sparse_grad"):
        return "sparse_grad=True"
    rank = len(shape(x))
    if len(shape(index)) != rank:
        return f"index of rank {len(shape(index))} for a rank-{rank} input"
    dim = wrap_dim(args["dim"], max(rank, 1))
    if any(i > n for d, (i, n) in enumerate(zip(shape(index), shape(x))) if d != dim):
        return f"index shape {list(shape(index))} is larger than the input {list(shape(x))}"
    return _index_dtype(index)


def _index_select_check(node, ctx):
    index = arguments(node)["index"]
    if len(shape(index)) > 1:
        return f"index_select with a {len(shape(index))}-D index"
    return _index_dtype(index)


def _index_tensors_check(given, mask_does, kiln_does):
    """Why the given (non-None) indices of index / index_put are not Int64 / Int32 tensors."""
    for i in given:
        if not isinstance(i, torch.fx.Node):
            return f"index {i!r} is not a tensor"
        if dtype(i) not in INT:
            return f"index dtype {dtype(i)} (Bool masks {mask_does}; Kiln {kiln_does} with " \
                   "Int64 or Int32 indices)"
    return None


def _index_check(node, ctx):
    indices = arguments(node)["indices"]
    given = [i for i in indices if i is not None]
    why = _index_tensors_check(given, "select a data-dependent number of elements", "gathers")
    if why:
        return why
    if len(given) != 1 and not _constant(given, ctx):
        return (f"index with {len(given)} index tensors computed at run time: Kiln gathers along "
                "one axis, or through constant index tensors (HF's masks from arange)")
    return None


def gather_op(lw, node, x, index, x_strides, index_strides, axis):
    """The kGather for node: out[idx] = x[idx . x_strides + index[idx . index_strides] *
    stride of x's axis `axis`]."""
    out = lw.new(node)
    out_shape = shape(node)
    lw.g.add_op(Opcode.GATHER, x=lw.tensor(x), index=lw.tensor(index), out=out,
                rank=len(out_shape), sizes=list(out_shape), x_strides=list(x_strides),
                index_strides=list(index_strides),
                index_stride=contiguous_strides(shape(x))[axis], dim_size=shape(x)[axis])
    return out


def _along_dim(lw, node, index_strides):
    """gather / index_select: x read along `dim` at index[idx . index_strides(rank, dim)]."""
    args = arguments(node)
    x, index = args["self"], args["index"]
    rank = len(shape(x))
    if rank == 0:   # a scalar reads itself (index 0 or -1)
        out = lw.new(node)
        lw.g.add_op(Opcode.GATHER, x=lw.tensor(x), index=lw.tensor(index), out=out, rank=0,
                    sizes=[], x_strides=[], index_strides=[], index_stride=0, dim_size=1)
        return out
    dim = wrap_dim(args["dim"], rank)
    x_strides = contiguous_strides(shape(x))
    x_strides[dim] = 0
    return gather_op(lw, node, x, index, x_strides, index_strides(shape(index), rank, dim), dim)


@family.lowers(aten.gather.default, check=_gather_check)
def _gather(lw, node):
    return _along_dim(lw, node, lambda index_shape, rank, dim: contiguous_strides(index_shape))


def _select_strides(index_shape, rank, dim):
    strides = [0] * rank
    strides[dim] = 1 if index_shape else 0
    return strides


@family.lowers(aten.index_select.default, check=_index_select_check)
def _index_select(lw, node):
    return _along_dim(lw, node, _select_strides)


def _index_by_offsets(lw, node, x, indices):
    """index with several index tensors known ahead of time: x's element offsets are indexed the
    same way now (aten.index on an arange of x's shape: broadcasting, apart indices moving to the
    front and negative indices as torch has them), and one kGather reads x flat at those offsets.
    The index tensors must be constants of this partition (the check saw them constant in the
    whole program; a producer in another partition would make them run-time inputs here)."""
    given = [i for i in indices if i is not None]
    if not all(i in lw.const for i in given):
        raise KilnLoweringError(f"{node.name}: index with {len(given)} index tensors that are not "
                                "constants of this partition")
    xs = list(shape(x))
    offsets = aten.index.Tensor(torch.arange(math.prod(xs), dtype=torch.int64).reshape(xs),
                                [None if i is None else lw.const[i] for i in indices])
    out = lw.new(node)
    out_shape = list(shape(node))
    lw.g.add_op(Opcode.GATHER, x=lw.tensor(x), index=lw.g.add_weight(offsets.contiguous()),
                out=out, rank=len(out_shape), sizes=out_shape, x_strides=[0] * len(out_shape),
                index_strides=contiguous_strides(out_shape), index_stride=1,
                dim_size=math.prod(xs))
    return out


@family.lowers(aten.index.Tensor, check=_index_check)
def _index(lw, node):
    args = arguments(node)
    x, indices = args["self"], list(args["indices"])
    if sum(i is not None for i in indices) > 1:
        return _index_by_offsets(lw, node, x, indices)
    axis = next(k for k, i in enumerate(indices) if i is not None)
    index = indices[axis]
    xs, index_shape = contiguous_strides(shape(x)), shape(index)
    b = len(index_shape)
    x_strides = xs[:axis] + [0] * b + xs[axis + 1:]
    index_strides = [0] * axis + contiguous_strides(index_shape) + [0] * (len(xs) - axis - 1)
    return gather_op(lw, node, x, index, x_strides, index_strides, axis)


# Writes at indices held in tensors: index_put (accumulate too) on any tensor but the program
# state Kiln owns (ops/state.py's kIndexPut) is a copy of its input into a new tensor and one
# kScatter into that copy.

def put_check(node):
    """Why Kiln cannot run this index_put as a kCopy and a kScatter, or None."""
    args = arguments(node)
    x, indices, values = args["self"], list(args["indices"]), args["values"]
    given = [i for i in indices if i is not None]
    if not shape(x):
        return "index_put into a 0-d tensor"
    if not given:
        return "index_put with no index tensor"
    if not isinstance(values, torch.fx.Node):
        return f"values {values!r} is not a tensor"
    if dtype(values) != dtype(x):
        return f"values dtype {dtype(values)} differs from the input's {dtype(x)}"
    why = _index_tensors_check(given, "write a data-dependent set of elements", "scatters")
    if why:
        return why
    if len(given) > MAX_SCATTER_INDICES:
        return f"index_put with {len(given)} index tensors (Kiln scatters with at most " \
               f"{MAX_SCATTER_INDICES})"
    try:
        walked = tuple(_put_layout(node)[0])
    except RuntimeError:
        return "index tensors of shapes " \
               f"{[list(shape(i)) for i in given]} do not broadcast together"
    try:
        fits = torch.broadcast_shapes(tuple(shape(values)), walked) == walked
    except RuntimeError:
        fits = False
    if not fits:
        return f"values of shape {list(shape(values))} do not broadcast to the indexed " \
               f"shape {list(walked)}"
    return None


def _put_layout(node):
    """The indexed shape of index_put (what values broadcast to), and for each of its dims the
    input dim it walks (an int) or the position in the broadcast index shape (("b", j))."""
    args = arguments(node)
    sizes, indices = list(shape(args["self"])), list(args["indices"])
    indices += [None] * (len(sizes) - len(indices))
    axes = [d for d, i in enumerate(indices) if i is not None]
    b = torch.broadcast_shapes(*(tuple(shape(indices[d])) for d in axes))
    rest = [d for d in range(len(sizes)) if indices[d] is None]
    broadcast = [("b", j) for j in range(len(b))]
    if axes == list(range(axes[0], axes[-1] + 1)):   # adjacent: the index dims stay in place
        dims = [d for d in rest if d < axes[0]] + broadcast + [d for d in rest if d > axes[0]]
    else:                                             # apart: they go first (numpy's rule)
        dims = broadcast + rest
    walked = [sizes[d] if isinstance(d, int) else b[d[1]] for d in dims]
    return walked, dims, axes, tuple(b)


def put(lw, node):
    """index_put as a copy of the input into the node's value, then one kScatter into it."""
    args = arguments(node)
    x, values = args["self"], args["values"]
    sizes = list(shape(x))
    strides = contiguous_strides(sizes)
    out = lw.new(node)
    lw.copy(lw.tensor(x), out, sizes, 0, strides, 0, strides)
    walked, dims, axes, b = _put_layout(node)
    out_strides = [strides[d] if isinstance(d, int) else 0 for d in dims]
    index_strides = []
    for d in axes:
        own = broadcast_strides(shape(args["indices"][d]), b)
        index_strides += [0 if isinstance(e, int) else own[e[1]] for e in dims]
    lw.g.add_op(Opcode.SCATTER, values=lw.tensor(values), out=out, rank=len(walked),
                sizes=walked, out_strides=out_strides,
                values_strides=broadcast_strides(shape(values), walked),
                num_indices=len(axes), indices=[lw.tensor(args["indices"][d]) for d in axes],
                index_strides=index_strides, index_out_strides=[strides[d] for d in axes],
                dim_sizes=[sizes[d] for d in axes], accumulate=int(bool(args["accumulate"])))
    return out
