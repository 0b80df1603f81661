"""The operator registry (kiln_executorch/aot/ops): each ATen overload Kiln runs is registered
once, in one family module, with a support check and a lowering; the partitioner's and the
lowering's tables are derived from it."""

import pytest
import torch

from kiln_executorch.aot import ops, supported_ops
from kiln_executorch.aot.blob_format import Opcode
from kiln_executorch.aot.ops.registry import TRAITS, Family
from kiln_testing.reference.machine import SEMANTICS

FAMILY_NAMES = {m.__name__.rsplit(".", 1)[-1] for m in ops.FAMILIES}


@pytest.mark.parametrize("op", list(ops.OPS), ids=str)
def test_every_registered_operator_has_a_check_and_a_lowering(op):
    d = ops.OPS[op]
    assert isinstance(op, torch._ops.OpOverload) and d.overload is op
    assert d.family in FAMILY_NAMES, d.family
    assert callable(d.check)
    assert d.traits <= set(TRAITS), d.traits
    # Constant-only ops are evaluated by the lowering; every other op has a converter.
    assert (d.lower is None) == (ops.CONSTANT in d.traits)
    assert d.lower is None or callable(d.lower)
    assert ops.SHAPE_ONLY not in d.traits or ops.CONSTANT in d.traits


def test_every_family_module_registers_operators():
    assert FAMILY_NAMES == {d.family for d in ops.OPS.values()}


def test_refused_operators_are_not_registered_and_say_why():
    assert ops.NOT_SUPPORTED
    for op, reason in ops.NOT_SUPPORTED.items():
        assert isinstance(op, torch._ops.OpOverload) and op not in ops.OPS
        assert isinstance(reason, str) and reason.strip()


def test_partitioner_tables_are_derived_from_the_registry():
    assert supported_ops.SUPPORTED_OPS == {op: d.check for op, d in ops.OPS.items()}
    for name, trait in [("CONSTANT_ONLY", ops.CONSTANT), ("SHAPE_ONLY", ops.SHAPE_ONLY),
                        ("VIEWS", ops.VIEW), ("STATE_UPDATES", ops.STATE_UPDATE)]:
        assert getattr(supported_ops, name) == {op for op, d in ops.OPS.items()
                                                 if trait in d.traits}, name


def test_an_overload_cannot_be_registered_twice_or_be_anything_else():
    family = Family("kiln_executorch.aot.ops.test")
    taken = next(iter(ops.OPS))
    with pytest.raises(ValueError, match="registered twice"):
        family.register(taken, lambda node, ctx: None, lambda lw, node: None)
    with pytest.raises(ValueError, match="registered twice"):
        family.refuse(next(iter(ops.NOT_SUPPORTED)), "again")
    with pytest.raises(TypeError, match="not an OpOverload"):
        family.register(torch.ops.aten.add, lambda node, ctx: None, lambda lw, node: None)
    with pytest.raises(ValueError, match="lowering is required"):
        family.register(torch.ops.aten.trace.default, lambda node, ctx: None)
    assert torch.ops.aten.trace.default not in ops.OPS


def test_every_opcode_has_reference_semantics():
    assert set(SEMANTICS) == set(Opcode)
