"""Bounded dynamic dimensions: one shape-specialised plan per assignment of a partition's symbols.

A program exported with `dynamic_shapes` carries symbolic sizes (sympy symbols such as s77) in its
nodes' metadata and SymInt-valued nodes (sym_size, arithmetic on sizes) that feed view sizes and
slice bounds. Kiln's engine runs static plans, so a partition with symbols is lowered once per
assignment of its symbols within the program's range constraints (all combinations, at most
MAX_VARIANTS), each time over a copy of its graph where every symbolic size is replaced by its
value. The C++ builder turns the lowerings into one variant set (builder.build_variant_set).
"""

import itertools
import math
import operator
from types import SimpleNamespace

import sympy
import torch
from torch.fx.experimental.symbolic_shapes import free_symbols

from .blob_format import MAX_VARIANTS

# Arithmetic on sizes that export records as call_function nodes with a SymInt value.
SYM_OPS = {operator.mul, operator.add, operator.sub, operator.floordiv, operator.mod,
           operator.neg, torch.ops.aten.sym_size.int, torch.ops.aten.sym_numel.default}


def _values(value):
    if isinstance(value, (list, tuple)):
        return [x for v in value for x in _values(v)]
    return [value]


def node_symbols(node):
    """The free symbols of a node's value (tensor shapes and strides, or a SymInt) and of the
    values of the nodes it reads."""
    found = set()
    for n in [node] + list(node.all_input_nodes):
        for v in _values(n.meta.get("val")):
            if isinstance(v, torch.Tensor):
                found |= free_symbols(v.shape) | free_symbols(v.stride())
            elif isinstance(v, torch.SymInt):
                found |= free_symbols(v)
    return found


def is_sym_node(node):
    """A node that computes a size (sym_size, size arithmetic), not a tensor."""
    return node.op == "call_function" and node.target in SYM_OPS and \
        isinstance(node.meta.get("val"), (torch.SymInt, int)) and \
        not isinstance(node.meta.get("val"), bool)


def symbol_range(symbol, range_constraints):
    """(low, high) of a symbol, or a sentence saying why it cannot be enumerated.

    torch's tracing specialises sizes 0 and 1, so a dimension declared Dim(min=1) reaches the edge
    program with a range starting at 2; the traced graph is size-generic, so 1 is served too."""
    vr = range_constraints.get(symbol) if range_constraints else None
    if vr is None:
        return f"symbolic size {symbol} has no range constraint"
    try:
        low, high = int(vr.lower), int(vr.upper)
    except (TypeError, OverflowError, ValueError, AttributeError):  # an infinite bound
        return (f"symbolic size {symbol} has no finite upper bound ({vr}): give the dynamic Dim a "
                f"max so Kiln can build one plan per size")
    if high > 2 ** 31 or high - low + 1 > MAX_VARIANTS:
        return (f"symbolic size {symbol} ranges over {vr}: more than the {MAX_VARIANTS} "
                "shape-specialised plans Kiln builds per partition")
    return (1 if low == 2 else low), high


def variant_count(symbols, range_constraints):
    """(number of assignments, None) or (None, reason)."""
    count = 1
    for s in sorted(symbols, key=str):
        r = symbol_range(s, range_constraints)
        if isinstance(r, str):
            return None, r
        count *= r[1] - r[0] + 1
    if count > MAX_VARIANTS:
        names = ", ".join(sorted(map(str, symbols)))
        return None, (f"symbolic sizes {names} need {count} shape-specialised plans, more than "
                      f"the {MAX_VARIANTS} Kiln builds per partition")
    return count, None


def assignments(symbols, range_constraints):
    """Every {symbol: int} within the bounds, smallest sizes first."""
    symbols = sorted(symbols, key=str)
    ranges = []
    for s in symbols:
        r = symbol_range(s, range_constraints)
        if isinstance(r, str):
            raise ValueError(r)
        ranges.append(range(r[0], r[1] + 1))
    if math.prod(len(r) for r in ranges) > MAX_VARIANTS:
        raise ValueError(variant_count(set(symbols), range_constraints)[1])
    return [dict(zip(symbols, values)) for values in itertools.product(*ranges)]


def program_symbols(ep):
    return {s for n in ep.graph.nodes if n.op != "output" for s in node_symbols(n)}


def evaluate(value, assignment):
    """A SymInt (or a plain int) as an int under `assignment`."""
    if isinstance(value, torch.SymInt):
        expr = sympy.sympify(value.node.expr.xreplace(
            {k: sympy.Integer(v) for k, v in assignment.items()}))
        if expr.free_symbols:
            raise ValueError(f"size {value} depends on symbols {sorted(map(str, expr.free_symbols))}"
                             " outside the assignment")
        return int(expr)
    return int(value)


def _concrete(value, assignment):
    if isinstance(value, torch.Tensor):
        shape = [evaluate(n, assignment) for n in value.shape]
        stride = [evaluate(n, assignment) for n in value.stride()]
        return torch.empty_strided(shape, stride, dtype=value.dtype, device="meta")
    if isinstance(value, (list, tuple)):
        return type(value)(_concrete(v, assignment) for v in value)
    if isinstance(value, torch.SymInt):
        return evaluate(value, assignment)
    return value


def specialise(ep, assignment):
    """A stand-in for the partition's ExportedProgram with every symbolic size evaluated under
    `assignment`: node values become meta tensors of concrete shapes, and size-computing nodes are
    replaced by their values in the arguments of the nodes that read them. Carries what the
    lowering reads (graph, graph_signature, state_dict, constants)."""
    graph = torch.fx.Graph()
    env = {}
    for node in ep.graph.nodes:
        env[node] = graph.node_copy(node, lambda n: env[n])
    sizes = {}
    for node in list(graph.nodes):
        node.meta = dict(node.meta)
        if is_sym_node(node):
            sizes[node] = evaluate(node.meta["val"], assignment)
            continue
        if "val" in node.meta:
            node.meta["val"] = _concrete(node.meta["val"], assignment)
    for node in graph.nodes:
        if sizes and node not in sizes:
            node.args = torch.fx.node.map_arg(node.args, lambda n: sizes.get(n, n))
            node.kwargs = torch.fx.node.map_arg(node.kwargs, lambda n: sizes.get(n, n))
    for node in reversed(list(sizes)):
        graph.erase_node(node)
    return SimpleNamespace(graph=graph, graph_signature=ep.graph_signature,
                           state_dict=ep.state_dict, constants=ep.constants)
