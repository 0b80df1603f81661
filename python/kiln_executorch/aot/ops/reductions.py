"""Reductions over some or all dims: mean, sum, amax, amin, any (kReduce, one per run of
adjacent reduced dims); prefix sums along one dim (kCumsum)."""

import math

import torch

from ..blob_format import Opcode, ReduceKind
from .common import (any_input, aten_op, arguments, dtype, floating_input, numeric_input, shape,
                     wrap_dim)
from .registry import Family

aten = torch.ops.aten
family = Family(__name__)


def _sum_mean_check(node, ctx):
    want = arguments(node)["dtype"]
    if want not in (None, dtype(node)):
        return f"dtype={want}"
    if aten_op(node) == aten.mean.dim:
        return floating_input(node, ctx)
    return None


def _reduce(lw, node, kind, dims):
    """Reduces `dims` (None or empty: all) of args[0]; one kReduce per run of adjacent dims."""
    x = node.args[0]
    sizes = list(shape(x))
    rank = len(sizes)
    dims = sorted({wrap_dim(d, rank) for d in dims}) if dims else list(range(rank))
    runs = []
    for d in dims:
        if runs and runs[-1][-1] == d - 1:
            runs[-1].append(d)
        else:
            runs.append([d])
    runs = runs or [[]]
    cur = lw.tensor(x)
    for i, run in enumerate(reversed(runs)):
        start, end = (run[0], run[-1] + 1) if run else (0, 0)
        reduced = math.prod(sizes[start:end])
        outer, inner = math.prod(sizes[:start]), math.prod(sizes[end:])
        sizes[start:end] = [1] * (end - start)
        out = lw.new(node) if i == len(runs) - 1 else lw.new(node, shape=sizes)
        lw.g.add_op(Opcode.REDUCE, kind=kind, x=cur, out=out, outer=outer, reduce=reduced,
                    inner=inner)
        cur = out
    return cur


def _reduction(kind):
    def lower(lw, node):
        dims = arguments(node).get("dim")
        return _reduce(lw, node, kind, [dims] if isinstance(dims, int) else dims)
    return lower


# {kind of the kReduce: the overloads lowered to it}, one table per check.
family.register_kinds(_sum_mean_check, _reduction,
                      {ReduceKind.MEAN: aten.mean.dim, ReduceKind.SUM: aten.sum.dim_IntList})
family.register_kinds(numeric_input, _reduction,
                      {ReduceKind.AMAX: aten.amax.default, ReduceKind.AMIN: aten.amin.default})
family.register_kinds(any_input, _reduction,
                      {ReduceKind.ANY: (aten.any.default, aten.any.dim, aten.any.dims)})


@family.lowers(aten.cumsum.default, check=any_input)
def _cumsum(lw, node):
    """cumsum(x, dim, dtype=None): integer and Bool inputs sum to int64 (torch's promotion), or to
    `dtype`; kCumsum sums in its operand's dtype, so a differing input is cast first."""
    x = node.args[0]
    sizes = list(shape(x))
    d = wrap_dim(arguments(node)["dim"], len(sizes)) if sizes else 0
    cur = lw.tensor(x)
    if dtype(x) != dtype(node):
        cast = lw.new(node)
        n = math.prod(sizes)
        lw.copy(cur, cast, [n], 0, [1], 0, [1])
        cur = cast
    out = lw.new(node)
    lw.g.add_op(Opcode.CUMSUM, x=cur, out=out, outer=math.prod(sizes[:d]),
                dim=sizes[d] if sizes else 1, inner=math.prod(sizes[d + 1:]))
    return out

