"""Reference interpreter of Kiln engine blobs: the executable form of blob_format.h's semantics.

`run_blob` executes a blob on the CPU with torch, one op at a time, over memory laid out exactly as
the blob says: one arena buffer of arena_size bytes (poisoned with 0xFF before the run, so a read
of bytes nobody wrote shows up as NaN), the weights section, and the caller's input and output
buffers. It also enforces the format's rules that the GPU engine relies on: an op never writes a
tensor it reads (byte ranges may not overlap), never writes inputs or weights, and every arena
tensor it reads was last written as that same tensor (catches memory-planning mistakes). State
tensors (kState) live in buffers of their own that start as their initial value; only kIndexPut
writes them. `ReferenceEngine` keeps that state across runs, as the engine does; `run_blob` runs
once on fresh state.

Floating math runs in `compute_dtype` (float64 by default, the oracle the fp32 engine is held to;
float32 mirrors the engine's own arithmetic); results are rounded to each output's dtype.
Integer math is int64. Semantics chosen where the header leaves room (the builder relies on them):
- kBinary: arithmetic kinds compute in floating point when `out` is floating, otherwise in int64
  (kDiv truncates, kFloorDiv floors, kRemainder takes the divisor's sign, as torch.remainder);
  compare kinds compute in floating point unless both operands are integer or bool (a scalar
  counts as integer when it is integral); logical kinds test operands against zero.
- kReduce kAny and kUnary kLogicalNot test against zero and write Bool.
- kCopy, kUnary kIdentity and every write convert with torch's casts (round to nearest even for
  floating types, truncation towards zero to integers, nonzero to Bool).
- kMatmul with bias == -1 ignores beta.
- kPool2d kAvg: windows follow torch (window clipped to the padded input, then divisor is the
  clipped window when count_include_pad, the part inside the unpadded input otherwise).
"""

import math

import torch
import torch.nn.functional as F
from executorch.exir.delegate import executorch_call_delegate
from torch.export.graph_signature import InputKind, OutputKind

from .blob_format import (FUSED_INSTR_WIDTH, BinaryKind, DType, Epilogue, FusedForm, Opcode,
                          PoolKind, ReduceKind, Storage, TORCH_DTYPES, UnaryKind, tensor_fields,
                          tensor_list_fields)
from .blob_format import bits_to_double
from .blob_reader import is_variant_set, read_blob, read_variant_set

_ARITHMETIC = {BinaryKind.ADD, BinaryKind.SUB, BinaryKind.MUL, BinaryKind.DIV, BinaryKind.POW,
               BinaryKind.MAXIMUM, BinaryKind.MINIMUM, BinaryKind.FLOOR_DIV, BinaryKind.REMAINDER}
_INT_UNARY = {UnaryKind.RELU, UnaryKind.NEG, UnaryKind.ABS, UnaryKind.CLAMP, UnaryKind.IDENTITY}


class BlobExecutionError(RuntimeError):
    """A blob broke one of the format's run-time rules (the engine reports these as errors)."""


def run_blob(blob: bytes, inputs, compute_dtype=torch.float64):
    """Runs `blob` on `inputs` (one tensor per delegate input, in order) and returns the outputs.
    A variant set runs the variant whose input shapes equal the inputs' shapes (ValueError when
    none does, as the engine answers InvalidArgument)."""
    if is_variant_set(blob):
        variants, weights = read_variant_set(blob)
        actual = [tuple(x.shape) for x in inputs]
        for variant, shapes in variants:
            if [tuple(s) for s in shapes] == actual:
                return _Machine(read_blob(variant, weights), inputs, compute_dtype).run()
        raise ValueError(f"no variant serves input shapes {actual}; the variant set serves "
                         f"{[s for _, s in variants]}")
    return _Machine(read_blob(blob), inputs, compute_dtype).run()


class ReferenceEngine:
    """A blob loaded once and run many times: its state tensors keep what each run wrote, as
    the engine's device state does. A run that fails leaves what the ops before the failing one
    wrote (the engine does the same)."""

    def __init__(self, blob: bytes, compute_dtype=torch.float64):
        self.graph = read_blob(blob)
        self.fp = compute_dtype
        self.buffers = _initial_state(self.graph)

    def run(self, inputs):
        return _Machine(self.graph, inputs, self.fp, self.buffers).run()

    def states(self):
        """The current value of every state, in the order the blob declares them."""
        found = []
        for t in self.graph.tensors:
            if t.storage == Storage.STATE and t.offset in self.buffers and \
                    all(other.offset != t.offset for other in found):
                found.append(t)
        return [self.buffers[t.offset][:t.nbytes].view(t.dtype).reshape(t.shape).clone()
                for t in found]


def _initial_state(graph):
    """{offset: bytes} for every state, from the initial values in the weights section."""
    buffers = {}
    for t in graph.tensors:
        if t.storage != Storage.STATE:
            continue
        data = t.data.reshape(-1).view(torch.uint8)
        if t.offset not in buffers or buffers[t.offset].numel() < data.numel():
            buffers[t.offset] = data.clone()
    return buffers


def run_program(program, inputs, blobs=None, compute_dtype=torch.float64):
    """Runs a lowered edge-dialect ExportedProgram (as to_edge_transform_and_lower returns it,
    before to_executorch rewrites it) on the CPU: every KilnBackend delegate call
    through run_blob, every other node with torch. `blobs`, when given, replaces the delegates'
    payloads in graph order (e.g. the blobs read back from the saved .pte). Returns the user
    outputs (buffer updates are left out)."""
    args, user_inputs = [], iter(inputs)
    for spec in program.graph_signature.input_specs:
        if spec.kind == InputKind.USER_INPUT:
            args.append(next(user_inputs))
        else:
            state = program.state_dict if spec.target in program.state_dict else program.constants
            args.append(state[spec.target])
    payloads = iter(blobs) if blobs is not None else None

    class Interpreter(torch.fx.Interpreter):
        def call_function(self, target, args, kwargs):
            if target is not executorch_call_delegate:
                return super().call_function(target, args, kwargs)
            lowered, *operands = args
            if lowered.backend_id != "KilnBackend":
                raise ValueError(f"run_program runs Kiln delegates only, not {lowered.backend_id}")
            blob = next(payloads) if payloads is not None else lowered.processed_bytes
            return run_blob(blob, operands, compute_dtype)

    outputs = Interpreter(program.graph_module).run(*args)
    return [out for out, spec in zip(outputs, program.graph_signature.output_specs)
            if spec.kind == OutputKind.USER_OUTPUT]


class _Machine:
    def __init__(self, graph, inputs, compute_dtype, state=None):
        self.g = graph
        self.fp = compute_dtype
        self.state = _initial_state(graph) if state is None else state
        if len(inputs) != len(graph.inputs):
            raise ValueError(f"blob takes {len(graph.inputs)} inputs, got {len(inputs)}")
        self.arena = torch.full((graph.arena_size,), 0xFF, dtype=torch.uint8)
        self.arena_writer = torch.full((graph.arena_size,), -1, dtype=torch.int64)
        self.keys = {}
        self.input_bufs = {}
        for i, (tid, x) in enumerate(zip(graph.inputs, inputs)):
            t = graph.tensors[tid]
            if x.dtype != t.dtype or x.numel() != t.numel:
                raise ValueError(f"input {i}: got {x.dtype} {list(x.shape)}, blob declares "
                                 f"{t.dtype} {list(t.shape)}")
            self.input_bufs[t.offset] = x.detach().contiguous().reshape(-1).view(torch.uint8)
        self.output_bufs = {graph.tensors[tid].offset: torch.full((graph.tensors[tid].nbytes,),
                                                                  0xFF, dtype=torch.uint8)
                            for tid in graph.outputs}

    # Memory.

    def _bytes(self, tid):
        t = self.g.tensors[tid]
        if t.storage == Storage.ARENA:
            return self.arena[t.offset:t.offset + t.nbytes]
        if t.storage == Storage.WEIGHT:
            return t.data.reshape(-1).view(torch.uint8)
        if t.storage == Storage.STATE:
            return self.state[t.offset][:t.nbytes]
        bufs = self.input_bufs if t.storage == Storage.INPUT else self.output_bufs
        if t.offset not in bufs or bufs[t.offset].numel() < t.nbytes:
            raise BlobExecutionError(f"tensor {tid}: no {t.storage.name} binding {t.offset} of "
                                     f"{t.nbytes} bytes")
        return bufs[t.offset][:t.nbytes]

    def flat(self, tid):
        """The tensor's elements as a 1-D view of the memory it lives in."""
        return self._bytes(tid).view(self.g.tensors[tid].dtype)

    def _extent(self, tid):
        t = self.g.tensors[tid]
        buffer = (t.storage, 0 if t.storage == Storage.ARENA else t.offset)
        start = t.offset if t.storage == Storage.ARENA else 0
        return buffer, start, start + t.nbytes

    def read(self, tid):
        t = self.g.tensors[tid]
        if t.storage == Storage.ARENA and t.nbytes:
            writers = self.arena_writer[t.offset:t.offset + t.nbytes]
            if not bool((writers == self._key(tid)).all()):
                raise BlobExecutionError(f"tensor {tid} is read but its arena bytes "
                                         f"[{t.offset}, {t.offset + t.nbytes}) were not last "
                                         "written as this tensor")
        return self.flat(tid).clone()

    def _key(self, tid):
        # Views of one tensor share offset and size, so they share the key.
        t = self.g.tensors[tid]
        return self.keys.setdefault((t.offset, t.nbytes), len(self.keys))

    def write(self, tid, index, values):
        """out_flat[index] = values (index None: the whole tensor), cast to out's dtype."""
        out = self.flat(tid)
        values = values.reshape(-1).to(out.dtype)
        if index is None:
            if values.numel() != out.numel():
                raise BlobExecutionError(f"tensor {tid}: writing {values.numel()} elements into "
                                         f"{out.numel()}")
            out.copy_(values)
        else:
            out[self._checked(index, out.numel(), tid)] = values
        t = self.g.tensors[tid]
        if t.storage == Storage.ARENA:
            self.arena_writer[t.offset:t.offset + t.nbytes] = self._key(tid)

    @staticmethod
    def _checked(index, numel, tid):
        if index.numel() and (int(index.min()) < 0 or int(index.max()) >= numel):
            raise BlobExecutionError(f"tensor {tid}: element index out of [0, {numel})")
        return index

    def gather(self, tid, index):
        x = self.read(tid)
        return x[self._checked(index, x.numel(), tid)]

    # Execution.

    def run(self):
        for i, op in enumerate(self.g.ops):
            self._check_writes(i, op)
            getattr(self, "_" + op.opcode.name.lower())(**op.operands)
        return [self.read(tid).reshape(self.g.tensors[tid].shape) for tid in self.g.outputs]

    def _check_writes(self, i, op):
        out = op.operands["out"]
        storage = self.g.tensors[out].storage
        if storage in (Storage.INPUT, Storage.WEIGHT):
            raise BlobExecutionError(f"op {i} ({op.opcode.name}) writes {storage.name} "
                                     f"tensor {out}")
        # State is written in place, by kIndexPut only, and kIndexPut writes only state.
        if (storage == Storage.STATE) != (op.opcode == Opcode.INDEX_PUT):
            raise BlobExecutionError(f"op {i} ({op.opcode.name}) writes {storage.name} tensor "
                                     f"{out}; only INDEX_PUT writes state, and only state")
        buf, start, end = self._extent(out)
        named = [(n, op.operands[n]) for n in tensor_fields(op.opcode)]
        named += [(n, t) for n in tensor_list_fields(op.opcode) for t in op.operands[n]]
        for name, tid in named:
            if name == "out" or tid < 0:
                continue
            other, s, e = self._extent(tid)
            if other == buf and s < end and start < e:
                raise BlobExecutionError(f"op {i} ({op.opcode.name}) writes tensor {out}, which "
                                         f"overlaps its operand {name} (tensor {tid})")

    def _copy(self, x, out, rank, sizes, in_offset, in_strides, out_offset, out_strides):
        src = in_offset + _strided_index(sizes, in_strides)
        dst = out_offset + _strided_index(sizes, out_strides)
        self.write(out, dst, self.gather(x, src))

    def _binary(self, kind, a, b, out, alpha, scalar, rank, sizes, a_strides, b_strides):
        kind = BinaryKind(kind)
        va = self.gather(a, _strided_index(sizes, a_strides))
        vb = self.gather(b, _strided_index(sizes, b_strides)) if b >= 0 else None
        out_dtype = self.g.tensors[out].dtype
        if kind in _ARITHMETIC:
            floating = out_dtype.is_floating_point
        elif kind in (BinaryKind.LOGICAL_AND, BinaryKind.LOGICAL_OR):
            floating = False
        else:
            floating = va.dtype.is_floating_point or (
                vb.dtype.is_floating_point if vb is not None else not _integral(scalar))
        math_dtype = self.fp if floating else torch.int64
        va = va.to(math_dtype)
        vb = vb.to(math_dtype) if vb is not None else torch.tensor(
            scalar if floating else int(scalar), dtype=math_dtype)
        alpha = alpha if floating else int(alpha)
        self.write(out, None, _BINARY[kind](va, vb, alpha))

    def _unary(self, kind, x, out, p0, p1):
        kind = UnaryKind(kind)
        v = self.read(x)
        integer = not v.dtype.is_floating_point and kind in _INT_UNARY
        v = v.to(torch.int64 if integer else self.fp)
        if kind == UnaryKind.CLAMP and integer:
            p0 = math.ceil(p0) if math.isfinite(p0) else None
            p1 = math.floor(p1) if math.isfinite(p1) else None
        self.write(out, None, _UNARY[kind](v, p0, p1))

    def _where(self, cond, a, b, out, rank, sizes, cond_strides, a_strides, b_strides):
        c = self.gather(cond, _strided_index(sizes, cond_strides)) != 0
        va = self.gather(a, _strided_index(sizes, a_strides))
        vb = self.gather(b, _strided_index(sizes, b_strides))
        dtype = self.fp if self.g.tensors[out].dtype.is_floating_point else torch.int64
        self.write(out, None, torch.where(c, va.to(dtype), vb.to(dtype)))

    def _fused_elementwise(self, out, rank, sizes, num_inputs, inputs, strides, num_instrs,
                           program):
        # Each instruction computes as the op it replaces and rounds to that op's output dtype,
        # so a fused program gives the same values as the unfused ops.
        regs = [self.gather(t, _strided_index(sizes, strides[i * rank:(i + 1) * rank]))
                .to(self.fp) for i, t in enumerate(inputs)]
        for j in range(num_instrs):
            form, kind, s0, s1, s2, p0, p1, rnd = program[j * FUSED_INSTR_WIDTH:
                                                          (j + 1) * FUSED_INSTR_WIDTH]
            p0, p1 = bits_to_double(p0), bits_to_double(p1)
            if form == FusedForm.UNARY:
                v = _UNARY[UnaryKind(kind)](regs[s0], p0, p1)
            elif form == FusedForm.BINARY:
                b = regs[s1] if s1 >= 0 else torch.tensor(p1, dtype=self.fp)
                v = _BINARY[BinaryKind(kind)](regs[s0], b, p0)
            else:
                v = torch.where(regs[s0] != 0, regs[s1], regs[s2])
            regs.append(v.to(TORCH_DTYPES[DType(rnd)]).to(self.fp))
        self.write(out, None, regs[-1])

    def _matrix(self, tid, g, batch_stride, rows, cols, transposed):
        """The g-th row-major matrix of `tid` as [rows, cols] (stored as [cols, rows] when
        transposed)."""
        start = g * batch_stride
        x = self.read(tid)
        if start < 0 or start + rows * cols > x.numel():
            raise BlobExecutionError(f"tensor {tid}: matrix {g} exceeds its {x.numel()} elements")
        m = x[start:start + rows * cols].to(self.fp)
        return m.reshape(cols, rows).t() if transposed else m.reshape(rows, cols)

    def _matmul(self, a, b, bias, out, batch, M, N, K, trans_a, trans_b, a_batch_stride,
                b_batch_stride, bias_row_stride, bias_col_stride, alpha, beta, epilogue,
                residual):
        results = []
        for g in range(batch):
            y = alpha * (self._matrix(a, g, a_batch_stride, M, K, trans_a) @
                         self._matrix(b, g, b_batch_stride, K, N, trans_b))
            if bias >= 0:
                y = y + beta * self.gather(bias, _strided_index(
                    [M, N], [bias_row_stride, bias_col_stride])).to(self.fp).reshape(M, N)
            results.append(y)
        y = torch.stack(results) if results else torch.empty(0, dtype=self.fp)
        if residual >= 0:
            y = y + self.read(residual).to(self.fp).reshape(y.shape)
        epilogue = Epilogue(epilogue)
        if epilogue == Epilogue.RELU:
            y = torch.relu(y)
        elif epilogue == Epilogue.GELU_ERF:
            y = F.gelu(y)
        elif epilogue == Epilogue.GELU_TANH:
            y = F.gelu(y, approximate="tanh")
        self.write(out, None, y)

    def _softmax(self, x, out, outer, dim, inner, is_log):
        v = self.read(x).to(self.fp).reshape(outer, dim, inner)
        self.write(out, None, (torch.log_softmax if is_log else torch.softmax)(v, dim=1))

    def _layer_norm(self, x, weight, bias, out, rows, cols, eps):
        v = self.read(x).to(self.fp).reshape(rows, cols)
        mean = v.mean(dim=1, keepdim=True)
        var = ((v - mean) ** 2).mean(dim=1, keepdim=True)
        y = (v - mean) / torch.sqrt(var + eps)
        if weight >= 0:
            y = y * self.read(weight).to(self.fp)
        if bias >= 0:
            y = y + self.read(bias).to(self.fp)
        self.write(out, None, y)

    def _reduce(self, kind, x, out, outer, reduce, inner):
        kind = ReduceKind(kind)
        v = self.read(x).reshape(outer, reduce, inner)
        if kind == ReduceKind.ANY:
            self.write(out, None, (v != 0).any(dim=1))
            return
        floating = self.g.tensors[out].dtype.is_floating_point
        v = v.to(self.fp if floating or kind == ReduceKind.MEAN else torch.int64)
        y = {ReduceKind.SUM: lambda: v.sum(dim=1), ReduceKind.MEAN: lambda: v.mean(dim=1),
             ReduceKind.AMAX: lambda: v.amax(dim=1), ReduceKind.AMIN: lambda: v.amin(dim=1)}[kind]()
        self.write(out, None, y)

    def _embedding(self, weight, indices, out, num_indices, dim, vocab):
        idx = self.read(indices).to(torch.int64)[:num_indices]
        bad = (idx < 0) | (idx >= vocab)
        if bool(bad.any()):
            raise BlobExecutionError(f"embedding index {int(idx[bad][0])} outside [0, {vocab})")
        w = self.read(weight)[:vocab * dim].reshape(vocab, dim)
        self.write(out, None, w[idx])

    def _index_put(self, values, positions, out, outer, dim_size, inner, num_positions):
        pos = self.read(positions).to(torch.int64)[:num_positions]
        bad = (pos < 0) | (pos >= dim_size)
        if bool(bad.any()):
            raise BlobExecutionError(f"index_put position {int(pos[bad][0])} outside "
                                     f"[0, {dim_size})")
        v = self.read(values)
        if v.numel() != outer * num_positions * inner:
            raise BlobExecutionError(f"index_put values have {v.numel()} elements, operands say "
                                     f"{outer * num_positions * inner}")
        rows = (torch.arange(outer).reshape(outer, 1, 1) * dim_size + pos.reshape(1, -1, 1)) * inner
        self.write(out, (rows + torch.arange(inner).reshape(1, 1, inner)).reshape(-1), v)

    def _fill(self, out, value):
        self.write(out, None, torch.full((self.g.tensors[out].numel,), value, dtype=self.fp))

    def _conv2d(self, x, weight, bias, out, N, C_in, H, W, C_out, kH, kW, stride_h, stride_w,
                pad_h, pad_w, dil_h, dil_w, groups, H_out, W_out):
        v = self.read(x).to(self.fp).reshape(N, C_in, H, W)
        w = self.read(weight).to(self.fp).reshape(C_out, C_in // groups, kH, kW)
        b = self.read(bias).to(self.fp) if bias >= 0 else None
        y = F.conv2d(v, w, b, (stride_h, stride_w), (pad_h, pad_w), (dil_h, dil_w), groups)
        if tuple(y.shape) != (N, C_out, H_out, W_out):
            raise BlobExecutionError(f"conv2d output is {list(y.shape)}, operands say "
                                     f"{[N, C_out, H_out, W_out]}")
        self.write(out, None, y)

    def _pool2d(self, kind, x, out, N, C, H, W, kH, kW, stride_h, stride_w, pad_h, pad_w, dil_h,
                dil_w, H_out, W_out, count_include_pad):
        is_max = PoolKind(kind) == PoolKind.MAX
        v = self.read(x).to(self.fp).reshape(N, C, H, W)
        # Pad far enough that every window of every output position lies inside the buffer.
        extra_h = max(0, (H_out - 1) * stride_h + (kH - 1) * dil_h + 1 - (H + 2 * pad_h))
        extra_w = max(0, (W_out - 1) * stride_w + (kW - 1) * dil_w + 1 - (W + 2 * pad_w))
        fill = -math.inf if is_max else 0.0
        v = F.pad(v, (pad_w, pad_w + extra_w, pad_h, pad_h + extra_h), value=fill)
        oh = torch.arange(H_out) * stride_h
        ow = torch.arange(W_out) * stride_w
        windows = torch.stack([v[:, :, (oh + i * dil_h)[:, None], (ow + j * dil_w)[None, :]]
                               for i in range(kH) for j in range(kW)])
        if is_max:
            self.write(out, None, windows.amax(dim=0))
            return
        h0, w0 = oh - pad_h, ow - pad_w
        h1, w1 = torch.clamp(h0 + kH, max=H + pad_h), torch.clamp(w0 + kW, max=W + pad_w)
        if not count_include_pad:
            h0, w0 = h0.clamp(min=0), w0.clamp(min=0)
            h1, w1 = h1.clamp(max=H), w1.clamp(max=W)
        divisor = ((h1 - h0)[:, None] * (w1 - w0)[None, :]).to(self.fp)
        self.write(out, None, windows.sum(dim=0) / divisor)


def _strided_index(sizes, strides):
    """Flat element index sum(idx_d * strides[d]) for every idx in `sizes`, row-major."""
    index = torch.zeros((), dtype=torch.int64)
    for d, (n, s) in enumerate(zip(sizes, strides)):
        shape = [1] * len(sizes)
        shape[d] = n
        index = index + torch.arange(n, dtype=torch.int64).reshape(shape) * s
    return index.expand(list(sizes)).reshape(-1)


def _clamp(x, lo, hi):
    """min(max(x, lo), hi); None is an absent bound."""
    x = torch.clamp(x, min=lo) if lo is not None else x
    return torch.clamp(x, max=hi) if hi is not None else x


def _integral(x):
    return math.isfinite(x) and x == int(x)


def _int_div(a, b):
    return torch.div(a, b, rounding_mode="trunc")


_BINARY = {
    BinaryKind.ADD: lambda a, b, alpha: a + alpha * b,
    BinaryKind.SUB: lambda a, b, alpha: a - alpha * b,
    BinaryKind.MUL: lambda a, b, alpha: a * b,
    BinaryKind.DIV: lambda a, b, alpha: a / b if a.is_floating_point() else _int_div(a, b),
    BinaryKind.POW: lambda a, b, alpha: torch.pow(a, b),
    BinaryKind.MAXIMUM: lambda a, b, alpha: torch.maximum(a, b),
    BinaryKind.MINIMUM: lambda a, b, alpha: torch.minimum(a, b),
    BinaryKind.EQ: lambda a, b, alpha: a == b,
    BinaryKind.NE: lambda a, b, alpha: a != b,
    BinaryKind.LT: lambda a, b, alpha: a < b,
    BinaryKind.LE: lambda a, b, alpha: a <= b,
    BinaryKind.GT: lambda a, b, alpha: a > b,
    BinaryKind.GE: lambda a, b, alpha: a >= b,
    BinaryKind.LOGICAL_AND: lambda a, b, alpha: (a != 0) & (b != 0),
    BinaryKind.LOGICAL_OR: lambda a, b, alpha: (a != 0) | (b != 0),
    BinaryKind.FLOOR_DIV: lambda a, b, alpha: torch.div(a, b, rounding_mode="floor"),
    BinaryKind.REMAINDER: lambda a, b, alpha: torch.remainder(a, b),
}

_SQRT1_2 = math.sqrt(0.5)
_UNARY = {
    UnaryKind.RELU: lambda x, p0, p1: torch.relu(x),
    UnaryKind.GELU_ERF: lambda x, p0, p1: 0.5 * x * (1 + torch.erf(x * _SQRT1_2)),
    UnaryKind.GELU_TANH: lambda x, p0, p1: F.gelu(x, approximate="tanh"),
    UnaryKind.SIGMOID: lambda x, p0, p1: torch.sigmoid(x),
    UnaryKind.TANH: lambda x, p0, p1: torch.tanh(x),
    UnaryKind.SILU: lambda x, p0, p1: x * torch.sigmoid(x),
    UnaryKind.EXP: lambda x, p0, p1: torch.exp(x),
    UnaryKind.LOG: lambda x, p0, p1: torch.log(x),
    UnaryKind.COS: lambda x, p0, p1: torch.cos(x),
    UnaryKind.SIN: lambda x, p0, p1: torch.sin(x),
    UnaryKind.RSQRT: lambda x, p0, p1: torch.rsqrt(x),
    UnaryKind.SQRT: lambda x, p0, p1: torch.sqrt(x),
    UnaryKind.NEG: lambda x, p0, p1: -x,
    UnaryKind.ABS: lambda x, p0, p1: x.abs(),
    UnaryKind.HARDSWISH: lambda x, p0, p1: x * torch.clamp(x + 3, 0, 6) / 6,
    UnaryKind.HARDSIGMOID: lambda x, p0, p1: torch.clamp(x + 3, 0, 6) / 6,
    UnaryKind.CLAMP: lambda x, p0, p1: _clamp(x, p0, p1),
    UnaryKind.LOGICAL_NOT: lambda x, p0, p1: x == 0,
    UnaryKind.ERF: lambda x, p0, p1: torch.erf(x),
    UnaryKind.RECIPROCAL: lambda x, p0, p1: 1 / x,
    UnaryKind.POW_SCALAR: lambda x, p0, p1: torch.pow(x, p0),
    UnaryKind.LEAKY_RELU: lambda x, p0, p1: torch.where(x > 0, x, p0 * x),
    UnaryKind.IDENTITY: lambda x, p0, p1: x,
    UnaryKind.ERFINV: lambda x, p0, p1: torch.erfinv(x),
}
