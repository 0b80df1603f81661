"""Embedding lookups: rows of a 2-D table gathered by integer indices (kEmbedding)."""

import math

import torch

from ..blob_format import Opcode
from .common import FLOAT, INT, dtype, shape, val
from .registry import Family

aten = torch.ops.aten
family = Family(__name__)


def _embedding_check(node, ctx):
    weight, indices = node.args[:2]
    if val(weight).dim() != 2:
        return "embedding weight is not 2-D"
    if dtype(indices) not in INT:
        return f"indices dtype {dtype(indices)}"
    return None if dtype(weight) in FLOAT else f"embedding weight dtype {dtype(weight)}"


@family.lowers(aten.embedding.default, check=_embedding_check)
def _embedding(lw, node):
    weight, indices = node.args[:2]
    vocab, dim = shape(weight)
    out = lw.new(node)
    lw.g.add_op(Opcode.EMBEDDING, weight=lw.tensor(weight), indices=lw.tensor(indices),
                out=out, num_indices=math.prod(shape(indices)), dim=dim, vocab=vocab)
    return out
