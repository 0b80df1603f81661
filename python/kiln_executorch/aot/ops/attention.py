"""Scaled-dot-product attention (aten.scaled_dot_product_attention) as one kAttention op.

The partitioner keeps the operator whole through ExecuTorch's decompositions
(KilnPartitioner.ops_to_not_decompose) when `check` passes for every SDPA node of the program;
otherwise they all decompose as before. The lowering reads q, k and v where they are: a chain of
views, permutes, selects and slices of a contiguous tensor (a projection output viewed as [B, S,
H, D] and transposed to [B, H, S, D], or a third of a packed qkv projection as
nn.MultiheadAttention selects it or GPT-2 splits it) is read through an offset and strides, with
no copy, when the last dim stays dense (the copies the chain had go unread and the builder drops
them); any other producer is read as the value it makes. HF's repeat_kv (k[:, :,
None].expand(...).reshape(...)) is read as grouped-query attention on the unexpanded heads. A
mask known ahead of time is folded where that changes nothing: all zeros is no mask, and 0 on and
below the diagonal with <= -1e6 above it is the causal flag (at those values softmax gives
exactly 0 above the diagonal in every floating dtype).
"""

import math
import operator

import torch

from ..blob_format import Opcode
from .common import FLOAT, arguments, aten_op, contiguous_strides, dtype, shape, val, wrap_dim
from .matmul import IN_PLACE
from .registry import Family
from .views import permutation

aten = torch.ops.aten
family = Family(__name__)

_CLONES = (aten.clone.default, torch.ops.dim_order_ops._clone_dim_order.default)
_VIEW_LIKE = (aten.view_copy.default, aten.squeeze_copy.default, aten.squeeze_copy.dim,
              aten.squeeze_copy.dims, aten.unsqueeze_copy.default, aten.select_copy.int,
              aten.slice_copy.Tensor)
_SPLITS = (aten.split_with_sizes_copy.default, aten.split_copy.Tensor,
           aten.split_with_sizes.default, aten.split.Tensor)
MAX_HEAD_DIM = 256          # the engine kernel's limit (kernels/attention.cuh)
CAUSAL_MASKED = -1e6        # a constant mask at or below this above the diagonal is `causal`


def _dims(node):
    """(batch, heads, seq, dim) of a rank-3 ([batch, seq, dim]: one head) or rank-4 value."""
    s = shape(node)
    return (s[0], 1, s[1], s[2]) if len(s) == 3 else s


def check(node, ctx=None):
    """None when Kiln runs this scaled_dot_product_attention node, else why not (an ATen node:
    ops_to_not_decompose asks before to_edge; or an edge node: the partitioner asks after)."""
    args = arguments(node)
    q, k, v, mask = args["query"], args["key"], args["value"], args["attn_mask"]
    for t in (q, k, v, mask, node):
        if t is not None and not all(isinstance(s, int) for s in val(t).shape):
            return "symbolic sizes: Kiln's attention is shape-specialised (it decomposes instead)"
    if args["dropout_p"] != 0:
        return f"dropout_p={args['dropout_p']}: Kiln runs attention without dropout"
    dtypes = {dtype(t) for t in (q, k, v)}
    if len(dtypes) != 1 or not dtypes <= set(FLOAT):
        return f"q, k, v dtypes {sorted(map(str, dtypes))}: one floating dtype required"
    ranks = {len(shape(t)) for t in (q, k, v)}
    if ranks not in ({3}, {4}):
        return f"q, k, v of ranks {sorted(len(shape(t)) for t in (q, k, v))}: 3 or 4 required"
    (b, hq, sq, d), (bk, hk, sk, dk), (bv, hv, sv, dv) = _dims(q), _dims(k), _dims(v)
    if not (b == bk == bv and hk == hv and sk == sv and d == dk):
        return (f"q {list(shape(q))}, k {list(shape(k))}, v {list(shape(v))}: Kiln needs one "
                "batch, k and v of one head count and length, and q and k of one head_dim")
    if hq != hk and not (args["enable_gqa"] and hq % hk == 0):
        return f"{hq} query heads and {hk} key/value heads without enable_gqa"
    if max(d, dv) > MAX_HEAD_DIM or min(d, dv) < 1:
        return f"head_dim {d} / {dv}: Kiln's kernel takes 1..{MAX_HEAD_DIM}"
    if mask is not None:
        if dtype(mask) != torch.bool and dtype(mask) != dtype(q):
            return f"mask dtype {dtype(mask)}: Bool or the query's dtype required"
        full = (b, sq, sk) if len(shape(q)) == 3 else (b, hq, sq, sk)
        try:
            if torch.broadcast_shapes(shape(mask), full) != torch.Size(full):
                raise RuntimeError
        except RuntimeError:
            return f"mask {list(shape(mask))} does not broadcast to {list(full)}"
        if args["is_causal"]:
            return "both a mask and is_causal (torch refuses this too)"
    return None


def _piece(node):
    """(split input, dim, element index along dim where the piece starts) when `node` is
    getitem of a split / split_with_sizes, else None."""
    split, index = node.args
    if not isinstance(split, torch.fx.Node) or split.op != "call_function" or \
            aten_op(split) not in _SPLITS or not isinstance(split.args[0], torch.fx.Node):
        return None
    src = split.args[0]
    dim = wrap_dim(arguments(split)["dim"], len(shape(src)))
    return src, dim, sum(int(p.shape[dim]) for p in val(split)[:index])


def _layout(node):
    """(root node, element offset, strides) that read `node`'s value from a contiguous root
    through the view-like ops before it (views, permutes, selects, slices, unsqueeze/squeeze,
    clones, a piece of a split), or (node, 0, contiguous strides) where that chain ends or a
    node cannot be expressed as strides (any other node, operator or not, reads its own value)."""
    own = (node, 0, contiguous_strides(shape(node)))
    if not isinstance(node, torch.fx.Node) or node.op != "call_function":
        return own
    if IN_PLACE in node.meta:    # a column block of merged projections (ops/matmul.py)
        return node.meta[IN_PLACE]
    if node.target is operator.getitem:
        piece = _piece(node)
        if piece is None:
            return own
        src, dim, start = piece
        root, offset, strides = _layout(src)
        return root, offset + start * strides[dim], strides
    op = aten_op(node)
    if not isinstance(op, torch._ops.OpOverload):
        return own
    args = arguments(node)
    perm = permutation(node)
    if perm is None and op not in _VIEW_LIKE:
        return own
    src = node.args[0]
    if not isinstance(src, torch.fx.Node):
        return own
    root, offset, strides = _layout(src)
    if perm is not None:
        return root, offset, [strides[d] for d in perm]
    sizes = list(shape(src))
    if op == aten.select_copy.int:
        dim = wrap_dim(args["dim"], len(sizes))
        index = args["index"] + (sizes[dim] if args["index"] < 0 else 0)
        return root, offset + index * strides[dim], strides[:dim] + strides[dim + 1:]
    if op == aten.slice_copy.Tensor:
        dim = wrap_dim(args["dim"], len(sizes))
        start = slice(args["start"], args["end"], args["step"]).indices(sizes[dim])[0]
        strides = list(strides)
        offset += start * strides[dim]
        strides[dim] *= args["step"]
        return root, offset, strides
    # view / reshape / squeeze / unsqueeze: the strides torch itself gives such a view, when
    # there is one.
    try:
        viewed = torch.empty_strided(sizes, strides, device="meta").view(shape(node))
    except RuntimeError:
        return own
    return root, offset, list(viewed.stride())


def layout(node):
    """_layout(node), or the value itself when the root that chain reaches holds no tensor."""
    root, offset, strides = _layout(node)
    if isinstance(root, torch.fx.Node) and not isinstance(val(root), torch.Tensor):
        return node, 0, contiguous_strides(shape(node))
    return root, offset, strides


def _strided(lw, node):
    """(tensor id, offset, [stride_b, stride_h, stride_s]) reading `node`'s value as
    [B, H, S, D] in place (see layout) when its last dim stays dense, else the value itself."""
    root, offset, strides = layout(node)
    if strides[-1] != 1 or min(strides) < 0:
        root, offset, strides = node, 0, contiguous_strides(shape(node))
    if len(strides) == 3:
        strides = [strides[0], 0, strides[1], strides[2]]
    return lw.tensor(root), offset, strides[:3]


def _repeat_kv_source(node):
    """(the [B, Hkv, S, D] node, n_rep) when `node` is HF's repeat_kv of it (unsqueeze at dim 2,
    expand to n_rep, a clone, reshape to Hkv * n_rep heads), else None."""
    if aten_op(node) != aten.view_copy.default or len(shape(node)) != 4:
        return None
    expand = node.args[0]
    while isinstance(expand, torch.fx.Node) and expand.op == "call_function" and \
            aten_op(expand) in _CLONES:
        expand = expand.args[0]
    if not isinstance(expand, torch.fx.Node) or expand.op != "call_function" or \
            aten_op(expand) != aten.expand_copy.default:
        return None
    unsq = expand.args[0]
    if not isinstance(unsq, torch.fx.Node) or unsq.op != "call_function":
        return None
    b, hkv, one, s, d = (shape(unsq) + (None,) * 5)[:5] if len(shape(unsq)) == 5 else (None,) * 5
    if one != 1 or aten_op(unsq) not in (aten.unsqueeze_copy.default, aten.view_copy.default):
        return None
    src = unsq.args[0]
    eb, ehkv, n, es, ed = shape(expand)
    if shape(src) != (b, hkv, s, d) or (eb, ehkv, es, ed) != (b, hkv, s, d) or \
            shape(node) != (b, hkv * n, s, d):
        return None
    return src, n


def _constant_mask(lw, mask, mshape, full):
    """For a mask known ahead of time (its shape as 4-D `mshape`): ("none",) when it changes
    nothing, ("causal",) when it is the top-left causal pattern, else None."""
    c = lw.const.get(mask)
    if c is None or c.dtype == torch.bool:
        return None
    c = c.double().reshape(mshape).broadcast_to(full).reshape(-1, full[-2], full[-1])
    if bool((c == 0).all()):
        return ("none",)
    first = c[0]
    if not bool((c == first).all()) or full[-2] > full[-1]:
        return None
    above = torch.ones_like(first, dtype=torch.bool).triu(1)
    if bool((first[~above] == 0).all()) and bool((first[above] <= CAUSAL_MASKED).all()):
        return ("causal",)
    return None


@family.lowers(aten.scaled_dot_product_attention.default, check=check)
def _attention(lw, node):
    args = arguments(node)
    q, k, v, mask = args["query"], args["key"], args["value"], args["attn_mask"]
    b, hq, sq, d = _dims(q)
    _, hkv, skv, _ = _dims(k)
    dv = _dims(v)[3]
    causal = bool(args["is_causal"])
    reps = [_repeat_kv_source(t) for t in (k, v)]
    if hkv == hq and reps[0] is not None and reps[1] is not None and reps[0][1] == reps[1][1]:
        (k, n), (v, _) = reps
        hkv = hq // n
    (tq, qo, qs), (tk, ko, ks), (tv, vo, vs) = (_strided(lw, t) for t in (q, k, v))
    full = (b, hq, sq, skv)
    tm, ms = -1, [0, 0, 0, 0]
    if mask is not None:
        mshape = tuple(shape(mask))
        if len(shape(q)) == 3:     # broadcast against [N, Sq, Skv]: insert the head dim
            mshape = (1,) * (3 - len(mshape)) + mshape
            mshape = (mshape[0], 1) + mshape[1:]
        mshape = (1,) * (4 - len(mshape)) + mshape
        folded = _constant_mask(lw, mask, mshape, full)
        if folded == ("causal",):
            causal = True
        elif folded is None:
            tm = lw.tensor(mask)
            ms = [s if n != 1 else 0 for n, s in zip(mshape, contiguous_strides(mshape))]
    scale = args["scale"]
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    out = lw.new(node)
    lw.g.add_op(Opcode.ATTENTION, q=tq, k=tk, v=tv, mask=tm, out=out, batch=b, heads_q=hq,
                heads_kv=hkv, seq_q=sq, seq_kv=skv, head_dim=d, head_dim_v=dv,
                q_offset=qo, k_offset=ko, v_offset=vo,
                q_stride_b=qs[0], q_stride_h=qs[1], q_stride_s=qs[2],
                k_stride_b=ks[0], k_stride_h=ks[1], k_stride_s=ks[2],
                v_stride_b=vs[0], v_stride_h=vs[1], v_stride_s=vs[2],
                mask_stride_b=ms[0], mask_stride_h=ms[1], mask_stride_q=ms[2],
                mask_stride_k=ms[3], causal=int(causal), scale=scale,
                out_stride_b=hq * sq * dv, out_stride_h=sq * dv, out_stride_s=dv)
    return out
