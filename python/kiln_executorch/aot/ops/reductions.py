"""Reductions over some or all dims: mean, sum, amax, amin, any (kReduce, one per run of
adjacent reduced dims); argmax / argmin and median along one dim or over everything (one
kReduce); prefix sums along one dim (kCumsum)."""

import math

import torch

from ..blob_format import BinaryKind, Opcode, ReduceKind, UnaryKind
from .common import (FLOAT, Value, any_input, aten_op, arguments, dtype, floating_input,
                     numeric_input, reads_output, shape, wrap_dim)
from .registry import Family

aten = torch.ops.aten
family = Family(__name__)


def _sum_mean_check(node, ctx):
    """sum / mean with dtype=: torch casts the input to it first (the lowering does too), so a
    mean of integers with a floating dtype runs; a Float64 one is refused by the dtype check."""
    want = arguments(node)["dtype"]
    if want not in (None, dtype(node)):
        return f"dtype={want}"
    if aten_op(node) == aten.mean.dim and (want or dtype(node.args[0])) not in FLOAT:
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
    want = arguments(node).get("dtype")
    if want is not None and want != dtype(x):   # sum / mean(x, dtype=d) reduce x.to(d)
        cur = lw.unary_of(UnaryKind.IDENTITY, cur, shape(x), want, name=f"{node.name}_as_{want}")
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


def _along_one_dim_check(node, ctx):
    """argmax / argmin / median: a number input and a non-empty axis (torch has no value for an
    empty one)."""
    x = node.args[0]
    if dtype(x) == torch.bool:
        return "Bool input: this operator runs on numbers only (as in torch)"
    dim = arguments(node).get("dim")
    sizes = shape(x)
    reduced = math.prod(sizes) if dim is None or not sizes else sizes[wrap_dim(dim, len(sizes))]
    if reduced == 0:
        return "a reduction over an empty axis"
    return None


def _along_one_dim(kind):
    def lower(lw, node):
        """argmax / argmin(x, dim=None, keepdim=False), median(x) and median(x, dim, keepdim):
        with dim, x viewed as [outer, dim, inner]; without, x flattened (an argmax then indexes
        the flattened tensor)."""
        x, dim = node.args[0], arguments(node).get("dim")
        sizes = list(shape(x))
        if dim is None or not sizes:
            outer, reduced, inner = 1, math.prod(sizes), 1
        else:
            d = wrap_dim(dim, len(sizes))
            outer, reduced, inner = math.prod(sizes[:d]), sizes[d], math.prod(sizes[d + 1:])
        out = lw.new(node)
        lw.g.add_op(Opcode.REDUCE, kind=kind, x=lw.tensor(x), out=out, outer=outer,
                    reduce=reduced, inner=inner)
        if aten_op(node) != aten.median.dim:
            return out
        indices = _median_indices(lw, node, out, (outer, reduced, inner)) \
            if reads_output(node, 1) else None
        return out, indices
    return lower


def _median_indices(lw, node, median, view):
    """median.dim's indices: the first position along the axis that holds the median (x == m),
    or, when the median is NaN, the first NaN (x != x: only an axis with a NaN has one), as the
    argmax of that mask. torch leaves which of equal elements it names unspecified."""
    x = lw.tensor(node.args[0])
    outer, reduced, inner = view
    kept = (outer, 1, inner)   # the median with the reduced axis kept, to broadcast against x
    x3, m3 = Value(lw.g.add_alias(x, view), view), Value(lw.g.add_alias(median, kept), kept)
    name = node.name
    equal = lw.binary(BinaryKind.EQ, x3, m3, view, torch.bool, name=f"{name}_at_median")
    nan = lw.binary(BinaryKind.NE, x3, x3, view, torch.bool, name=f"{name}_nan")
    hit = lw.binary(BinaryKind.LOGICAL_OR, Value(equal, view), Value(nan, view), view, torch.bool,
                    name=f"{name}_hit")
    # argmax reads numbers (torch has no Bool argmax): the mask as Int32.
    hit = lw.unary_of(UnaryKind.IDENTITY, hit, view, torch.int32, name=f"{name}_hit_int")
    indices = lw.g.add_tensor(torch.int64, lw.g.tensors[median].shape, name=f"{name}_indices")
    lw.g.add_op(Opcode.REDUCE, kind=ReduceKind.ARGMAX, x=hit, out=indices, outer=outer,
                reduce=reduced, inner=inner)
    return indices


family.register_kinds(_along_one_dim_check, _along_one_dim,
                      {ReduceKind.ARGMAX: aten.argmax.default,
                       ReduceKind.ARGMIN: aten.argmin.default})
family.register_kinds(_along_one_dim_check, _along_one_dim,
                      {ReduceKind.MEDIAN: (aten.median.default, aten.median.dim)})


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

