"""Creation ops (full, zeros, ones, arange, scalar_tensor, empty and their _like forms): the
lowering evaluates them ahead of time, which static shapes always allow; a value whose elements are all
equal is written by kFill, any other is stored as a weight. Never an op of their own."""

import torch

from .common import arguments, shape
from .registry import CONSTANT, SHAPE_ONLY, UNINITIALIZED, Family

aten = torch.ops.aten
family = Family(__name__)


def _constant_check(node, ctx):
    return None


for _op in (aten.full.default, aten.zeros.default, aten.ones.default,
            aten.scalar_tensor.default, aten.arange.default, aten.arange.start,
            aten.arange.start_step):
    family.register(_op, _constant_check, traits=[CONSTANT])
# Results that depend on the shape and dtype of their input, never on its values.
for _op in (aten.full_like.default, aten.zeros_like.default, aten.ones_like.default):
    family.register(_op, _constant_check, traits=[CONSTANT, SHAPE_ONLY])


def _empty_check(node, ctx):
    """empty (ExecuTorch's _empty_dim_order: circular padding builds its output from one): its
    elements are unspecified until written, so zeros are as good as any; only the contiguous
    dim order."""
    order = arguments(node).get("dim_order")
    if order is not None and list(order) != list(range(len(shape(node)))):
        return f"dim order {list(order)} (Kiln's tensors are contiguous)"
    return None


for _op in (aten.empty.memory_format, torch.ops.dim_order_ops._empty_dim_order.default):
    family.register(_op, _empty_check, traits=[CONSTANT, UNINITIALIZED])
