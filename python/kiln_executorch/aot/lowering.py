"""The lowering driver: one partition (an edge-dialect ExportedProgram) -> Kiln IR (ir.Graph), the
C++ builder's input (backend.py builds the blob from it).

`_Lowering` walks the partition's graph once, in order. Each operator node goes to the lowering
its family module in ops/ registered for it, which emits IR ops through the helpers here
(tensor/operand/new, binary, unary, copy, strided_copy, matmul). While converting, the driver
evaluates every node whose inputs are all known ahead of time (constant folding: arange/full/
scalar_tensor, masks, transposed weights nobody reads in place); the family lowerings fold
eval-mode batch norm into the convolution before it (ops/normalization.py), read a transposed
operand of a matmul in place through trans_a/trans_b (ops/matmul.py) and turn a chain of permutes
into one copy (ops/views.py). Views (view/reshape/squeeze/unsqueeze/clone, and copies that move
nothing) cost no op: the IR gives them their own tensor with `alias_of`, and the writer points
their record at the root's storage and offset (arena offset, weight offset, or the same
input/output binding). The format allows several records over the same bytes, all of the same
size; an extra kCopy would cost a launch and memory traffic for nothing.

Delegate inputs are the partition's user-input placeholders in graph-signature order, which is the
order ExecuTorch passes them to the delegate (executorch_call_delegate's args); parameters,
buffers and lifted constants tagged into the partition become weights. Outputs follow the
partition's output node.

Mutated buffers tagged into the partition (the partitioner does this for KV caches) become kState
tensors that start as the buffer's value at export; the index_put that updates one is a kIndexPut
writing the state in place, and its result is the state itself. The partition's BUFFER_MUTATION
outputs are therefore not delegate outputs: each must be the state it names.
"""

import math
import operator

import torch
from torch.export.graph_signature import InputKind, OutputKind

from ..quantize import quantize
from .blob_format import BinaryKind, Epilogue, Opcode, Precision, Storage
from .ir import Graph
from .ops import OPS, SHAPE_ONLY, UNINITIALIZED
from .ops.matmul import IN_PLACE
from .ops.common import (KilnLoweringError, Value, aten_op, broadcast_strides, coalesce,
                         contiguous_strides, uniform, val)
from .ops.common import dtype as _dtype, shape as _shape

__all__ = ["KilnLoweringError", "Value", "lower_graph"]


def lower_graph(edge_program, precision=Precision.FP32, weights=None,
                merge_one_row=True) -> Graph:
    """Edge program of one partition -> lowered, unplanned Kiln IR (the C++ builder's input).
    weights: None, or a quantize.SCHEMES name for the matmuls whose weight is a constant.
    merge_one_row: merge every projection of a one-row input (ops/matmul.py); off for the
    variants of a variant set, whose weights are stored once only when every variant has the
    same (a one-row variant would carry concatenated copies)."""
    g = _Lowering(edge_program, weights, merge_one_row).run()
    g.precision = precision
    return g


# Binary kinds whose operands may swap (the second is the kind after swapping).
_SWAPPED = {BinaryKind.ADD: BinaryKind.ADD, BinaryKind.MUL: BinaryKind.MUL,
            BinaryKind.MAXIMUM: BinaryKind.MAXIMUM, BinaryKind.MINIMUM: BinaryKind.MINIMUM,
            BinaryKind.EQ: BinaryKind.EQ, BinaryKind.NE: BinaryKind.NE,
            BinaryKind.LT: BinaryKind.GT, BinaryKind.GT: BinaryKind.LT,
            BinaryKind.LE: BinaryKind.GE, BinaryKind.GE: BinaryKind.LE,
            BinaryKind.LOGICAL_AND: BinaryKind.LOGICAL_AND,
            BinaryKind.LOGICAL_OR: BinaryKind.LOGICAL_OR}


class _Lowering:
    """Walks the partition's graph once, in order, emitting IR ops for each node."""

    def __init__(self, ep, weights=None, merge_one_row=True):
        self.ep = ep
        self.weights = weights   # quantization of constant matmul weights (ops/matmul.py)
        self.merge_one_row = merge_one_row   # ops/matmul.py's one-row sibling merges
        self.g = Graph()
        self.tid = {}        # fx node -> tensor id (a tuple for multi-output ops)
        self.const = {}      # fx node -> its value, known ahead of time
        self.producer = {}   # fx node -> the op that computes it (for folding into that op)

    def run(self):
        # ops/matmul.py marks merged projections in node.meta while this lowering runs.
        self._clear_marks()
        try:
            return self._run()
        finally:
            self._clear_marks()

    def _clear_marks(self):
        for node in self.ep.graph.nodes:
            node.meta.pop(IN_PLACE, None)

    def _run(self):
        sig = self.ep.graph_signature
        user_inputs = list(sig.user_inputs)
        specs = {s.arg.name: s for s in sig.input_specs if s.kind != InputKind.USER_INPUT}
        mutated = set(sig.buffers_to_mutate.values())
        states = {}
        for node in self.ep.graph.nodes:
            if node.op == "placeholder":
                spec = specs.get(node.name)
                if spec is not None and spec.kind == InputKind.BUFFER and spec.target in mutated:
                    self.tid[node] = states[spec.target] = self.g.add_state(
                        self._state(spec), name=spec.target)
                    continue
                if spec is not None:
                    self.const[node] = self._state(spec)
                    continue
                v = val(node)
                if not isinstance(v, torch.Tensor):
                    raise KilnLoweringError(f"delegate input {node.name} is not a tensor")
                tid = self.g.add_tensor(v.dtype, v.shape, storage=Storage.INPUT,
                                        offset=user_inputs.index(node.name), name=node.name)
                self.tid[node] = tid
                self.g.inputs.append(tid)
            elif node.op == "call_function":
                self._lower(node)
            elif node.op == "output":
                self._outputs(node.args[0], sig.output_specs, states)
        return self.g

    def _outputs(self, values, specs, states):
        if len(values) != len(specs):
            raise KilnLoweringError(f"{len(values)} outputs but {len(specs)} output specs")
        for n, spec in zip(values, specs):
            if spec.kind != OutputKind.BUFFER_MUTATION:
                self.g.outputs.append(self.tensor(n))
                continue
            state = states.get(spec.target)
            if state is None or self.g.root(self.tensor(n)) != state:
                raise KilnLoweringError(f"buffer {spec.target} takes the value of {n.name}, which "
                                        "is not the buffer updated in place")

    def _state(self, spec):
        target = spec.target
        data = self.ep.state_dict[target] if target in self.ep.state_dict else \
            self.ep.constants[target]
        return data.detach()

    def _lower(self, node):
        if node.target is operator.getitem:
            src, i = node.args
            if src in self.const:
                self.const[node] = self.const[src][i]
            elif self.tid[src][i] is None:
                raise KilnLoweringError(f"{node.name}: output {i} of {src.name} is not computed")
            else:
                self.tid[node] = self.tid[src][i]
            return
        op = aten_op(node)
        if op not in OPS:
            raise KilnLoweringError(f"{node.name}: {op} is not supported by Kiln")
        inputs = node.all_input_nodes
        if OPS[op].lower is None or all(n in self.const for n in inputs):
            self.const[node] = self._evaluate(node)
            return
        self.tid[node] = OPS[op].lower(self, node)

    def _evaluate(self, node):
        """Runs the node with torch on its constant inputs. The only ops that get here with a
        non-constant input are the shape-only ones (full_like, ...): it gets a placeholder. An
        uninitialized tensor (empty) is zeros: a fill, never a weight of whatever memory held."""
        if UNINITIALIZED in OPS[aten_op(node)].traits:
            return torch.zeros(_shape(node), dtype=_dtype(node))
        def value(n):
            if n in self.const:
                return self.const[n]
            assert SHAPE_ONLY in OPS[aten_op(node)].traits, node
            return torch.empty(_shape(n), dtype=_dtype(n))
        args = torch.fx.node.map_arg(node.args, value)
        kwargs = torch.fx.node.map_arg(node.kwargs, value)
        out = node.target(*args, **kwargs)
        return tuple(out) if isinstance(out, (tuple, list)) else out.contiguous()

    # Operands.

    def tensor(self, node):
        """Tensor id for a node's value; a constant becomes a weight the first time it is needed.
        A computed constant (full, full_like, ...) with more than one element, all equal, is
        written by kFill instead: bytes the engine can generate are not stored in the blob."""
        if isinstance(node, Value):
            return node.tid
        if node not in self.tid:
            c = self.const[node]
            value = uniform(c) if c.numel() > 1 and node.op == "call_function" else None
            if value is None:
                self.tid[node] = self.g.add_weight(c, name=node.name)
            else:
                self.tid[node] = self.g.add_tensor(c.dtype, c.shape, name=node.name)
                self.g.add_op(Opcode.FILL, out=self.tid[node], value=value)
        return self.tid[node]

    def new(self, node, dtype=None, shape=None):
        return self.g.add_tensor(dtype or _dtype(node), _shape(node) if shape is None else shape,
                                 name=node.name)

    def operand(self, x, broadcast_scalar=False):
        """(tensor id, shape) of an elementwise operand: an fx node, a constant tensor, an IR
        tensor (`Value`) or a number. A number, or a constant whose elements are all equal, is
        (None, value) for a kBinary scalar, or with broadcast_scalar a one-element weight read
        with zero strides."""
        if isinstance(x, Value):
            return x.tid, x.shape
        node = x if isinstance(x, torch.fx.Node) else None
        if node is not None:
            if node not in self.const:
                return self.tensor(node), _shape(node)
            x = self.const[node]
        elif not isinstance(x, torch.Tensor):
            x = torch.tensor(x, dtype=torch.float32)
        value = uniform(x)
        if value is None:
            return (self.tensor(node) if node is not None else self.g.add_weight(x)), x.shape
        if broadcast_scalar:
            return self.g.add_weight(torch.tensor(value, dtype=x.dtype)), ()
        return None, value

    def binary(self, kind, a, b, out_shape, out_dtype, alpha=1.0, name=""):
        (ta, sa), (tb, sb) = self.operand(a), self.operand(b)
        if ta is None:
            if tb is not None and kind in _SWAPPED and alpha == 1:
                kind, (ta, sa), (tb, sb) = _SWAPPED[kind], (tb, sb), (ta, sa)
            else:
                ta, sa = self.operand(a, broadcast_scalar=True)
        out = self.g.add_tensor(out_dtype, out_shape, name=name)
        scalar = sb if tb is None else 0.0
        a_strides = broadcast_strides(sa, out_shape)
        b_strides = broadcast_strides(sb, out_shape) if tb is not None else [0] * len(out_shape)
        sizes, (a_strides, b_strides, _) = coalesce(out_shape, a_strides, b_strides,
                                                    contiguous_strides(out_shape))
        self.g.add_op(Opcode.BINARY, kind=kind, a=ta, b=-1 if tb is None else tb, out=out,
                      alpha=float(alpha), scalar=float(scalar), rank=len(sizes), sizes=sizes,
                      a_strides=a_strides, b_strides=b_strides)
        return out

    def unary(self, node, kind, p0=0.0, p1=0.0, x=None):
        """kUnary into the node's value, of its first argument or of the IR tensor `x`."""
        source = self.tensor(node.args[0]) if x is None else x
        return self.unary_of(kind, source, _shape(node), _dtype(node), p0, p1, node.name)

    def unary_of(self, kind, x, out_shape, out_dtype, p0=0.0, p1=0.0, name=""):
        """kUnary of the IR tensor `x` into a new tensor (a step inside one node's lowering)."""
        out = self.g.add_tensor(out_dtype, out_shape, name=name)
        self.g.add_op(Opcode.UNARY, kind=kind, x=x, out=out, p0=float(p0), p1=float(p1))
        return out

    def copy(self, x, out, sizes, in_offset, in_strides, out_offset, out_strides):
        sizes, (in_strides, out_strides) = coalesce(sizes, in_strides, out_strides)
        self.g.add_op(Opcode.COPY, x=x, out=out, rank=len(sizes), sizes=sizes,
                      in_offset=in_offset, in_strides=in_strides, out_offset=out_offset,
                      out_strides=out_strides)

    def strided_copy(self, node, in_offset, in_strides, source=None):
        """The node's value as a strided read of `source` (default: its first argument); a view
        when that read is all of the source's elements in order (a prefix, e.g. x[0], is copied:
        a view is the same bytes, no fewer)."""
        x, shape = self.tensor(node.args[0] if source is None else source), _shape(node)
        sizes, (strides,) = coalesce(shape, in_strides)
        if in_offset == 0 and all(s == 1 for s in strides) and len(sizes) <= 1 and \
                math.prod(shape) == self.g.tensors[x].numel:
            return self.g.add_alias(x, shape, name=node.name)
        out = self.new(node)
        self.copy(x, out, shape, in_offset, in_strides, 0, contiguous_strides(shape))
        return out

    def quant_matmul(self, out, x, weight, bias, M, name=""):
        """kQuantMatmul of x [M, K] (tensor id) with the constant `weight` [N, K], quantized as
        self.weights says; bias: a tensor id of N elements, or -1."""
        packed, scales, bits, group = quantize(weight, self.weights)
        N, K = weight.shape
        w = self.g.add_weight(packed, name=name + "_q")
        s = self.g.add_weight(scales, name=name + "_scales")
        return self.g.add_op(Opcode.QUANT_MATMUL, x=x, weight=w, scales=s, bias=bias, out=out,
                             M=M, N=N, K=K, bits=bits, group_size=group,
                             epilogue=Epilogue.NONE, residual=-1)

    def matmul(self, out, a, b, bias, batch, M, N, K, bias_shape=(), alpha=1.0, beta=0.0,
               a_batch=0, b_batch=0):
        (ta, trans_a), (tb, trans_b) = a, b
        row, col = broadcast_strides(bias_shape, (M, N)) if bias >= 0 else (0, 0)
        return self.g.add_op(Opcode.MATMUL, a=ta, b=tb, bias=bias, out=out, batch=batch, M=M,
                             N=N, K=K, trans_a=trans_a, trans_b=trans_b, a_batch_stride=a_batch,
                             b_batch_stride=b_batch, bias_row_stride=row, bias_col_stride=col,
                             alpha=float(alpha), beta=float(beta), epilogue=Epilogue.NONE,
                             residual=-1)
