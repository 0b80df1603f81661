"""KilnBackend: lowers one partition (an edge-dialect ExportedProgram) to a Kiln engine blob.

    edge graph --_Lowering--> Kiln IR --C++ builder (builder.py)--> blob bytes

While converting, the lowering evaluates every node whose inputs are all known ahead of time
(constant folding: arange/full/scalar_tensor, masks, transposed weights nobody reads in place),
folds eval-mode batch norm into the convolution before it, reads a transposed operand of a
matmul in place through trans_a/trans_b (so addmm(b, x, permute(W)) reads W as stored), and
turns a chain of permutes into one copy. Views (view/reshape/squeeze/unsqueeze/clone, and copies
that move nothing) cost no op: the IR gives them their own tensor with `alias_of`, and the writer
points their record at the root's storage and offset (arena offset, weight offset, or the same
input/output binding). The format allows several records over the same bytes, all of the same
size; an extra kCopy would cost a launch and memory traffic for nothing.

Then the C++ builder (builder/, bound in builder.py) runs, in order: dead-op elimination;
residual-add and activation epilogue fusion into kMatmul (the bias is lowered into it); precision
conversion (fp16/bf16: floating weights and activations in the low dtype, kCopy casts at the
delegate's floating inputs and outputs so its I/O dtypes stay the graph's, erfinv's operand and
result kept float32 as torch.autocast runs it; tf32 only sets the header); elementwise-chain
fusion (kUnary/kBinary/kWhere chains into one kFusedElementwise kernel, after precision
conversion so each step keeps its op's rounding); binding of outputs to the runtime's output
memory; liveness-based best-fit planning of the arena (256-byte aligned).

A partition with bounded dynamic sizes is lowered once per assignment of its symbols (dynamic.py)
and the C++ builder turns the lowerings into one variant set; a static one is a plain blob.

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
from executorch.exir.backend.backend_details import BackendDetails, PreprocessResult
from torch.export.graph_signature import InputKind, OutputKind

from . import builder
from .blob_format import (BinaryKind, Epilogue, Opcode, PoolKind, Precision, ReduceKind, Storage,
                          UnaryKind)
from .blob_reader import read_blob
from .dynamic import assignments, program_symbols, specialise
from .ir import Graph, Op
from .supported_ops import CONSTANT_ONLY, SHAPE_ONLY, SUPPORTED_OPS, arguments, aten_op, val

aten = torch.ops.aten
dim_order_ops = torch.ops.dim_order_ops

PRECISIONS = {"fp32": Precision.FP32, "tf32": Precision.TF32, "fp16": Precision.FP16,
              "bf16": Precision.BF16}
PRECISION_SPEC = "precision"
# ExecuTorch's key for the device a delegate's data lives on (exir PropagateDevicePass).
TARGET_DEVICE_SPEC = "target_device"


class KilnLoweringError(RuntimeError):
    """A partition contains something the partitioner should not have given Kiln."""


class KilnBackend(BackendDetails):
    """The preprocess ExecuTorch calls for every partition tagged for "KilnBackend"; the runtime
    finds the delegate by this class's name."""

    @staticmethod
    def preprocess(edge_program, compile_specs):
        specs = {s.key: s.value for s in compile_specs}
        name = specs.get(PRECISION_SPEC, b"fp32").decode()
        if name not in PRECISIONS:
            raise ValueError(f"compile spec precision={name!r}; expected one of {list(PRECISIONS)}")
        if program_symbols(edge_program):
            return PreprocessResult(processed_bytes=build_variant_set(edge_program,
                                                                      PRECISIONS[name]))
        return PreprocessResult(processed_bytes=build_blob(edge_program, PRECISIONS[name]))


def lower_graph(edge_program, precision=Precision.FP32) -> Graph:
    """Edge program of one partition -> lowered, unplanned Kiln IR (the C++ builder's input)."""
    g = _Lowering(edge_program).run()
    g.precision = precision
    return g


def _passes(fuse):
    return builder.PASSES_ALL if fuse else builder.PASSES_ALL & ~builder.PASS_FUSE_ELEMENTWISE


def build_blob(edge_program, precision=Precision.FP32, fuse=True) -> bytes:
    """Edge program of one partition -> engine blob: lowered here, built by the C++ builder
    (fuse=False keeps every elementwise op its own kernel, the form fusion is checked against)."""
    return builder.build_blob(lower_graph(edge_program, precision), _passes(fuse))


def build_variant_set(edge_program, precision=Precision.FP32) -> bytes:
    """A partition with bounded dynamic sizes -> a variant set: the partition lowered once per
    assignment of its symbols and built (with every pass) by the C++ builder, each blob serving
    the delegate input shapes of its own lowering."""
    symbols = program_symbols(edge_program)
    ranges = getattr(edge_program, "range_constraints", None)
    return builder.build_variant_set([lower_graph(specialise(edge_program, a), precision)
                                      for a in assignments(symbols, ranges)])


def build_graph(edge_program, precision=Precision.FP32, fuse=True) -> Graph:
    """The built blob read back as IR (blob_reader.read_blob), for tests and tools: planned, with
    views as records over their root's storage and offset (alias_of and names are not kept)."""
    return read_blob(build_blob(edge_program, precision, fuse))


# Shapes and strides.

def _first(node):
    """The node's tensor value (the first one for multi-output operators)."""
    v = val(node)
    return v[0] if isinstance(v, (tuple, list)) else v


def _shape(node):
    return tuple(int(s) for s in _first(node).shape)


def _dtype(node):
    return _first(node).dtype


def _contiguous_strides(shape):
    strides, acc = [], 1
    for n in reversed(shape):
        strides.append(acc)
        acc *= n
    return strides[::-1]


def _broadcast_strides(shape, out_shape):
    """Strides that read a contiguous `shape` as `out_shape` (0 along broadcast dims)."""
    shape = (1,) * (len(out_shape) - len(shape)) + tuple(shape)
    return [s if n == o and n != 1 else 0
            for n, o, s in zip(shape, out_shape, _contiguous_strides(shape))]


def _coalesce(sizes, *strides):
    """Drops size-1 dims and merges dims every stride list walks as one; returns the fewest dims
    that index the same elements (for shorter kernels' index math)."""
    dims = []
    for d, n in enumerate(sizes):
        if n == 1:
            continue
        st = [s[d] for s in strides]
        if dims and all(ps == s * n for ps, s in zip(dims[-1][1], st)):
            dims[-1] = (dims[-1][0] * n, st)
        else:
            dims.append((n, st))
    return [n for n, _ in dims], [[st[i] for _, st in dims] for i in range(len(strides))]


def _dim(d, rank):
    return d + rank if d < 0 else d


def _pair(v):
    v = list(v) if isinstance(v, (list, tuple)) else [v]
    return v * 2 if len(v) == 1 else v


def _uniform(t):
    """The single value of a constant whose elements are all equal, else None."""
    if t.numel() == 0:
        return None
    first = t.reshape(-1)[0]
    return float(first) if bool((t == first).all()) else None


# Binary kinds whose operands may swap (the second is the kind after swapping).
_SWAPPED = {BinaryKind.ADD: BinaryKind.ADD, BinaryKind.MUL: BinaryKind.MUL,
            BinaryKind.MAXIMUM: BinaryKind.MAXIMUM, BinaryKind.MINIMUM: BinaryKind.MINIMUM,
            BinaryKind.EQ: BinaryKind.EQ, BinaryKind.NE: BinaryKind.NE,
            BinaryKind.LT: BinaryKind.GT, BinaryKind.GT: BinaryKind.LT,
            BinaryKind.LE: BinaryKind.GE, BinaryKind.GE: BinaryKind.LE,
            BinaryKind.LOGICAL_AND: BinaryKind.LOGICAL_AND,
            BinaryKind.LOGICAL_OR: BinaryKind.LOGICAL_OR}
_CLONES = {aten.clone.default, dim_order_ops._clone_dim_order.default}


class Value:
    """An IR tensor used as an operand where an fx node usually is."""

    def __init__(self, tid, shape):
        self.tid, self.shape = tid, tuple(shape)


class _Lowering:
    """Walks the partition's graph once, in order, emitting IR ops for each node."""

    def __init__(self, ep):
        self.ep = ep
        self.g = Graph()
        self.tid = {}        # fx node -> tensor id (a tuple for multi-output ops)
        self.const = {}      # fx node -> its value, known ahead of time
        self.producer = {}   # fx node -> the op that computes it (for folding into that op)

    def run(self):
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
        _split_conv_bias(self.g)
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
        if op not in SUPPORTED_OPS:
            raise KilnLoweringError(f"{node.name}: {op} is not supported by Kiln")
        inputs = node.all_input_nodes
        if op in CONSTANT_ONLY or all(n in self.const for n in inputs):
            self.const[node] = self._evaluate(node)
            return
        self.tid[node] = LOWERINGS[op](self, node)

    def _evaluate(self, node):
        """Runs the node with torch on its constant inputs. The only ops that get here with a
        non-constant input are the shape-only ones (full_like, ...): it gets a placeholder."""
        def value(n):
            if n in self.const:
                return self.const[n]
            assert aten_op(node) in SHAPE_ONLY, node
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
        if node not in self.tid:
            c = self.const[node]
            value = _uniform(c) if c.numel() > 1 and node.op == "call_function" else None
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
        value = _uniform(x)
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
        a_strides = _broadcast_strides(sa, out_shape)
        b_strides = _broadcast_strides(sb, out_shape) if tb is not None else [0] * len(out_shape)
        sizes, (a_strides, b_strides, _) = _coalesce(out_shape, a_strides, b_strides,
                                                    _contiguous_strides(out_shape))
        self.g.add_op(Opcode.BINARY, kind=kind, a=ta, b=-1 if tb is None else tb, out=out,
                      alpha=float(alpha), scalar=float(scalar), rank=len(sizes), sizes=sizes,
                      a_strides=a_strides, b_strides=b_strides)
        return out

    def unary(self, node, kind, p0=0.0, p1=0.0):
        out = self.new(node)
        self.g.add_op(Opcode.UNARY, kind=kind, x=self.tensor(node.args[0]), out=out,
                      p0=float(p0), p1=float(p1))
        return out

    def copy(self, x, out, sizes, in_offset, in_strides, out_offset, out_strides):
        sizes, (in_strides, out_strides) = _coalesce(sizes, in_strides, out_strides)
        self.g.add_op(Opcode.COPY, x=x, out=out, rank=len(sizes), sizes=sizes,
                      in_offset=in_offset, in_strides=in_strides, out_offset=out_offset,
                      out_strides=out_strides)

    def strided_copy(self, node, in_offset, in_strides, source=None):
        """The node's value as a strided read of `source` (default: its first argument); a view
        when that read is all of the source's elements in order (a prefix, e.g. x[0], is copied:
        a view is the same bytes, no fewer)."""
        x, shape = self.tensor(node.args[0] if source is None else source), _shape(node)
        sizes, (strides,) = _coalesce(shape, in_strides)
        if in_offset == 0 and all(s == 1 for s in strides) and len(sizes) <= 1 and \
                math.prod(shape) == self.g.tensors[x].numel:
            return self.g.add_alias(x, shape, name=node.name)
        out = self.new(node)
        self.copy(x, out, shape, in_offset, in_strides, 0, _contiguous_strides(shape))
        return out

    def matrix(self, node, rank):
        """(tensor id, transposed) of a matmul operand of `rank` dims; a transpose of the last two
        dims is read in place through the trans flag instead of being copied."""
        if _swaps_last_two(node, rank):
            return self.tensor(node.args[0]), 1
        return self.tensor(node), 0

    def matmul(self, out, a, b, bias, batch, M, N, K, bias_shape=(), alpha=1.0, beta=0.0,
               a_batch=0, b_batch=0):
        (ta, trans_a), (tb, trans_b) = a, b
        row, col = _broadcast_strides(bias_shape, (M, N)) if bias >= 0 else (0, 0)
        return self.g.add_op(Opcode.MATMUL, a=ta, b=tb, bias=bias, out=out, batch=batch, M=M,
                             N=N, K=K, trans_a=trans_a, trans_b=trans_b, a_batch_stride=a_batch,
                             b_batch_stride=b_batch, bias_row_stride=row, bias_col_stride=col,
                             alpha=float(alpha), beta=float(beta), epilogue=Epilogue.NONE,
                             residual=-1)

    def reduce(self, node, kind, dims):
        """Reduces `dims` (None or empty: all) of args[0]; one kReduce per run of adjacent dims."""
        x = node.args[0]
        shape = list(_shape(x))
        rank = len(shape)
        dims = sorted({_dim(d, rank) for d in dims}) if dims else list(range(rank))
        runs = []
        for d in dims:
            if runs and runs[-1][-1] == d - 1:
                runs[-1].append(d)
            else:
                runs.append([d])
        runs = runs or [[]]
        cur = self.tensor(x)
        for i, run in enumerate(reversed(runs)):
            start, end = (run[0], run[-1] + 1) if run else (0, 0)
            reduced = math.prod(shape[start:end])
            outer, inner = math.prod(shape[:start]), math.prod(shape[end:])
            shape[start:end] = [1] * (end - start)
            out = self.new(node) if i == len(runs) - 1 else self.new(node, shape=shape)
            self.g.add_op(Opcode.REDUCE, kind=kind, x=cur, out=out, outer=outer, reduce=reduced,
                          inner=inner)
            cur = out
        return cur


def _permutation(node):
    """perm such that dim i of a permute/transpose/t/clone node is dim perm[i] of its input;
    None for any other node."""
    if not isinstance(node, torch.fx.Node) or node.op != "call_function":
        return None
    op, rank = aten_op(node), len(_shape(node))
    if op == aten.permute_copy.default:
        return [_dim(d, rank) for d in node.args[1]]
    perm = list(range(rank))
    if op in (aten.transpose_copy.int, aten.t_copy.default):
        if rank >= 2:
            d0, d1 = (_dim(d, rank) for d in node.args[1:3]) if op == aten.transpose_copy.int \
                else (0, 1)
            perm[d0], perm[d1] = perm[d1], perm[d0]
        return perm
    return perm if op in _CLONES else None


def _swaps_last_two(node, rank):
    return rank >= 2 and _permutation(node) == list(range(rank - 2)) + [rank - 1, rank - 2]


# Converters, one per entry of supported_ops.SUPPORTED_OPS (except the constant-only ones).

def _binary(kind):
    def lower(self, node):
        a, b = node.args[:2]
        return self.binary(kind, a, b, _shape(node), _dtype(node),
                           arguments(node).get("alpha", 1), node.name)
    return lower


def _div_mode(self, node):
    floor = arguments(node)["rounding_mode"] == "floor"
    return _binary(BinaryKind.FLOOR_DIV if floor else BinaryKind.DIV)(self, node)


def _where(self, node):
    shape = _shape(node)
    operands = []
    for x in node.args[:3]:
        t, s = self.operand(x, broadcast_scalar=True)
        operands.append((t, _broadcast_strides(s, shape)))
    (tc, sc), (ta, sa), (tb, sb) = operands
    sizes, (sc, sa, sb, _) = _coalesce(shape, sc, sa, sb, _contiguous_strides(shape))
    out = self.new(node)
    self.g.add_op(Opcode.WHERE, cond=tc, a=ta, b=tb, out=out, rank=len(sizes), sizes=sizes,
                  cond_strides=sc, a_strides=sa, b_strides=sb)
    return out


def _unary(kind):
    return lambda self, node: self.unary(node, kind)


def _gelu(self, node):
    tanh = arguments(node)["approximate"] == "tanh"
    return self.unary(node, UnaryKind.GELU_TANH if tanh else UnaryKind.GELU_ERF)


def _clamp(self, node):
    args = arguments(node)
    lo = -math.inf if args["min"] is None else args["min"]
    hi = math.inf if args["max"] is None else args["max"]
    return self.unary(node, UnaryKind.CLAMP, lo, hi)


def _hardtanh(self, node):
    args = arguments(node)
    return self.unary(node, UnaryKind.CLAMP, args["min_val"], args["max_val"])


def _leaky_relu(self, node):
    return self.unary(node, UnaryKind.LEAKY_RELU, arguments(node)["negative_slope"])


def _pow_scalar(self, node):
    return self.unary(node, UnaryKind.POW_SCALAR, node.args[1])


def _mm(self, node):
    a, b = node.args[:2]
    rank = len(_shape(a))
    out = self.new(node)
    shape_a, n = _shape(a), _shape(node)[-1]
    batch = shape_a[0] if rank == 3 else 1
    m, k = shape_a[-2:]
    self.matmul(out, self.matrix(a, rank), self.matrix(b, rank), -1, batch, m, n, k,
                a_batch=m * k if rank == 3 else 0, b_batch=k * n if rank == 3 else 0)
    return out


def _addmm(self, node):
    bias, a, b = node.args[:3]
    out = self.new(node)
    (m, k), n = _shape(a), _shape(node)[1]
    args = arguments(node)
    self.matmul(out, self.matrix(a, 2), self.matrix(b, 2), self.tensor(bias), 1, m, n, k,
                bias_shape=_shape(bias), alpha=args["alpha"], beta=args["beta"])
    return out


def _linear(self, node):
    args = arguments(node)
    x, weight, bias = args["input"], args["weight"], args["bias"]
    out = self.new(node)
    n, k = _shape(weight)
    m = math.prod(_shape(x)) // k
    self.matmul(out, (self.tensor(x), 0), (self.tensor(weight), 1),
                -1 if bias is None else self.tensor(bias), 1, m, n, k,
                bias_shape=() if bias is None else _shape(bias), beta=1.0)
    return out


def _view(self, node):
    return self.g.add_alias(self.tensor(node.args[0]), _shape(node), name=node.name)


def _permute(self, node):
    """permute/transpose/t. A chain of them (clones between included) is one copy from the
    chain's source; the intermediate copies go unless something else reads them."""
    perm, src = _permutation(node), node.args[0]
    while (inner := _permutation(src)) is not None:
        perm, src = [inner[d] for d in perm], src.args[0]
    strides = _contiguous_strides(_shape(src))
    return self.strided_copy(node, 0, [strides[d] for d in perm], source=src)


def _expand(self, node):
    return self.strided_copy(node, 0, _broadcast_strides(_shape(node.args[0]), _shape(node)))


def _slice(self, node):
    args = arguments(node)
    shape = _shape(args["self"])
    dim, step = _dim(args["dim"], len(shape)), args["step"]
    start = slice(args["start"], args["end"], step).indices(shape[dim])[0]
    strides = _contiguous_strides(shape)
    offset = start * strides[dim]
    strides[dim] *= step
    return self.strided_copy(node, offset, strides)


def _select(self, node):
    x, dim, index = node.args
    shape = _shape(x)
    dim = _dim(dim, len(shape))
    strides = _contiguous_strides(shape)
    offset = (index + shape[dim] if index < 0 else index) * strides.pop(dim)
    return self.strided_copy(node, offset, strides)


def _cat(self, node):
    args = arguments(node)
    pieces = args["tensors"]
    shape = _shape(node)
    dim = _dim(args["dim"], len(shape))
    out = self.new(node)
    out_strides = _contiguous_strides(shape)
    at = 0
    for piece in pieces:
        piece_shape = _shape(piece)
        if math.prod(piece_shape) == 0:
            continue
        self.copy(self.tensor(piece), out, piece_shape, 0, _contiguous_strides(piece_shape),
                  at * out_strides[dim], out_strides)
        at += piece_shape[dim]
    return out


def _to_copy(self, node):
    x = node.args[0]
    if _dtype(node) == _dtype(x):
        return _view(self, node)
    out = self.new(node)
    n = math.prod(_shape(node))
    self.copy(self.tensor(x), out, [n], 0, [1], 0, [1])
    return out


def _softmax(is_log):
    def lower(self, node):
        x, dim = node.args[:2]
        shape = _shape(x)
        dim = _dim(dim, len(shape))
        out = self.new(node)
        self.g.add_op(Opcode.SOFTMAX, x=self.tensor(x), out=out, outer=math.prod(shape[:dim]),
                      dim=shape[dim], inner=math.prod(shape[dim + 1:]), is_log=int(is_log))
        return out
    return lower


def _layer_norm(self, node):
    x, normalized_shape, weight, bias, eps = arguments(node).values()
    cols = math.prod(normalized_shape)
    out = self.new(node)
    self.g.add_op(Opcode.LAYER_NORM, x=self.tensor(x),
                  weight=-1 if weight is None else self.tensor(weight),
                  bias=-1 if bias is None else self.tensor(bias), out=out,
                  rows=math.prod(_shape(x)) // cols, cols=cols, eps=float(eps))
    return out, None, None


def _batch_norm(self, node):
    """Eval-mode batch norm: y = x * scale + shift per channel (dim 1), with scale and shift
    computed here; folded into the weights of a convolution that feeds only this node."""
    x, weight, bias, mean, var, _, eps = arguments(node).values()
    c = self.const
    var64 = c[var].double()
    scale = torch.rsqrt(var64 + eps) * (c[weight].double() if weight is not None else 1.0)
    shift = (c[bias].double() if bias is not None else 0.0) - c[mean].double() * scale
    dtype = _dtype(x)
    conv = self.producer.get(x)
    if conv is not None and len(x.users) == 1:
        w_node, b_node = x.args[1], x.args[2]
        if w_node in c and (b_node is None or b_node in c):
            conv_bias = c[b_node].double() if b_node is not None else 0.0
            conv.operands["weight"] = self.g.add_weight(
                (c[w_node].double() * scale.reshape(-1, 1, 1, 1)).to(dtype))
            conv.operands["bias"] = self.g.add_weight((conv_bias * scale + shift).to(dtype))
            return conv.out, None, None
    shape = _shape(x)
    channel = (-1,) + (1,) * (len(shape) - 2)
    scaled = self.binary(BinaryKind.MUL, x, scale.reshape(channel).to(dtype), shape, dtype)
    out = self.binary(BinaryKind.ADD, Value(scaled, shape), shift.reshape(channel).to(dtype),
                      shape, dtype, name=node.name)
    return out, None, None


def _convolution(self, node):
    x, weight, bias, stride, padding, dilation, _, _, groups = arguments(node).values()
    n, c_in, h, w = _shape(x)
    c_out, _, kh, kw = _shape(weight)
    out = self.new(node)
    (sh, sw), (ph, pw), (dh, dw) = _pair(stride), _pair(padding), _pair(dilation)
    if h == w == kh == kw == 1 and groups == 1 and ph == pw == 0:
        # A 1x1 convolution of a 1x1 image (squeeze-and-excitation blocks) is a GEMM:
        # out[n, :] = weight[C_out, C_in] @ x[n, :] + bias. cuBLASLt runs it with the bias and a
        # following ReLU in its epilogue; cuDNN's convolution paths are slow at this shape.
        # (No producer entry: batch-norm folding rewrites convolution weights only.)
        self.matmul(out, (self.tensor(x), False), (self.tensor(weight), True),
                    -1 if bias is None else self.tensor(bias), 1, n, c_out, c_in,
                    bias_shape=(c_out,), beta=1.0)
        return out
    self.producer[node] = self.g.add_op(
        Opcode.CONV2D, x=self.tensor(x), weight=self.tensor(weight),
        bias=-1 if bias is None else self.tensor(bias), out=out, N=n, C_in=c_in, H=h, W=w,
        C_out=c_out, kH=kh, kW=kw, stride_h=sh, stride_w=sw, pad_h=ph, pad_w=pw, dil_h=dh,
        dil_w=dw, groups=groups, H_out=_shape(node)[2], W_out=_shape(node)[3])
    return out


def _split_conv_bias(g):
    """Each convolution's bias (its own, or a folded batch norm's) becomes a broadcast add after
    it. The add then joins the elementwise chain that usually follows (residual add, activation)
    in one fused kernel, where a bias inside kConv2d would cost a pass of its own over the output.
    Runs once the whole partition is lowered, so batch-norm folding has set the final bias."""
    ops = []
    for op in g.ops:
        ops.append(op)
        if op.opcode != Opcode.CONV2D or op.operands["bias"] < 0:
            continue
        out = op.operands["out"]
        t = g.tensors[out]
        raw = g.add_tensor(t.dtype, t.shape, name=f"{t.name}_before_bias")
        bias = op.operands["bias"]
        op.operands["out"], op.operands["bias"] = raw, -1
        contiguous = _contiguous_strides(t.shape)
        sizes, (a_strides, b_strides, _) = _coalesce(t.shape, contiguous, [0, 1, 0, 0],
                                                    contiguous)
        ops.append(Op(Opcode.BINARY, dict(kind=BinaryKind.ADD, a=raw, b=bias, out=out,
                                          alpha=1.0, scalar=0.0, rank=len(sizes), sizes=sizes,
                                          a_strides=a_strides, b_strides=b_strides)))
    g.ops = ops


def _pool(self, node, kind):
    """max_pool2d_with_indices / avg_pool2d. H_out and W_out come from the node's shape, which
    already accounts for ceil_mode."""
    args = arguments(node)
    n, c, h, w = _shape(args["self"])
    kh, kw = _pair(args["kernel_size"])
    sh, sw = _pair(args["stride"]) if args["stride"] else (kh, kw)
    (ph, pw), (dh, dw) = _pair(args["padding"]), _pair(args.get("dilation", 1))
    out = self.new(node)
    self.g.add_op(Opcode.POOL2D, kind=kind, x=self.tensor(args["self"]), out=out, N=n, C=c, H=h,
                  W=w, kH=kh, kW=kw, stride_h=sh, stride_w=sw, pad_h=ph, pad_w=pw, dil_h=dh,
                  dil_w=dw, H_out=_shape(node)[2], W_out=_shape(node)[3],
                  count_include_pad=int(args.get("count_include_pad", True)))
    return out


def _max_pool(self, node):
    return _pool(self, node, PoolKind.MAX), None


def _avg_pool(self, node):
    return _pool(self, node, PoolKind.AVG)


def _reduction(kind):
    def lower(self, node):
        dims = arguments(node).get("dim")
        return self.reduce(node, kind, [dims] if isinstance(dims, int) else dims)
    return lower


def _embedding(self, node):
    weight, indices = node.args[:2]
    vocab, dim = _shape(weight)
    out = self.new(node)
    self.g.add_op(Opcode.EMBEDDING, weight=self.tensor(weight), indices=self.tensor(indices),
                  out=out, num_indices=math.prod(_shape(indices)), dim=dim, vocab=vocab)
    return out


def _index_put(self, node):
    """Writes the rows into the state tensor in place; the node's value is the state."""
    args = arguments(node)
    state = self.tensor(args["self"])
    if self.g.tensors[state].storage != Storage.STATE:
        raise KilnLoweringError(f"{node.name}: index_put into {args['self'].name}, which is not "
                                "a buffer the delegate owns")
    (dim, positions), = [(d, i) for d, i in enumerate(args["indices"]) if i is not None]
    shape = _shape(args["self"])
    self.g.add_op(Opcode.INDEX_PUT, values=self.tensor(args["values"]),
                  positions=self.tensor(positions), out=state, outer=math.prod(shape[:dim]),
                  dim_size=shape[dim], inner=math.prod(shape[dim + 1:]),
                  num_positions=_shape(positions)[0])
    return state


LOWERINGS = {
    aten.add.Tensor: _binary(BinaryKind.ADD), aten.add.Scalar: _binary(BinaryKind.ADD),
    aten.sub.Tensor: _binary(BinaryKind.SUB), aten.sub.Scalar: _binary(BinaryKind.SUB),
    aten.mul.Tensor: _binary(BinaryKind.MUL), aten.mul.Scalar: _binary(BinaryKind.MUL),
    aten.div.Tensor: _binary(BinaryKind.DIV), aten.div.Scalar: _binary(BinaryKind.DIV),
    aten.div.Tensor_mode: _div_mode,
    aten.remainder.Tensor: _binary(BinaryKind.REMAINDER),
    aten.remainder.Scalar: _binary(BinaryKind.REMAINDER),
    aten.maximum.default: _binary(BinaryKind.MAXIMUM),
    aten.minimum.default: _binary(BinaryKind.MINIMUM),
    aten.pow.Tensor_Tensor: _binary(BinaryKind.POW),
    aten.eq.Tensor: _binary(BinaryKind.EQ), aten.eq.Scalar: _binary(BinaryKind.EQ),
    aten.ne.Tensor: _binary(BinaryKind.NE), aten.ne.Scalar: _binary(BinaryKind.NE),
    aten.lt.Tensor: _binary(BinaryKind.LT), aten.lt.Scalar: _binary(BinaryKind.LT),
    aten.le.Tensor: _binary(BinaryKind.LE), aten.le.Scalar: _binary(BinaryKind.LE),
    aten.gt.Tensor: _binary(BinaryKind.GT), aten.gt.Scalar: _binary(BinaryKind.GT),
    aten.ge.Tensor: _binary(BinaryKind.GE), aten.ge.Scalar: _binary(BinaryKind.GE),
    aten.logical_and.default: _binary(BinaryKind.LOGICAL_AND),
    aten.logical_or.default: _binary(BinaryKind.LOGICAL_OR),
    aten.bitwise_and.Tensor: _binary(BinaryKind.LOGICAL_AND),
    aten.bitwise_or.Tensor: _binary(BinaryKind.LOGICAL_OR),
    aten.where.self: _where,
    aten.relu.default: _unary(UnaryKind.RELU),
    aten.gelu.default: _gelu,
    aten.sigmoid.default: _unary(UnaryKind.SIGMOID),
    aten.tanh.default: _unary(UnaryKind.TANH),
    aten.silu.default: _unary(UnaryKind.SILU),
    aten.exp.default: _unary(UnaryKind.EXP),
    aten.log.default: _unary(UnaryKind.LOG),
    aten.cos.default: _unary(UnaryKind.COS),
    aten.sin.default: _unary(UnaryKind.SIN),
    aten.rsqrt.default: _unary(UnaryKind.RSQRT),
    aten.sqrt.default: _unary(UnaryKind.SQRT),
    aten.erf.default: _unary(UnaryKind.ERF),
    aten.erfinv.default: _unary(UnaryKind.ERFINV),
    aten.reciprocal.default: _unary(UnaryKind.RECIPROCAL),
    aten.neg.default: _unary(UnaryKind.NEG),
    aten.abs.default: _unary(UnaryKind.ABS),
    aten.hardswish.default: _unary(UnaryKind.HARDSWISH),
    aten.hardsigmoid.default: _unary(UnaryKind.HARDSIGMOID),
    aten.leaky_relu.default: _leaky_relu,
    aten.pow.Tensor_Scalar: _pow_scalar,
    aten.clamp.default: _clamp,
    aten.hardtanh.default: _hardtanh,
    aten.logical_not.default: _unary(UnaryKind.LOGICAL_NOT),
    aten.bitwise_not.default: _unary(UnaryKind.LOGICAL_NOT),
    aten.mm.default: _mm,
    aten.bmm.default: _mm,
    aten.addmm.default: _addmm,
    aten.linear.default: _linear,
    aten.view_copy.default: _view,
    aten.squeeze_copy.default: _view,
    aten.squeeze_copy.dim: _view,
    aten.squeeze_copy.dims: _view,
    aten.unsqueeze_copy.default: _view,
    aten.clone.default: _view,
    dim_order_ops._clone_dim_order.default: _view,
    aten.permute_copy.default: _permute,
    aten.transpose_copy.int: _permute,
    aten.t_copy.default: _permute,
    aten.expand_copy.default: _expand,
    aten.slice_copy.Tensor: _slice,
    aten.select_copy.int: _select,
    aten.cat.default: _cat,
    dim_order_ops._to_dim_order_copy.default: _to_copy,
    aten._softmax.default: _softmax(False),
    aten._log_softmax.default: _softmax(True),
    aten.native_layer_norm.default: _layer_norm,
    aten._native_batch_norm_legit_no_training.default: _batch_norm,
    aten.convolution.default: _convolution,
    aten.max_pool2d_with_indices.default: _max_pool,
    aten.avg_pool2d.default: _avg_pool,
    aten.mean.dim: _reduction(ReduceKind.MEAN),
    aten.sum.dim_IntList: _reduction(ReduceKind.SUM),
    aten.amax.default: _reduction(ReduceKind.AMAX),
    aten.amin.default: _reduction(ReduceKind.AMIN),
    aten.any.default: _reduction(ReduceKind.ANY),
    aten.any.dim: _reduction(ReduceKind.ANY),
    aten.any.dims: _reduction(ReduceKind.ANY),
    aten.embedding.default: _embedding,
    aten.index_put.default: _index_put,
}
