"""Matrix products: mm, bmm, addmm and linear, each one kMatmul. A transpose of the last two dims
of an operand is read in place through trans_a/trans_b instead of being copied.

With KilnPartitioner(weights="int8" / "int4"...) a linear, 2-D mm or addmm (alpha = beta = 1, a
bias of N elements) whose weight is a constant is one kQuantMatmul instead: the weight is
quantized here (kiln_executorch.quantize) and stored packed, with its scales; a weight whose K the
int4 group does not divide stays a kMatmul.

Sibling projections (linears of one input with constant weights: an attention block's q, k and
v) become one kMatmul over their concatenated weights, writing [.., N_q + N_k + N_v]. Each
sibling's value is then a column block of it: readers that take an offset and strides (SDPA's
q/k/v, kRope's x, through attention._layout) read it in place via IN_PLACE in the node's meta;
any other reader gets a kCopy of the block, which the builder drops when nobody reads it. A
projection of one row (a decoder's token: decode's q / k / v, gate / up) merges whatever reads
it: each block is then a contiguous run of the merged row, and the builder turns its kCopy into a
view (view_contiguous_copies), so one GEMV streams all the weights where several each paid a
launch and a ramp (not in a variant set's variants, which share their weights only when all have
the same).
"""

import math

import torch

from ...quantize import supports
from .common import Value, arguments, aten_op, contiguous_strides, matmul_dtypes, shape, val
from .registry import Family
from .views import permutation

aten = torch.ops.aten
family = Family(__name__)


def _mm_check(node, ctx):
    return matmul_dtypes(node, node.args[0], node.args[1])


def _addmm_check(node, ctx):
    for name in ("alpha", "beta"):
        if not isinstance(arguments(node)[name], (int, float)):
            return f"{name} is not a number"
    bias = node.args[0]
    if val(bias).dim() > 2:
        return f"bias of rank {val(bias).dim()}"
    return matmul_dtypes(node, *node.args[:3])


def _linear_check(node, ctx):
    if val(node.args[1]).dim() != 2:
        return "linear weight is not 2-D"
    return matmul_dtypes(node, *node.args[:3])


def _matrix(lw, node, rank):
    """(tensor id, transposed) of a matmul operand of `rank` dims; a transpose of the last two
    dims is read in place through the trans flag instead of being copied."""
    if rank >= 2 and permutation(node) == list(range(rank - 2)) + [rank - 1, rank - 2]:
        return lw.tensor(node.args[0]), 1
    return lw.tensor(node), 0


def _quantized(lw, node, x, weight, bias):
    """kQuantMatmul of `x` (a node, [.., K]) with the constant `weight` [N, K] and `bias` (a node
    of N elements, or None) when the program quantizes its weights; else None."""
    if lw.weights is None or weight is None or weight.dim() != 2 or \
            not weight.dtype.is_floating_point:
        return None
    n, k = weight.shape
    if (bias is not None and math.prod(shape(bias)) != n) or not supports(lw.weights, k):
        return None
    out = lw.new(node)
    lw.quant_matmul(out, lw.tensor(x), weight, -1 if bias is None else lw.tensor(bias),
                    math.prod(shape(x)) // k, name=node.name)
    return out


def _constant_weight(lw, b):
    """The [N, K] weight a 2-D mm's constant second operand b [K, N] stands for, or None."""
    if lw.weights is None or len(shape(b)) != 2:
        return None
    value = _constant(lw, b)
    return None if value is None else value.t()


@family.lowers(aten.mm.default, aten.bmm.default, check=_mm_check)
def _mm(lw, node):
    merged = _merged_or_none(lw, node)
    if merged is not None:
        return merged
    a, b = node.args[:2]
    quantized = _quantized(lw, node, a, _constant_weight(lw, b), None)
    if quantized is not None:
        return quantized
    rank = len(shape(a))
    out = lw.new(node)
    shape_a, n = shape(a), shape(node)[-1]
    batch = shape_a[0] if rank == 3 else 1
    m, k = shape_a[-2:]
    lw.matmul(out, _matrix(lw, a, rank), _matrix(lw, b, rank), -1, batch, m, n, k,
              a_batch=m * k if rank == 3 else 0, b_batch=k * n if rank == 3 else 0)
    return out


@family.lowers(aten.addmm.default, check=_addmm_check)
def _addmm(lw, node):
    merged = _merged_or_none(lw, node)
    if merged is not None:
        return merged
    bias, a, b = node.args[:3]
    args = arguments(node)
    if args["alpha"] == 1 and args["beta"] == 1 and isinstance(bias, torch.fx.Node):
        quantized = _quantized(lw, node, a, _constant_weight(lw, b), bias)
        if quantized is not None:
            return quantized
    out = lw.new(node)
    (m, k), n = shape(a), shape(node)[1]
    lw.matmul(out, _matrix(lw, a, 2), _matrix(lw, b, 2), lw.tensor(bias), 1, m, n, k,
              bias_shape=shape(bias), alpha=args["alpha"], beta=args["beta"])
    return out


IN_PLACE = "kiln_in_place"   # node.meta key: (Value of the merged output, offset, strides)
_VIEWS = (aten.view_copy.default, aten.unsqueeze_copy.default, aten.squeeze_copy.dims,
          aten.squeeze_copy.dim, aten.squeeze_copy.default)


def _source(node):
    """The node a chain of views of `node` starts from (projections of one input each view it)."""
    while isinstance(node, torch.fx.Node) and node.op == "call_function" and \
            aten_op(node) in _VIEWS:
        node = node.args[0]
    return node


def _constant(lw, node, depth=4):
    """The value of `node` when it is known ahead of time, evaluating (and recording, as the
    lowering would when it gets there) the few constant ops before it: a sibling's transposed
    weight comes after the first sibling in graph order."""
    if not isinstance(node, torch.fx.Node):
        return None
    if node in lw.const:
        return lw.const[node]
    if depth == 0 or node.op != "call_function" or \
            any(_constant(lw, n, depth - 1) is None for n in node.all_input_nodes):
        return None
    lw.const[node] = lw._evaluate(node)
    return lw.const[node]


def _projection(lw, node):
    """(input key, input node, weight [N, K] tensor, bias [N] tensor or None) of a linear, or of an
    mm / addmm (alpha = beta = 1) of a 2-D input, whose weight and bias are constants; else None."""
    op = aten_op(node)
    if op == aten.linear.default:
        a = arguments(node)
        x, w, bias = a["input"], a["weight"], a["bias"]
        weight = _constant(lw, w)
        if weight is None:
            return None
    elif op in (aten.mm.default, aten.addmm.default):
        bias = node.args[0] if op == aten.addmm.default else None
        x, b = node.args[1:3] if op == aten.addmm.default else node.args[:2]
        if op == aten.addmm.default and (arguments(node)["alpha"] != 1 or
                                         arguments(node)["beta"] != 1):
            return None
        weight = _constant(lw, b)
        if weight is None or weight.dim() != 2 or len(shape(x)) != 2:
            return None
        weight = weight.t()
    else:
        return None
    if not isinstance(x, torch.fx.Node) or x in lw.const or weight.dim() != 2:
        return None
    if bias is not None and (_constant(lw, bias) is None or len(shape(bias)) != 1 or
                             shape(bias)[0] != weight.shape[0]):
        return None
    key = (_source(x), tuple(shape(x)), weight.shape[1], bias is None, weight.dtype,
           val(node).dtype)
    return key, x, weight, None if bias is None else lw.const[bias]


_PASS_THROUGH = _VIEWS + (aten.permute_copy.default, aten.transpose_copy.int,
                          aten.select_copy.int, aten.slice_copy.Tensor, aten.expand_copy.default,
                          aten.clone.default, torch.ops.dim_order_ops._clone_dim_order.default)


def _read_in_place(node):
    """True when every reader of `node` (through views, permutes, slices and HF's repeat_kv) is
    SDPA's q, k or v or the x of a rotary embedding (ops/rope.py): readers that take a column
    block in place. Merging any other projection would add a copy instead of saving a launch."""
    from .rope import match   # rope imports attention, which imports this module
    chain, todo = set(), [node]
    while todo:
        n = todo.pop()
        chain.add(n)
        for u in n.users:
            if u in chain:
                continue
            op = aten_op(u) if u.op == "call_function" else None
            if op in _PASS_THROUGH:
                todo.append(u)
            elif op == aten.scaled_dot_product_attention.default:
                if arguments(u)["attn_mask"] in chain:
                    return False
            elif not _in_rope_of(u, chain, match):
                return False
    return True


def _in_rope_of(node, chain, match, depth=4):
    """True when `node` (a reader of a chain value) leads within `depth` ops to an add that is
    the rotary embedding of a value of the chain."""
    if depth == 0:
        return False
    for u in node.users:
        found = match(u)
        if found is not None and found[0] in chain:
            continue
        if not _in_rope_of(u, chain, match, depth - 1):
            return False
    return bool(node.users)


def _one_row(node):
    """True when the projection computes one row (its blocks are contiguous in the merged row)."""
    return math.prod(shape(node)[:-1]) == 1


def _mergeable(lw, node):
    return (lw.merge_one_row and _one_row(node)) or _read_in_place(node)


def _siblings(lw, node):
    """[(projection, its _projection tuple)] for `node` and the other projections of its input
    (node first, then graph order) that can share one kMatmul; None when there is no other."""
    mine = _projection(lw, node)
    if mine is None or not _mergeable(lw, node):
        return None
    source = mine[0][0]
    candidates = {n for v in [source, *source.users] if isinstance(v, torch.fx.Node)
                  for n in [v, *v.users]}
    group = []
    for n in node.graph.nodes:
        if n is node:
            group.append((n, mine))
        elif n in candidates and n.op == "call_function" and IN_PLACE not in n.meta:
            found = _projection(lw, n)
            if found is not None and found[0] == mine[0] and _mergeable(lw, n):
                group.append((n, found))
    return group if len(group) > 1 and group[0][0] is node else None


def _merged(lw, group):
    """One kMatmul for the sibling projections `group` (_siblings' pairs; see the module
    docstring); returns the first one's tensor id (a kCopy of its block, like every sibling's)."""
    x = group[0][1][1]
    weights = [found[2] for _, found in group]
    widths = [w.shape[0] for w in weights]
    total, k = sum(widths), weights[0].shape[1]
    m = math.prod(shape(x)) // k
    nodes = [n for n, _ in group]
    lead = tuple(shape(nodes[0]))[:-1]
    name = "_".join(n.name for n in nodes)
    merged = lw.g.add_tensor(val(nodes[0]).dtype, lead + (total,), name=name)
    bias, bias_shape = -1, ()
    if group[0][1][3] is not None:
        bias = lw.g.add_weight(torch.cat([found[3] for _, found in group]), name=name + "_bias")
        bias_shape = (total,)
    if lw.weights is not None and supports(lw.weights, k):
        lw.quant_matmul(merged, lw.tensor(x), torch.cat(weights, 0), bias, m, name=name)
    else:
        w = lw.g.add_weight(torch.cat(weights, 0), name=name + "_weight")
        lw.matmul(merged, (lw.tensor(x), 0), (w, 1), bias, 1, m, total, k,
                  bias_shape=bias_shape, beta=1.0)
    strides = contiguous_strides(lead + (total,))
    offset = 0
    for n, width in zip(nodes, widths):
        n.meta[IN_PLACE] = (Value(merged, lead + (total,)), offset, strides)
        sizes = list(shape(n))
        lw.tid[n] = lw.new(n)
        lw.copy(merged, lw.tid[n], sizes, offset, strides, 0, contiguous_strides(sizes))
        offset += width
    return lw.tid[nodes[0]]


def _merged_or_none(lw, node):
    """The node's tensor id when it is one of several sibling projections (merged on the first
    one's lowering), else None."""
    if IN_PLACE in node.meta and node in lw.tid:
        return lw.tid[node]
    group = _siblings(lw, node)
    return None if group is None else _merged(lw, group)


@family.lowers(aten.linear.default, check=_linear_check)
def _linear(lw, node):
    merged = _merged_or_none(lw, node)
    if merged is not None:
        return merged
    args = arguments(node)
    x, weight, bias = args["input"], args["weight"], args["bias"]
    if lw.weights is not None:
        quantized = _quantized(lw, node, x, _constant(lw, weight), bias)
        if quantized is not None:
            return quantized
    out = lw.new(node)
    n, k = shape(weight)
    m = math.prod(shape(x)) // k
    lw.matmul(out, (lw.tensor(x), 0), (lw.tensor(weight), 1),
              -1 if bias is None else lw.tensor(bias), 1, m, n, k,
              bias_shape=() if bias is None else shape(bias), beta=1.0)
    return out
