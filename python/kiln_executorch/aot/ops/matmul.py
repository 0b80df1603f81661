"""Matrix products: mm, bmm, addmm and linear, each one kMatmul. A transpose of the last two dims
of an operand is read in place through trans_a/trans_b instead of being copied."""

import math

import torch

from .common import arguments, matmul_dtypes, shape, val
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


@family.lowers(aten.mm.default, aten.bmm.default, check=_mm_check)
def _mm(lw, node):
    a, b = node.args[:2]
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
    bias, a, b = node.args[:3]
    out = lw.new(node)
    (m, k), n = shape(a), shape(node)[1]
    args = arguments(node)
    lw.matmul(out, _matrix(lw, a, 2), _matrix(lw, b, 2), lw.tensor(bias), 1, m, n, k,
              bias_shape=shape(bias), alpha=args["alpha"], beta=args["beta"])
    return out


@family.lowers(aten.linear.default, check=_linear_check)
def _linear(lw, node):
    args = arguments(node)
    x, weight, bias = args["input"], args["weight"], args["bias"]
    out = lw.new(node)
    n, k = shape(weight)
    m = math.prod(shape(x)) // k
    lw.matmul(out, (lw.tensor(x), 0), (lw.tensor(weight), 1),
              -1 if bias is None else lw.tensor(bias), 1, m, n, k,
              bias_shape=() if bias is None else shape(bias), beta=1.0)
    return out
