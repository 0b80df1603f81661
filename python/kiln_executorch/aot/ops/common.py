"""Helpers the operator family modules share: reading an fx node (its value, shape, dtype and
schema arguments), stride arithmetic for the lowerings, and the support conditions several
families use."""

import operator

import torch

from ..blob_format import DTYPES

aten = torch.ops.aten

FLOAT = (torch.float32, torch.float16, torch.bfloat16)
INT = (torch.int32, torch.int64)
ALL_DTYPES = tuple(DTYPES)      # what a TensorRecord can declare


class KilnLoweringError(RuntimeError):
    """A partition contains something the partitioner should not have given Kiln."""


class Value:
    """An IR tensor used as an operand where an fx node usually is."""

    def __init__(self, tid, shape):
        self.tid, self.shape = tid, tuple(shape)


# Reading nodes.

def aten_op(node):
    """The ATen OpOverload behind an fx node's target: edge ops wrap one, and a few nodes of an
    edge graph (e.g. scalar_tensor) call the ATen op directly."""
    if isinstance(node.target, torch._ops.OpOverload):
        return node.target
    return getattr(node.target, "_op", node.target)


def val(node):
    return node.meta.get("val") if isinstance(node, torch.fx.Node) else None


def arguments(node):
    """Every schema argument of an operator node by name, defaults filled in."""
    schema = aten_op(node)._schema
    out = {}
    for i, a in enumerate(schema.arguments):
        if i < len(node.args):
            out[a.name] = node.args[i]
        elif a.name in node.kwargs:
            out[a.name] = node.kwargs[a.name]
        else:
            out[a.name] = a.default_value if a.has_default_value() else None
    return out


def first(node):
    """The node's tensor value (the first one for multi-output operators)."""
    v = val(node)
    return v[0] if isinstance(v, (tuple, list)) else v


def shape(node):
    return tuple(int(s) for s in first(node).shape)


def dtype(node):
    return first(node).dtype


def tensors(value):
    """Every tensor in a node value (a tensor, or nested lists and tuples of them)."""
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in tensors(v)]
    return []


def is_contiguous(t):
    return t.is_contiguous() or t.numel() <= 1


# Shapes and strides (for the lowerings).

def contiguous_strides(sizes):
    strides, acc = [], 1
    for n in reversed(sizes):
        strides.append(acc)
        acc *= n
    return strides[::-1]


def broadcast_strides(sizes, out_shape):
    """Strides that read a contiguous `sizes` as `out_shape` (0 along broadcast dims)."""
    sizes = (1,) * (len(out_shape) - len(sizes)) + tuple(sizes)
    return [s if n == o and n != 1 else 0
            for n, o, s in zip(sizes, out_shape, contiguous_strides(sizes))]


def coalesce(sizes, *strides):
    """Drops size-1 dims and merges dims every stride list walks as one; returns the fewest dims
    that index the same elements (for shorter kernels' index math)."""
    dims = []
    for d, n in enumerate(sizes):
        if n == 1:
            continue
        st = [s[d] for s in strides]
        if dims and all(ps == s * n for ps, s in zip(dims[-1][1], st)):
            dims[-1] = (dims[-1][0] * n, st)
        else:
            dims.append((n, st))
    return [n for n, _ in dims], [[st[i] for _, st in dims] for i in range(len(strides))]


def wrap_dim(d, rank):
    return d + rank if d < 0 else d


def pair(v):
    v = list(v) if isinstance(v, (list, tuple)) else [v]
    return v * 2 if len(v) == 1 else v


def uniform(t):
    """The single value of a constant whose elements are all equal, else None."""
    if t.numel() == 0:
        return None
    head = t.reshape(-1)[0]
    return float(head) if bool((t == head).all()) else None


# Support conditions several families share (check(node, ctx) -> None or why not).

def floating_input(node, ctx):
    x = node.args[0]
    if dtype(x) not in FLOAT:
        return f"input dtype {dtype(x)}: this operator runs on floating tensors only"
    return None


def numeric_input(node, ctx):
    if dtype(node.args[0]) == torch.bool:
        return "Bool input: this operator runs on numbers only"
    return None


def any_input(node, ctx):
    return None


def bool_only(node, ctx):
    operands = [x for x in node.args[:2] if isinstance(x, torch.fx.Node)]
    if any(dtype(x) != torch.bool for x in operands):
        return "bitwise operator: Bool operands only (run as logical and/or/not)"
    return None


def reads_output(node, i):
    """Whether anything reads output i of a multi-output node (through getitem), or the node's
    value whole."""
    return any(user.target is not operator.getitem or user.args[1] == i for user in node.users)


def reads_output(node, i):
    """Whether anything reads output i of a multi-output node (a getitem of it, or the node's
    whole value): a lowering computes an optional output (indices) only when it is read."""
    return any(user.target is not operator.getitem or user.args[1] == i for user in node.users)


def only_first_output_used(node, what):
    for user in node.users:
        if user.target is not operator.getitem or user.args[1] != 0:
            return f"{what} is used; Kiln computes only the first output"
    return None


def matmul_dtypes(node, *operands):
    dtypes = {dtype(x) for x in operands if isinstance(x, torch.fx.Node)} | {dtype(node)}
    if len(dtypes) != 1 or not dtypes <= set(FLOAT):
        return f"matmul operands {sorted(map(str, dtypes))}: one floating dtype required"
    return None
