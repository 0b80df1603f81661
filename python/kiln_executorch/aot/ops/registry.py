"""The registry every operator family module fills: one `OpDef` per ATen overload Kiln runs.

A family module registers each overload once, with the check the partitioner asks (check(node,
ctx) -> None when Kiln can run the node, else a sentence saying why not) and the lowering the
driver calls (lower(lw, node) -> the tensor id(s) of the node's value, lw being lowering._Lowering).
Everything else is derived from this table: supported_ops.SUPPORTED_OPS and its groups, and the
lowering's dispatch. `NOT_SUPPORTED` holds the overloads Kiln refuses on purpose, with the reason
explain() gives.
"""

from dataclasses import dataclass
from typing import Callable, Optional

import torch

# Op properties the partitioner and the driver read (OpDef.traits).
VIEW = "view"                  # a view of a contiguous tensor: no data moves, no op in the blob
STATE_UPDATE = "state_update"  # writes program state the delegate owns (e.g. a KV cache)
CONSTANT = "constant"          # evaluated ahead of time by the lowering, never an op in the blob
SHAPE_ONLY = "shape_only"      # its value depends on its input's shape and dtype, not its values
UNINITIALIZED = "uninitialized"  # empty: any value is its value until written; evaluated as zeros
TRAITS = (VIEW, STATE_UPDATE, CONSTANT, SHAPE_ONLY, UNINITIALIZED)


@dataclass(frozen=True)
class OpDef:
    overload: torch._ops.OpOverload
    family: str                          # the module that registers it (e.g. "unary")
    check: Callable
    lower: Optional[Callable]            # None for CONSTANT ops: the lowering evaluates them
    traits: frozenset = frozenset()


OPS: dict = {}            # OpOverload -> OpDef, in registration order
NOT_SUPPORTED: dict = {}  # OpOverload -> the reason explain() gives


class Family:
    """The registering side of one family module: `family = Family(__name__)`, then
    `family.register(...)` / `@family.lowers(...)` / `family.refuse(...)`."""

    def __init__(self, module_name):
        self.name = module_name.rsplit(".", 1)[-1]

    def register(self, overload, check, lower=None, traits=()):
        """Registers one ATen overload; registering an overload twice is an error."""
        _fresh(overload)
        traits = frozenset(traits)
        if (lower is None) != (CONSTANT in traits):
            raise ValueError(f"{overload}: a lowering is required exactly when the op is not "
                             f"{CONSTANT}")
        OPS[overload] = OpDef(overload, self.name, check, lower, traits)

    def lowers(self, *overloads, check, traits=()):
        """Decorator form of register: the decorated function lowers every one of `overloads`."""
        def decorate(lower):
            for overload in overloads:
                self.register(overload, check, lower, traits)
            return lower
        return decorate

    def register_kinds(self, check, lower_kind, kinds):
        """Registers the overloads of a table {kind: overload or tuple of overloads}, each checked
        by `check` and lowered by lower_kind(kind) (for opcodes with a kind operand)."""
        for kind, overloads in kinds.items():
            for overload in overloads if isinstance(overloads, tuple) else (overloads,):
                self.register(overload, check, lower_kind(kind))

    def refuse(self, overload, reason):
        """Keeps `overload` out of Kiln on purpose, with the reason explain() gives."""
        _fresh(overload)
        NOT_SUPPORTED[overload] = reason


def _fresh(overload):
    if not isinstance(overload, torch._ops.OpOverload):
        raise TypeError(f"{overload!r} is not an OpOverload")
    if overload in OPS or overload in NOT_SUPPORTED:
        raise ValueError(f"{overload} is registered twice")


def with_trait(trait):
    """The registered overloads that have `trait`."""
    return frozenset(op for op, d in OPS.items() if trait in d.traits)
