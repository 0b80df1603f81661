"""Kiln graph IR: what one delegate computes, between the edge graph and the blob bytes.

Tensors and ops map one to one onto the blob's TensorRecords and OpRecords; the IR adds only what
the builder needs before the bytes are fixed: weight data, and `alias_of` for views that share
another tensor's storage (resolved to the root's storage and offset when the blob is written).
"""

from dataclasses import dataclass, field
from math import prod
from typing import Optional

import torch

from .blob_format import FIELDS, Opcode, Precision, Storage, tensor_fields, tensor_list_fields


@dataclass
class Tensor:
    id: int
    dtype: torch.dtype
    shape: tuple
    storage: Storage = Storage.ARENA
    # kInput/kOutput: delegate argument index; kArena: byte offset set by the memory planner;
    # kWeight, kState: byte offset (of the initial value) set by the blob writer.
    offset: int = 0
    data: Optional[torch.Tensor] = None     # a weight's contents or a state's initial value
    alias_of: Optional[int] = None          # a view: shares the storage of this tensor id
    name: str = ""

    @property
    def numel(self):
        return prod(self.shape)

    @property
    def nbytes(self):
        return self.numel * self.dtype.itemsize


@dataclass
class Op:
    opcode: Opcode
    operands: dict           # field name (as in blob_format.OPERAND_LAYOUTS) -> value

    @property
    def out(self):
        return self.operands["out"]

    def reads(self):
        """Tensor ids this op reads (every tensor operand except `out`; -1 = none dropped)."""
        single = [self.operands[n] for n in tensor_fields(self.opcode)
                  if n != "out" and self.operands[n] >= 0]
        return single + [t for n in tensor_list_fields(self.opcode) for t in self.operands[n]]

    def rename(self, old, new):
        for n in tensor_fields(self.opcode):
            if self.operands[n] == old:
                self.operands[n] = new
        for n in tensor_list_fields(self.opcode):
            self.operands[n] = [new if t == old else t for t in self.operands[n]]


@dataclass
class Graph:
    tensors: list = field(default_factory=list)
    ops: list = field(default_factory=list)
    inputs: list = field(default_factory=list)      # tensor ids, delegate input order
    outputs: list = field(default_factory=list)     # tensor ids, delegate output order
    precision: Precision = Precision.FP32
    arena_size: int = 0

    def add_tensor(self, dtype, shape, **kwargs):
        t = Tensor(len(self.tensors), dtype, tuple(int(s) for s in shape), **kwargs)
        self.tensors.append(t)
        return t.id

    def add_weight(self, data, name=""):
        data = data.detach().contiguous()
        return self.add_tensor(data.dtype, data.shape, storage=Storage.WEIGHT, data=data, name=name)

    def add_state(self, initial, name=""):
        """Program state (a mutated buffer) that persists across runs, starting as `initial`."""
        data = initial.detach().contiguous().clone()
        return self.add_tensor(data.dtype, data.shape, storage=Storage.STATE, data=data, name=name)

    def add_alias(self, base, shape, name=""):
        """A tensor with another shape over the same bytes as `base` (a contiguous view)."""
        b = self.tensors[base]
        return self.add_tensor(b.dtype, shape, alias_of=self.root(base), name=name)

    def add_op(self, opcode, **operands):
        missing = {n for _, n in FIELDS[opcode]} - operands.keys()
        if missing:
            raise ValueError(f"{opcode.name} is missing operands {sorted(missing)}")
        self.ops.append(Op(opcode, operands))
        return self.ops[-1]

    def root(self, tid):
        while self.tensors[tid].alias_of is not None:
            tid = self.tensors[tid].alias_of
        return tid
