"""Which edge nodes Kiln runs, and why not when it does not.

The operators and their own conditions live in the registry of ops/ (one family module per kind
of operator, each overload registered once with its check and its lowering); this module derives
the tables the partitioner and the lowering read from it, and adds the conditions every node
shares. `check_node` applies those (symbolic sizes bounded so that one plan per size fits under
MAX_VARIANTS, dtypes, contiguous dim order, rank) and then the operator's own check:
check(node, ctx) returns None when Kiln can run that node, or a sentence saying why not.

`ctx.is_constant(node)` says whether a value is known ahead of time (parameters, buffers, lifted
constants and what is computed from them only); constant nodes are evaluated by the builder.
"""

import operator

from . import ops
from .blob_format import MAX_RANK
from .dynamic import is_sym_node, node_symbols, variant_count
from .ops import NOT_SUPPORTED, OPS, with_trait
from .ops.common import ALL_DTYPES, aten_op, arguments, is_contiguous, tensors, val

# The check of every operator Kiln runs, and the groups of them the partitioner and the lowering
# treat apart; all derived from ops.OPS.
SUPPORTED_OPS = {op: d.check for op, d in OPS.items()}
CONSTANT_ONLY = with_trait(ops.CONSTANT)      # evaluated by the lowering, never an op in the blob
SHAPE_ONLY = with_trait(ops.SHAPE_ONLY)       # depend on their input's shape and dtype only
VIEWS = with_trait(ops.VIEW)                  # no data moves: the result shares its input's storage
STATE_UPDATES = with_trait(ops.STATE_UPDATE)  # write program state the delegate owns

# The reason explain() gives for a node the user kept out of Kiln.
EXCLUDED = "excluded by KilnPartitioner(exclude_ops=...); ExecuTorch runs it"

__all__ = ["CONSTANT_ONLY", "EXCLUDED", "NOT_SUPPORTED", "SHAPE_ONLY", "STATE_UPDATES",
           "SUPPORTED_OPS", "VIEWS", "arguments", "aten_op", "check_node", "unsupported_reason",
           "val"]


def _common(node, ctx):
    """Conditions every node shares."""
    outputs = tensors(val(node))
    if not outputs:
        return "no tensor metadata on the node"
    inputs = [t for a in node.all_input_nodes for t in tensors(val(a))]
    symbols = node_symbols(node)
    if symbols:
        _, why = variant_count(symbols, getattr(ctx, "range_constraints", None))
        if why:
            return why
    for t in outputs + inputs:
        if t.dtype not in ALL_DTYPES:
            return f"dtype {t.dtype} is not one Kiln stores"
        if t.dim() > MAX_RANK:
            return f"rank {t.dim()} exceeds {MAX_RANK}"
        if not is_contiguous(t):
            return (f"non-contiguous tensor (strides {list(t.stride())}): Kiln needs dim order "
                    "0..n-1")
    return None


def check_node(node, ctx):
    """(supported, reason) for one fx node of an edge graph. `ctx.excluded_ops`, when present,
    holds ATen overloads the user keeps out of Kiln (KilnPartitioner(exclude_ops=...))."""
    if node.op != "call_function":
        return False, f"{node.op} nodes are not operators"
    if node.target is operator.getitem:
        return check_node(node.args[0], ctx)[0], "follows the node it reads"
    if aten_op(node) in getattr(ctx, "excluded_ops", ()):
        return False, f"{aten_op(node)} is {EXCLUDED}"
    if is_sym_node(node):
        _, why = variant_count(node_symbols(node), getattr(ctx, "range_constraints", None))
        return (False, why) if why else (True, "computes a size of a shape-specialised plan")
    check = SUPPORTED_OPS.get(aten_op(node))
    if check is None:
        return False, unsupported_reason(node)
    why = _common(node, ctx) or check(node, ctx)
    return (False, why) if why else (True, "supported")


def unsupported_reason(node):
    op = aten_op(node)
    return NOT_SUPPORTED.get(op, f"{op} is not in Kiln's operator table")
