"""Kiln's operator table: every ATen overload Kiln runs, registered once, in the module of its
family, with its support check and its lowering (registry.py says how).

Adding an operator is a change to one family module (plus its test in
tests/python/aot/test_operators.py): register the overload there with `family.register(...)` or
`@family.lowers(...)`. supported_ops.py and the lowering read everything from `OPS`.
"""

from . import (binary, constants, embedding, matmul, normalization, reductions, spatial, state,
               unary, views, indexing, movement, attention, resampling, volumetric)
from .registry import (CONSTANT, NOT_SUPPORTED, OPS, SHAPE_ONLY, STATE_UPDATE, UNINITIALIZED,
                       VIEW, OpDef, with_trait)

FAMILIES = (binary, unary, matmul, views, normalization, spatial, reductions, embedding, state,
            constants, indexing, movement, attention, resampling, volumetric)

__all__ = ["CONSTANT", "FAMILIES", "NOT_SUPPORTED", "OPS", "OpDef", "SHAPE_ONLY", "STATE_UPDATE",
           "UNINITIALIZED", "VIEW", "with_trait"]
