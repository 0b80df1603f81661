"""Rotary position embedding as one kRope op, recognised where the model wrote it out.

HF's decoders (Llama, Qwen, Mistral, Gemma, GPT-NeoX) apply RoPE as
`x * cos + cat(-x[..., h:], x[..., :h]) * sin` (rotate_half), which lowers op by op to two slice
copies, a neg, two cat copies and a fused multiply-add, after the copy that transposed x to
[B, H, S, D]. The add lowering asks `lower` first: when its operands are that pattern it emits one
kRope reading x in place through its views (attention.layout: the projection output before
the transpose), and the ops already emitted for the pattern go unread (the builder drops them).
"""

import torch

from ..blob_format import Opcode
from .common import FLOAT, aten_op, arguments, broadcast_strides, dtype, shape, wrap_dim

aten = torch.ops.aten


def _call(node, *ops):
    return isinstance(node, torch.fx.Node) and node.op == "call_function" and \
        aten_op(node) in ops


def _half(node, x, first):
    """True when `node` is the slice x[..., :h] (first) or x[..., h:] of x's last dim."""
    if not _call(node, aten.slice_copy.Tensor) or node.args[0] is not x:
        return False
    a, size = arguments(node), shape(x)[-1]
    if wrap_dim(a["dim"], len(shape(x))) != len(shape(x)) - 1 or a["step"] != 1:
        return False
    start, end, _ = slice(a["start"], a["end"]).indices(size)
    return (start, end) == ((0, size // 2) if first else (size // 2, size))


def _rotated_source(cat):
    """x when `cat` is rotate_half(x) = cat([-x[..., h:], x[..., :h]], -1), else None."""
    if not _call(cat, aten.cat.default):
        return None
    parts = cat.args[0]
    dim = cat.args[1] if len(cat.args) > 1 else cat.kwargs.get("dim", 0)
    if len(parts) != 2 or not _call(parts[0], aten.neg.default):
        return None
    x = parts[0].args[0].args[0] if _call(parts[0].args[0], aten.slice_copy.Tensor) else None
    if x is None or wrap_dim(dim, len(shape(cat))) != len(shape(cat)) - 1:
        return None
    if not (_half(parts[0].args[0], x, first=False) and _half(parts[1], x, first=True)):
        return None
    return x


def _products(node):
    """The two factors of a tensor-tensor multiply node, else None."""
    if not _call(node, aten.mul.Tensor) or len(node.args) != 2:
        return None
    a, b = node.args
    return (a, b) if isinstance(a, torch.fx.Node) and isinstance(b, torch.fx.Node) else None


def match(node):
    """(x, cos, sin) when the add `node` is x * cos + rotate_half(x) * sin (either operand order
    of the add and of each multiply), with x of the add's shape and one floating dtype for all;
    else None."""
    if not _call(node, aten.add.Tensor) or arguments(node).get("alpha", 1) != 1:
        return None
    terms = [_products(t) for t in node.args[:2]]
    if None in terms:
        return None
    for plain, rotated in (terms, terms[::-1]):
        for rot, sin in (rotated, rotated[::-1]):
            x = _rotated_source(rot)
            if x is None or x not in plain:
                continue
            cos = plain[1] if plain[0] is x else plain[0]
            if cos is x:
                continue
            out_shape = tuple(shape(node))
            if tuple(shape(x)) != out_shape or out_shape[-1] % 2 or \
                    {dtype(t) for t in (x, cos, sin, node)} != {dtype(node)} or \
                    dtype(node) not in FLOAT:
                continue
            try:
                if any(torch.broadcast_shapes(shape(t), out_shape) != out_shape
                       for t in (cos, sin)):
                    continue
            except RuntimeError:
                continue
            return x, cos, sin
    return None


def lower(lw, node):
    """The kRope output for an add that is RoPE (see match), else None."""
    found = match(node)
    if found is None:
        return None
    from .attention import layout   # the view chain walk SDPA's operands use
    x, cos, sin = found
    out_shape = list(shape(node))
    root, x_offset, x_strides = layout(x)
    tx = lw.tensor(root)
    fields = {}
    for name, t in (("cos", cos), ("sin", sin)):
        tid, sizes = lw.operand(t, broadcast_scalar=True)
        fields[name] = tid
        fields[f"{name}_offset"] = 0
        fields[f"{name}_strides"] = broadcast_strides(sizes, out_shape)
    out = lw.new(node)
    lw.g.add_op(Opcode.ROPE, x=tx, out=out, rank=len(out_shape), sizes=out_shape,
                x_offset=x_offset, x_strides=list(x_strides), **fields)
    return out
