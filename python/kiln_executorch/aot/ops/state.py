"""Writes into program state: mutated buffers the delegate owns (e.g. a KV cache), updated in
place by kIndexPut. The copy_ that writes state back after the graph is refused on purpose.
Every other index_put (one whose result is not a buffer's new value) is indexing.put's."""

import math

import torch

from ..blob_format import Opcode, Storage
from . import indexing
from .common import INT, arguments, dtype, shape, val
from .registry import STATE_UPDATE, Family

aten = torch.ops.aten
family = Family(__name__)


def _index_put_check(node, ctx):
    """The KV-cache write: rows of a mutated buffer replaced at positions a 1-D integer tensor
    gives along one dim, the result being the buffer's new value. Kiln then owns the buffer as
    state on the device (the partitioner tags it into the partition)."""
    args = arguments(node)
    state, indices, values = args["self"], args["indices"], args["values"]
    update = getattr(ctx, "buffer_update", None)
    if update is None or update(state) is not node:
        if node in getattr(ctx, "updates", {}).values():
            return ("index_put computing a program buffer's new value from another tensor: "
                    "Kiln updates a buffer it owns only in place (index_put into the buffer)")
        return indexing.put_check(node)
    if args["accumulate"]:
        return "index_put with accumulate=True into a program buffer (Kiln replaces the " \
               "rows of state it owns, it does not add to them)"
    if len(state.users) != 1:
        return (f"buffer {state.name} is also read before its update; Kiln writes it in place, so "
                "every reader must read the updated value")
    written = [(d, i) for d, i in enumerate(indices) if i is not None]
    if len(written) != 1:
        return f"index_put with {len(written)} index tensors: Kiln writes along exactly one dim"
    dim, positions = written[0]
    if not isinstance(positions, torch.fx.Node) or val(positions).dim() != 1 or \
            dtype(positions) not in INT:
        return "the positions must be a 1-D Int64 or Int32 tensor"
    if not isinstance(values, torch.fx.Node):
        return f"values {values!r} is not a tensor"
    target = list(val(state).shape)
    target[dim] = val(positions).shape[0]
    got = tuple(val(values).shape)
    if dtype(values) != dtype(state):
        return f"values dtype {dtype(values)} differs from the buffer's {dtype(state)}"
    if math.prod(got) != math.prod(target) or \
            tuple(torch.broadcast_shapes(got, tuple(target))) != tuple(target):
        return f"values of shape {list(got)} for rows of shape {target} (no broadcasting)"
    return None


@family.lowers(aten.index_put.default, check=_index_put_check, traits=[STATE_UPDATE])
def _index_put(lw, node):
    """Writes the rows into the state tensor in place; the node's value is the state. Into any
    other tensor (the check admitted it as a general index_put) it is indexing.put."""
    args = arguments(node)
    state = lw.tensor(args["self"])
    if lw.g.tensors[state].storage != Storage.STATE:
        return indexing.put(lw, node)
    (dim, positions), = [(d, i) for d, i in enumerate(args["indices"]) if i is not None]
    sizes = shape(args["self"])
    lw.g.add_op(Opcode.INDEX_PUT, values=lw.tensor(args["values"]),
                positions=lw.tensor(positions), out=state, outer=math.prod(sizes[:dim]),
                dim_size=sizes[dim], inner=math.prod(sizes[dim + 1:]),
                num_positions=shape(positions)[0])
    return state


family.refuse(aten.copy_.default,
              "copy_ writes back program state after the graph (to_executorch adds it); Kiln "
              "updates the state it owns with index_put")
