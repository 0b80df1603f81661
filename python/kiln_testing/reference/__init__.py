"""Reference interpreter of Kiln engine blobs: the executable form of blob_format.h's semantics.

Each opcode's semantics is one function registered with `@machine.semantics(Opcode.X)` in its
family module (elementwise.py, rows.py, dense.py); machine.py holds the memory and the rules.

`run_blob` executes a blob on the CPU with torch, one op at a time, over memory laid out exactly as
the blob says: one arena buffer of arena_size bytes (poisoned with 0xFF before the run, so a read
of bytes nobody wrote shows up as NaN), the weights section, and the caller's input and output
buffers. It also enforces the format's rules that the GPU engine relies on: an op never writes a
tensor it reads (byte ranges may not overlap), never writes inputs or weights, and every arena
tensor it reads was last written as that same tensor, or as one whose bytes hold it (a view of
a block, from the builder's view_contiguous_copies): this catches memory-planning mistakes. State
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

import torch
from executorch.exir.delegate import executorch_call_delegate
from torch.export.graph_signature import InputKind, OutputKind

from kiln_executorch.aot.blob_format import Storage

from kiln_executorch.aot.backend import unwrap_state_keys

from ..blob_reader import is_variant_set, read_blob, read_variant_set
# (Each family module registers the semantics of its opcodes.)
from . import attention, dense, elementwise, rows  # noqa: F401
from .machine import BlobExecutionError, Machine, initial_state

__all__ = ["BlobExecutionError", "ReferenceEngine", "ReferenceProgram", "run_blob",
           "run_program"]


def run_blob(blob: bytes, inputs, compute_dtype=torch.float64):
    """Runs `blob` on `inputs` (one tensor per delegate input, in order) and returns the outputs.
    A variant set runs the variant whose input shapes equal the inputs' shapes (ValueError when
    none does, as the engine answers InvalidArgument)."""
    if is_variant_set(blob):
        variants, weights = read_variant_set(blob)
        actual = [tuple(x.shape) for x in inputs]
        for variant, shapes in variants:
            if [tuple(s) for s in shapes] == actual:
                return Machine(read_blob(variant, weights), inputs, compute_dtype).run()
        raise ValueError(f"no variant serves input shapes {actual}; the variant set serves "
                         f"{[s for _, s in variants]}")
    return Machine(read_blob(blob), inputs, compute_dtype).run()


class ReferenceEngine:
    """A blob loaded once and run many times: its state tensors keep what each run wrote, as
    the engine's device state does. A run that fails leaves what the ops before the failing one
    wrote (the engine does the same)."""

    def __init__(self, blob: bytes, compute_dtype=torch.float64):
        self.graph = read_blob(blob)
        self.fp = compute_dtype
        self.buffers = initial_state(self.graph)

    def run(self, inputs):
        return Machine(self.graph, inputs, self.fp, self.buffers).run()

    def states(self):
        """The current value of every state, in the order the blob declares them."""
        found = []
        for t in self.graph.tensors:
            if t.storage == Storage.STATE and t.offset in self.buffers and \
                    all(other.offset != t.offset for other in found):
                found.append(t)
        return [self.buffers[t.offset][:t.nbytes].view(t.dtype).reshape(t.shape).clone()
                for t in found]


def _interpret(program, inputs, run_delegate, who):
    """Runs `program`'s graph with torch, each KilnBackend delegate call through
    run_delegate(index, payload, operands) (index: the call's position in graph order); returns
    the user outputs (buffer updates are left out)."""
    # The program's user inputs are the leaves of the call's (possibly nested) inputs, e.g. the
    # tuple of index tensors of index_put(x, (i, j), v).
    args, user_inputs = [], iter(torch.utils._pytree.tree_leaves(tuple(inputs)))
    for spec in program.graph_signature.input_specs:
        if spec.kind == InputKind.USER_INPUT:
            args.append(next(user_inputs))
        else:
            state = program.state_dict if spec.target in program.state_dict else program.constants
            args.append(state[spec.target])
    calls = iter(range(1 << 62))

    class Interpreter(torch.fx.Interpreter):
        def call_function(self, target, args, kwargs):
            if target is not executorch_call_delegate:
                return super().call_function(target, args, kwargs)
            lowered, *operands = args
            if lowered.backend_id != "KilnBackend":
                raise ValueError(f"{who} runs Kiln delegates only, not {lowered.backend_id}")
            return run_delegate(next(calls), lowered.processed_bytes, operands)

    outputs = Interpreter(program.graph_module).run(*args)
    return [out for out, spec in zip(outputs, program.graph_signature.output_specs)
            if spec.kind == OutputKind.USER_OUTPUT]


def run_program(program, inputs, blobs=None, compute_dtype=torch.float64):
    """Runs a lowered edge-dialect ExportedProgram (as to_edge_transform_and_lower returns it,
    before to_executorch rewrites it) on the CPU: every KilnBackend delegate call
    through run_blob, every other node with torch. `blobs`, when given, replaces the delegates'
    payloads in graph order (e.g. the blobs read back from the saved .pte). Returns the user
    outputs (buffer updates are left out)."""
    payloads = iter(blobs) if blobs is not None else None

    def run_delegate(index, payload, operands):
        return run_blob(next(payloads) if payloads is not None else payload, operands,
                        compute_dtype)

    return _interpret(program, inputs, run_delegate, "run_program")


def _distinct_states(graph):
    """The graph's distinct state records (one per offset), in offset order: the order the
    state-key container names them in."""
    first = {}
    for t in graph.tensors:
        if t.storage == Storage.STATE and t.offset not in first:
            first[t.offset] = t
    return [first[o] for o in sorted(first)]


class ReferenceProgram:
    """The Kiln delegates of a lowered program (an EdgeProgramManager, every method), loaded once
    as the runtime loads one program: states named by a state-key container are shared by key
    among all its delegates (a prefill and a decode method write and read one KV cache); unnamed
    states stay per delegate. A state two delegates declare with different dtypes or sizes is a
    ValueError, as the runtime refuses to load the second method."""

    def __init__(self, edge_manager, compute_dtype=torch.float64):
        self.fp = compute_dtype
        self.programs = {name: edge_manager.exported_program(name)
                         for name in edge_manager.methods}
        self.shared = {}     # key -> (dtype, shape, uint8 buffer)
        self.private = {}    # (method, delegate index, variant) -> {offset: buffer}

    def _state(self, graph, keys, where):
        states = _distinct_states(graph)
        if not keys:
            return self.private.setdefault(where, initial_state(graph))
        if len(keys) != len(states):
            raise ValueError(f"{where}: {len(keys)} state keys for {len(states)} states")
        buffers = {}
        for key, t in zip(keys, states):
            if key not in self.shared:
                self.shared[key] = (t.dtype, tuple(t.shape),
                                    t.data.reshape(-1).view(torch.uint8).clone())
            dtype, shape, buf = self.shared[key]
            if (dtype, shape) != (t.dtype, tuple(t.shape)):
                raise ValueError(f"state {key!r} is declared {t.dtype} {list(t.shape)} by "
                                 f"{where[0]} but {dtype} {list(shape)} by a method loaded before")
            buffers[t.offset] = buf
        return buffers

    def _run_payload(self, method, index, payload, operands):
        keys, payload = unwrap_state_keys(payload)
        if is_variant_set(payload):
            variants, weights = read_variant_set(payload)
            actual = [tuple(x.shape) for x in operands]
            for v, (blob, shapes) in enumerate(variants):
                if [tuple(s) for s in shapes] == actual:
                    graph = read_blob(blob, weights)
                    where = (method, index, v)
                    break
            else:
                raise ValueError(f"no variant serves input shapes {actual}")
        else:
            graph, where = read_blob(payload), (method, index, 0)
        state = self._state(graph, keys, where)
        return Machine(graph, operands, self.fp, state).run()

    def state(self, key):
        """The current value of the shared state `key`."""
        dtype, shape, buf = self.shared[key]
        return buf.view(dtype).reshape(shape).clone()

    def run(self, method, inputs):
        """Runs `method` on `inputs` (its user inputs); returns its user outputs."""
        def run_delegate(index, payload, operands):
            return self._run_payload(method, index, payload, operands)

        return _interpret(self.programs[method], inputs, run_delegate, "ReferenceProgram")
