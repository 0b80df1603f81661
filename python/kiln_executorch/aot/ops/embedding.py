"""Embedding lookups: rows of a 2-D table gathered by integer indices (kEmbedding), and bags of
them reduced to one row each (kEmbeddingBag, embedding_bag's offsets form)."""

import math

import torch

from ..blob_format import BagMode, Opcode
from .common import FLOAT, INT, arguments, dtype, only_first_output_used, shape, val
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


def _embedding_bag_check(node, ctx):
    args = arguments(node)
    weight, indices, offsets = args["weight"], args["indices"], args["offsets"]
    if args["per_sample_weights"] is not None:
        return "per_sample_weights"
    if args["padding_idx"] is not None and args["padding_idx"] >= 0:
        return f"padding_idx={args['padding_idx']}"
    if val(weight).dim() != 2 or val(indices).dim() != 1 or val(offsets).dim() != 1:
        return "embedding_bag needs a 2-D weight, 1-D indices and 1-D offsets"
    if dtype(indices) not in INT or dtype(offsets) not in INT:
        return f"indices / offsets dtypes {dtype(indices)} / {dtype(offsets)}"
    if dtype(weight) not in FLOAT:
        return f"embedding weight dtype {dtype(weight)}"
    return only_first_output_used(node, "offset2bag / bag_size / max_indices")


@family.lowers(aten._embedding_bag.default, check=_embedding_bag_check)
def _embedding_bag(lw, node):
    """(output, offset2bag, bag_size, max_indices): Kiln computes the output only."""
    args = arguments(node)
    weight, indices, offsets = args["weight"], args["indices"], args["offsets"]
    vocab, dim = shape(weight)
    out = lw.new(node)
    lw.g.add_op(Opcode.EMBEDDING_BAG, weight=lw.tensor(weight), indices=lw.tensor(indices),
                offsets=lw.tensor(offsets), out=out, mode=BagMode(args["mode"]),
                num_indices=shape(indices)[0], num_offsets=shape(offsets)[0],
                num_bags=shape(node)[0], dim=dim, vocab=vocab)
    return out, None, None, None
