"""The one table of edge operators Kiln runs, with the argument conditions for each.

`SUPPORTED_OPS` maps an ATen overload to a check: check(node, ctx) returns None when Kiln can run
that node, or a sentence saying why not. `check_node` applies the conditions every node shares
(symbolic sizes bounded so that one plan per size fits under MAX_VARIANTS, dtypes, contiguous dim
order, rank) and then the operator's own. The partitioner
asks `check_node` about each node; the lowering (lowering.py) has one converter per entry here, and
a test keeps the two key sets equal.

`ctx.is_constant(node)` says whether a value is known ahead of time (parameters, buffers, lifted
constants and what is computed from them only); constant nodes are evaluated by the builder.
"""

import math
import operator

import torch
from .blob_format import DTYPES, MAX_RANK
from .dynamic import is_sym_node, node_symbols, variant_count

aten = torch.ops.aten

FLOAT = (torch.float32, torch.float16, torch.bfloat16)
INT = (torch.int32, torch.int64)
ALL_DTYPES = tuple(DTYPES)      # what a TensorRecord can declare


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


def _tensors(value):
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _tensors(v)]
    return []


def _dtype(node):
    return val(node).dtype


def _is_contiguous(t):
    return t.is_contiguous() or t.numel() <= 1


# Conditions every node shares.

def _common(node, ctx):
    outputs = _tensors(val(node))
    if not outputs:
        return "no tensor metadata on the node"
    inputs = [t for a in node.all_input_nodes for t in _tensors(val(a))]
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
        if not _is_contiguous(t):
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


# Helpers for the per-operator checks.

def _floating_input(node, ctx):
    x = node.args[0]
    if _dtype(x) not in FLOAT:
        return f"input dtype {_dtype(x)}: this operator runs on floating tensors only"
    return None


def _numeric_input(node, ctx):
    if _dtype(node.args[0]) == torch.bool:
        return "Bool input: this operator runs on numbers only"
    return None


def _any_input(node, ctx):
    return None


def _only_first_output_used(node, what):
    for user in node.users:
        if user.target is not operator.getitem or user.args[1] != 0:
            return f"{what} is used; Kiln computes only the first output"
    return None


def _arithmetic(node, ctx):
    b = node.args[1]
    if _dtype(node) == torch.bool:
        return "arithmetic with a Bool result"
    if not isinstance(b, (torch.fx.Node, int, float, bool)):
        return f"operand {b!r} is not a tensor or a number"
    alpha = arguments(node).get("alpha", 1)
    if not isinstance(alpha, (int, float)):
        return f"alpha {alpha!r} is not a number"
    return None


def _division(node, ctx):
    mode = arguments(node).get("rounding_mode")
    if mode not in (None, "floor"):
        return f"rounding_mode={mode!r} (Kiln has true and floor division)"
    if mode is None and _dtype(node) not in FLOAT:
        return "true division with an integer result"
    return _arithmetic(node, ctx)


def _compare(node, ctx):
    b = node.args[1]
    if not isinstance(b, (torch.fx.Node, int, float, bool)):
        return f"operand {b!r} is not a tensor or a number"
    return None


def _bool_only(node, ctx):
    operands = [x for x in node.args[:2] if isinstance(x, torch.fx.Node)]
    if any(_dtype(x) != torch.bool for x in operands):
        return "bitwise operator: Bool operands only (run as logical and/or/not)"
    return None


def _pow_scalar(node, ctx):
    if not isinstance(node.args[1], (int, float)):
        return f"exponent {node.args[1]!r} is not a number"
    return _floating_input(node, ctx)


def _pow_tensor(node, ctx):
    if _dtype(node) not in FLOAT:
        return "integer power"
    return _arithmetic(node, ctx)


def _gelu(node, ctx):
    approximate = arguments(node)["approximate"]
    if approximate not in ("none", "tanh"):
        return f"gelu approximate={approximate!r}"
    return _floating_input(node, ctx)


def _clamp(node, ctx):
    args = arguments(node)
    for bound in (args["min"], args["max"]):
        if bound is not None and not isinstance(bound, (int, float)):
            return f"clamp bound {bound!r} is not a number (tensor bounds are not supported)"
    return _numeric_input(node, ctx)


def _matmul_dtypes(node, *operands):
    dtypes = {_dtype(x) for x in operands if isinstance(x, torch.fx.Node)} | {_dtype(node)}
    if len(dtypes) != 1 or not dtypes <= set(FLOAT):
        return f"matmul operands {sorted(map(str, dtypes))}: one floating dtype required"
    return None


def _mm(node, ctx):
    return _matmul_dtypes(node, node.args[0], node.args[1])


def _addmm(node, ctx):
    for name in ("alpha", "beta"):
        if not isinstance(arguments(node)[name], (int, float)):
            return f"{name} is not a number"
    bias = node.args[0]
    if val(bias).dim() > 2:
        return f"bias of rank {val(bias).dim()}"
    return _matmul_dtypes(node, *node.args[:3])


def _linear(node, ctx):
    if val(node.args[1]).dim() != 2:
        return "linear weight is not 2-D"
    return _matmul_dtypes(node, *node.args[:3])


def _cat(node, ctx):
    dtypes = {_dtype(t) for t in node.args[0]}
    if dtypes != {_dtype(node)}:
        return f"cat of mixed dtypes {sorted(map(str, dtypes))}"
    return None


def _slice(node, ctx):
    step = arguments(node)["step"]
    if not isinstance(step, int) or step < 1:
        return f"slice step {step!r}"
    return None


def _contiguous_layout(node, ctx):
    memory_format = arguments(node).get("memory_format")
    if memory_format not in (None, torch.contiguous_format, torch.preserve_format):
        return f"memory_format={memory_format}"
    return _dim_order(node, ctx)


def _dim_order(node, ctx):
    dim_order = arguments(node).get("dim_order")
    if dim_order is not None and list(dim_order) != list(range(val(node).dim())):
        return f"dim order {list(dim_order)}: Kiln keeps tensors contiguous (dim order 0..n-1)"
    return None


def _softmax(node, ctx):
    if arguments(node)["half_to_float"]:
        return "half_to_float=True"
    return _floating_input(node, ctx)


def _layer_norm(node, ctx):
    return _only_first_output_used(node, "mean/rstd") or _floating_input(node, ctx)


def _batch_norm(node, ctx):
    args = arguments(node)
    x = args["input"]
    if val(x).dim() < 2:
        return "batch norm input of rank < 2"
    for name in ("weight", "bias", "running_mean", "running_var"):
        p = args[name]
        if p is not None and not ctx.is_constant(p):
            return f"{name} is not a constant (Kiln folds batch norm statistics ahead of time)"
    return _only_first_output_used(node, "save_mean/save_invstd") or _floating_input(node, ctx)


def _convolution(node, ctx):
    args = arguments(node)
    x, weight = args["input"], args["weight"]
    if args["transposed"]:
        return "transposed convolution"
    if val(x).dim() != 4 or val(weight).dim() != 4:
        return f"{val(x).dim() - 2}-D convolution: Kiln runs 2-D only"
    return _matmul_dtypes(node, x, weight, args["bias"])


def _pool_input(node, ctx):
    if val(node.args[0]).dim() != 4:
        return "pooling input is not NCHW (rank 4)"
    return _floating_input(node, ctx)


def _max_pool(node, ctx):
    return _only_first_output_used(node, "the indices output") or _pool_input(node, ctx)


def _avg_pool(node, ctx):
    if arguments(node)["divisor_override"] is not None:
        return "divisor_override"
    return _pool_input(node, ctx)


def _sum_mean(node, ctx):
    dtype = arguments(node)["dtype"]
    if dtype not in (None, _dtype(node)):
        return f"dtype={dtype}"
    if aten_op(node) == aten.mean.dim:
        return _floating_input(node, ctx)
    return None


def _embedding(node, ctx):
    weight, indices = node.args[:2]
    if val(weight).dim() != 2:
        return "embedding weight is not 2-D"
    if _dtype(indices) not in INT:
        return f"indices dtype {_dtype(indices)}"
    return None if _dtype(weight) in FLOAT else f"embedding weight dtype {_dtype(weight)}"


def _index_put(node, ctx):
    """The KV-cache write: rows of a mutated buffer replaced at positions a 1-D integer tensor
    gives along one dim, the result being the buffer's new value. Kiln then owns the buffer as
    state on the device (the partitioner tags it into the partition)."""
    args = arguments(node)
    state, indices, values = args["self"], args["indices"], args["values"]
    if args["accumulate"]:
        return "index_put with accumulate=True (Kiln replaces rows, it does not add to them)"
    update = getattr(ctx, "buffer_update", None)
    if update is None or update(state) is not node:
        return ("index_put whose result is not the new value of the program buffer it indexes: "
                "Kiln runs index_put only as an in-place state update (e.g. a KV cache)")
    if len(state.users) != 1:
        return (f"buffer {state.name} is also read before its update; Kiln writes it in place, so "
                "every reader must read the updated value")
    tensors = [(d, i) for d, i in enumerate(indices) if i is not None]
    if len(tensors) != 1:
        return f"index_put with {len(tensors)} index tensors: Kiln writes along exactly one dim"
    dim, positions = tensors[0]
    if not isinstance(positions, torch.fx.Node) or val(positions).dim() != 1 or \
            _dtype(positions) not in INT:
        return "the positions must be a 1-D Int64 or Int32 tensor"
    if not isinstance(values, torch.fx.Node):
        return f"values {values!r} is not a tensor"
    target = list(val(state).shape)
    target[dim] = val(positions).shape[0]
    shape = tuple(val(values).shape)
    if _dtype(values) != _dtype(state):
        return f"values dtype {_dtype(values)} differs from the buffer's {_dtype(state)}"
    if math.prod(shape) != math.prod(target) or \
            tuple(torch.broadcast_shapes(shape, tuple(target))) != tuple(target):
        return f"values of shape {list(shape)} for rows of shape {target} (no broadcasting)"
    return None


def _constant_only(node, ctx):
    """Creation ops: Kiln computes them ahead of time, which static shapes always allow."""
    return None


# The table. Grouped as the lowering groups them.
ELEMENTWISE_BINARY = {
    aten.add.Tensor: _arithmetic, aten.add.Scalar: _arithmetic,
    aten.sub.Tensor: _arithmetic, aten.sub.Scalar: _arithmetic,
    aten.mul.Tensor: _arithmetic, aten.mul.Scalar: _arithmetic,
    aten.div.Tensor: _division, aten.div.Scalar: _division, aten.div.Tensor_mode: _division,
    aten.remainder.Tensor: _arithmetic, aten.remainder.Scalar: _arithmetic,
    aten.maximum.default: _arithmetic, aten.minimum.default: _arithmetic,
    aten.pow.Tensor_Tensor: _pow_tensor,
    aten.eq.Tensor: _compare, aten.eq.Scalar: _compare,
    aten.ne.Tensor: _compare, aten.ne.Scalar: _compare,
    aten.lt.Tensor: _compare, aten.lt.Scalar: _compare,
    aten.le.Tensor: _compare, aten.le.Scalar: _compare,
    aten.gt.Tensor: _compare, aten.gt.Scalar: _compare,
    aten.ge.Tensor: _compare, aten.ge.Scalar: _compare,
    aten.logical_and.default: _compare, aten.logical_or.default: _compare,
    aten.bitwise_and.Tensor: _bool_only, aten.bitwise_or.Tensor: _bool_only,
    aten.where.self: _any_input,
}
ELEMENTWISE_UNARY = {
    aten.relu.default: _numeric_input,
    aten.gelu.default: _gelu,
    aten.sigmoid.default: _floating_input,
    aten.tanh.default: _floating_input,
    aten.silu.default: _floating_input,
    aten.exp.default: _floating_input,
    aten.log.default: _floating_input,
    aten.cos.default: _floating_input,
    aten.sin.default: _floating_input,
    aten.rsqrt.default: _floating_input,
    aten.sqrt.default: _floating_input,
    aten.erf.default: _floating_input,
    aten.erfinv.default: _floating_input,
    aten.reciprocal.default: _floating_input,
    aten.neg.default: _numeric_input,
    aten.abs.default: _numeric_input,
    aten.hardswish.default: _floating_input,
    aten.hardsigmoid.default: _floating_input,
    aten.leaky_relu.default: _floating_input,
    aten.pow.Tensor_Scalar: _pow_scalar,
    aten.clamp.default: _clamp,
    aten.hardtanh.default: _floating_input,
    aten.logical_not.default: _any_input,
    aten.bitwise_not.default: _bool_only,
}
MATMUL = {
    aten.mm.default: _mm,
    aten.bmm.default: _mm,
    aten.addmm.default: _addmm,
    aten.linear.default: _linear,
}
# Views of contiguous tensors: no data moves, the result shares its input's storage.
VIEWS = {
    aten.view_copy.default: _any_input,
    aten.squeeze_copy.default: _any_input,
    aten.squeeze_copy.dim: _any_input,
    aten.squeeze_copy.dims: _any_input,
    aten.unsqueeze_copy.default: _any_input,
    aten.clone.default: _contiguous_layout,
    torch.ops.dim_order_ops._clone_dim_order.default: _contiguous_layout,
}
DATA_MOVEMENT = {
    aten.permute_copy.default: _any_input,
    aten.transpose_copy.int: _any_input,
    aten.t_copy.default: _any_input,
    aten.expand_copy.default: _any_input,
    aten.slice_copy.Tensor: _slice,
    aten.select_copy.int: _any_input,
    aten.cat.default: _cat,
    torch.ops.dim_order_ops._to_dim_order_copy.default: _contiguous_layout,
}
NORMALIZATION = {
    aten._softmax.default: _softmax,
    aten._log_softmax.default: _softmax,
    aten.native_layer_norm.default: _layer_norm,
    aten._native_batch_norm_legit_no_training.default: _batch_norm,
}
SPATIAL = {
    aten.convolution.default: _convolution,
    aten.max_pool2d_with_indices.default: _max_pool,
    aten.avg_pool2d.default: _avg_pool,
}
REDUCTIONS = {
    aten.mean.dim: _sum_mean,
    aten.sum.dim_IntList: _sum_mean,
    aten.amax.default: _numeric_input,
    aten.amin.default: _numeric_input,
    aten.any.default: _any_input,
    aten.any.dim: _any_input,
    aten.any.dims: _any_input,
}
EMBEDDING = {aten.embedding.default: _embedding}
# Writes into program state (mutated buffers the delegate owns).
STATE_UPDATES = {aten.index_put.default: _index_put}
# Evaluated by the builder and stored as constants; never an op in the blob.
CONSTANT_ONLY = {
    aten.full.default: _constant_only,
    aten.full_like.default: _constant_only,
    aten.zeros.default: _constant_only,
    aten.zeros_like.default: _constant_only,
    aten.ones.default: _constant_only,
    aten.ones_like.default: _constant_only,
    aten.scalar_tensor.default: _constant_only,
    aten.arange.default: _constant_only,
    aten.arange.start: _constant_only,
    aten.arange.start_step: _constant_only,
}
# Results that depend on the shape and dtype of their input, never on its values.
SHAPE_ONLY = {aten.full_like.default, aten.zeros_like.default, aten.ones_like.default}

SUPPORTED_OPS = {**ELEMENTWISE_BINARY, **ELEMENTWISE_UNARY, **MATMUL, **VIEWS, **DATA_MOVEMENT,
                 **NORMALIZATION, **SPATIAL, **REDUCTIONS, **EMBEDDING, **STATE_UPDATES,
                 **CONSTANT_ONLY}

# The reason explain() gives for a node the user kept out of Kiln.
EXCLUDED = "excluded by KilnPartitioner(exclude_ops=...); ExecuTorch runs it"

# Deliberately absent, with the reason explain() gives.
NOT_SUPPORTED = {
    aten.copy_.default: "copy_ writes back program state after the graph (to_executorch adds it); "
                        "Kiln updates the state it owns with index_put",
}


def unsupported_reason(node):
    op = aten_op(node)
    return NOT_SUPPORTED.get(op, f"{op} is not in Kiln's operator table")
