"""Views and data movement. Views of contiguous tensors (view, squeeze, unsqueeze, clone) move no
data: the IR gives them their own tensor aliasing their input's storage. Permutes, expands, slices,
selects, concatenations and dtype casts are kCopy (or a view, when the read is the whole source in
order)."""

import math

import torch

from .common import (any_input, arguments, aten_op, broadcast_strides, contiguous_strides,
                     dtype, shape, val, wrap_dim)
from .registry import VIEW, Family

aten = torch.ops.aten
dim_order_ops = torch.ops.dim_order_ops
family = Family(__name__)

_CLONES = {aten.clone.default, dim_order_ops._clone_dim_order.default}


def _dim_order_check(node, ctx):
    dim_order = arguments(node).get("dim_order")
    if dim_order is not None and list(dim_order) != list(range(val(node).dim())):
        return f"dim order {list(dim_order)}: Kiln keeps tensors contiguous (dim order 0..n-1)"
    return None


def _contiguous_layout_check(node, ctx):
    memory_format = arguments(node).get("memory_format")
    if memory_format not in (None, torch.contiguous_format, torch.preserve_format):
        return f"memory_format={memory_format}"
    return _dim_order_check(node, ctx)


def _slice_check(node, ctx):
    step = arguments(node)["step"]
    if not isinstance(step, int) or step < 1:
        return f"slice step {step!r}"
    return None


def _cat_check(node, ctx):
    dtypes = {dtype(t) for t in node.args[0]}
    if dtypes != {dtype(node)}:
        return f"cat of mixed dtypes {sorted(map(str, dtypes))}"
    return None


def permutation(node):
    """perm such that dim i of a permute/transpose/t/clone node is dim perm[i] of its input;
    None for any other node."""
    if not isinstance(node, torch.fx.Node) or node.op != "call_function":
        return None
    op, rank = aten_op(node), len(shape(node))
    if op == aten.permute_copy.default:
        return [wrap_dim(d, rank) for d in node.args[1]]
    perm = list(range(rank))
    if op in (aten.transpose_copy.int, aten.t_copy.default):
        if rank >= 2:
            d0, d1 = (wrap_dim(d, rank) for d in node.args[1:3]) \
                if op == aten.transpose_copy.int else (0, 1)
            perm[d0], perm[d1] = perm[d1], perm[d0]
        return perm
    return perm if op in _CLONES else None


@family.lowers(aten.view_copy.default, aten.squeeze_copy.default, aten.squeeze_copy.dim,
               aten.squeeze_copy.dims, aten.unsqueeze_copy.default, check=any_input,
               traits=[VIEW])
def _view(lw, node):
    return lw.g.add_alias(lw.tensor(node.args[0]), shape(node), name=node.name)


family.register(aten.clone.default, _contiguous_layout_check, _view, traits=[VIEW])
family.register(dim_order_ops._clone_dim_order.default, _contiguous_layout_check, _view,
                traits=[VIEW])


@family.lowers(aten.permute_copy.default, aten.transpose_copy.int, aten.t_copy.default,
               check=any_input)
def _permute(lw, node):
    """permute/transpose/t. A chain of them (clones between included) is one copy from the
    chain's source; the intermediate copies go unless something else reads them."""
    perm, src = permutation(node), node.args[0]
    while (inner := permutation(src)) is not None:
        perm, src = [inner[d] for d in perm], src.args[0]
    strides = contiguous_strides(shape(src))
    return lw.strided_copy(node, 0, [strides[d] for d in perm], source=src)


@family.lowers(aten.expand_copy.default, check=any_input)
def _expand(lw, node):
    return lw.strided_copy(node, 0, broadcast_strides(shape(node.args[0]), shape(node)))


@family.lowers(aten.slice_copy.Tensor, check=_slice_check)
def _slice(lw, node):
    args = arguments(node)
    sizes = shape(args["self"])
    dim, step = wrap_dim(args["dim"], len(sizes)), args["step"]
    start = slice(args["start"], args["end"], step).indices(sizes[dim])[0]
    strides = contiguous_strides(sizes)
    offset = start * strides[dim]
    strides[dim] *= step
    return lw.strided_copy(node, offset, strides)


@family.lowers(aten.select_copy.int, check=any_input)
def _select(lw, node):
    x, dim, index = node.args
    sizes = shape(x)
    dim = wrap_dim(dim, len(sizes))
    strides = contiguous_strides(sizes)
    offset = (index + sizes[dim] if index < 0 else index) * strides.pop(dim)
    return lw.strided_copy(node, offset, strides)


@family.lowers(aten.cat.default, check=_cat_check)
def _cat(lw, node):
    args = arguments(node)
    out_shape = shape(node)
    dim = wrap_dim(args["dim"], len(out_shape))
    out = lw.new(node)
    out_strides = contiguous_strides(out_shape)
    at = 0
    for piece in args["tensors"]:
        piece_shape = shape(piece)
        if math.prod(piece_shape) == 0:
            continue
        lw.copy(lw.tensor(piece), out, piece_shape, 0, contiguous_strides(piece_shape),
                at * out_strides[dim], out_strides)
        at += piece_shape[dim]
    return out


@family.lowers(dim_order_ops._to_dim_order_copy.default, check=_contiguous_layout_check)
def _to_copy(lw, node):
    x = node.args[0]
    if dtype(node) == dtype(x):
        return _view(lw, node)
    out = lw.new(node)
    n = math.prod(shape(node))
    lw.copy(lw.tensor(x), out, [n], 0, [1], 0, [1])
    return out
