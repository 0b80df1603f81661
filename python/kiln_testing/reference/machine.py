"""The reference interpreter's machine: the memory a blob runs over (arena, weights, state, the
caller's input and output buffers), the format's run-time rules, and the dispatch of each op to
the semantics its family module registered with `@semantics(Opcode.X)`."""

import torch

from kiln_executorch.aot.blob_format import Opcode, Storage, tensor_fields, tensor_list_fields

# Opcode -> semantics(machine, **operands): reads operands with machine.read/gather, writes `out`
# with machine.write. Filled by elementwise.py, rows.py and dense.py.
SEMANTICS = {}


def semantics(opcode):
    """Registers the decorated function as the reference semantics of `opcode`."""
    def decorate(fn):
        if opcode in SEMANTICS:
            raise ValueError(f"{opcode.name} has two reference semantics")
        SEMANTICS[opcode] = fn
        return fn
    return decorate


class BlobExecutionError(RuntimeError):
    """A blob broke one of the format's run-time rules (the engine reports these as errors)."""


def initial_state(graph):
    """{offset: bytes} for every state, from the initial values in the weights section."""
    buffers = {}
    for t in graph.tensors:
        if t.storage != Storage.STATE:
            continue
        data = t.data.reshape(-1).view(torch.uint8)
        if t.offset not in buffers or buffers[t.offset].numel() < data.numel():
            buffers[t.offset] = data.clone()
    return buffers


class Machine:
    def __init__(self, graph, inputs, compute_dtype, state=None):
        self.g = graph
        self.fp = compute_dtype
        self.state = initial_state(graph) if state is None else state
        if len(inputs) != len(graph.inputs):
            raise ValueError(f"blob takes {len(graph.inputs)} inputs, got {len(inputs)}")
        self.arena = torch.full((graph.arena_size,), 0xFF, dtype=torch.uint8)
        self.arena_writer = torch.full((graph.arena_size,), -1, dtype=torch.int64)
        self.keys = {}       # (arena offset, bytes) -> key, numbered in order
        self.extents = []    # key -> (arena offset, bytes)
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
            key = int(writers[0])
            # Last written as this tensor, or as one tensor whose bytes hold this one's (a view
            # of a block of it, as the builder makes of a merged projection's columns).
            start, size = self.extents[key] if key >= 0 else (-1, 0)
            if not bool((writers == key).all()) or start > t.offset or \
                    start + size < t.offset + t.nbytes:
                raise BlobExecutionError(f"tensor {tid} is read but its arena bytes "
                                         f"[{t.offset}, {t.offset + t.nbytes}) were not last "
                                         "written as this tensor or one holding it")
        return self.flat(tid).clone()

    def _key(self, tid):
        # Views of one tensor share offset and size, so they share the key.
        t = self.g.tensors[tid]
        extent = (t.offset, t.nbytes)
        if extent not in self.keys:
            self.keys[extent] = len(self.extents)
            self.extents.append(extent)
        return self.keys[extent]

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
            run = SEMANTICS.get(op.opcode)
            if run is None:
                raise BlobExecutionError(f"op {i}: the reference has no semantics for "
                                         f"{op.opcode.name}")
            run(self, **op.operands)
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


def strided_index(sizes, strides):
    """Flat element index sum(idx_d * strides[d]) for every idx in `sizes`, row-major."""
    index = torch.zeros((), dtype=torch.int64)
    for d, (n, s) in enumerate(zip(sizes, strides)):
        shape = [1] * len(sizes)
        shape[d] = n
        index = index + torch.arange(n, dtype=torch.int64).reshape(shape) * s
    return index.expand(list(sizes)).reshape(-1)
