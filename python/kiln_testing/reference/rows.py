"""Reference semantics of the row-wise opcodes: kSoftmax, kLayerNorm, kReduce, kCumsum,
kEmbedding, kEmbeddingBag, kIndexPut (the state write), kGather and kScatter."""

import torch

from kiln_executorch.aot.blob_format import BagMode, Opcode, ReduceKind

from .machine import BlobExecutionError, semantics, strided_index


@semantics(Opcode.SOFTMAX)
def _softmax(m, x, out, outer, dim, inner, is_log):
    v = m.read(x).to(m.fp).reshape(outer, dim, inner)
    m.write(out, None, (torch.log_softmax if is_log else torch.softmax)(v, dim=1))


@semantics(Opcode.LAYER_NORM)
def _layer_norm(m, x, weight, bias, out, rows, cols, eps, rms):
    v = m.read(x).to(m.fp).reshape(rows, cols)
    mean = torch.zeros_like(v[:, :1]) if rms else v.mean(dim=1, keepdim=True)
    var = ((v - mean) ** 2).mean(dim=1, keepdim=True)
    y = (v - mean) / torch.sqrt(var + eps)
    if weight >= 0:
        y = y * m.read(weight).to(m.fp)
    if bias >= 0:
        y = y + m.read(bias).to(m.fp)
    m.write(out, None, y)


@semantics(Opcode.REDUCE)
def _reduce(m, kind, x, out, outer, reduce, inner):
    kind = ReduceKind(kind)
    v = m.read(x).reshape(outer, reduce, inner)
    if kind == ReduceKind.ANY:
        m.write(out, None, (v != 0).any(dim=1))
        return
    if kind in (ReduceKind.ARGMAX, ReduceKind.ARGMIN):
        # torch's own: NaN is the extreme, the first index wins a tie.
        m.write(out, None, (v.argmax if kind == ReduceKind.ARGMAX else v.argmin)(dim=1))
        return
    if kind == ReduceKind.MEDIAN:   # the lower median, NaN when the axis holds one
        m.write(out, None, v.median(dim=1).values)
        return
    floating = m.g.tensors[out].dtype.is_floating_point
    v = v.to(m.fp if floating or kind == ReduceKind.MEAN else torch.int64)
    y = {ReduceKind.SUM: lambda: v.sum(dim=1), ReduceKind.MEAN: lambda: v.mean(dim=1),
         ReduceKind.AMAX: lambda: v.amax(dim=1), ReduceKind.AMIN: lambda: v.amin(dim=1)}[kind]()
    m.write(out, None, y)


@semantics(Opcode.CUMSUM)
def _cumsum(m, x, out, outer, dim, inner):
    v = m.read(x).reshape(outer, dim, inner)
    v = v.to(m.fp if v.dtype.is_floating_point else torch.int64)
    m.write(out, None, v.cumsum(dim=1))


@semantics(Opcode.EMBEDDING)
def _embedding(m, weight, indices, out, num_indices, dim, vocab):
    idx = m.read(indices).to(torch.int64)[:num_indices]
    bad = (idx < 0) | (idx >= vocab)
    if bool(bad.any()):
        raise BlobExecutionError(f"embedding index {int(idx[bad][0])} outside [0, {vocab})")
    w = m.read(weight)[:vocab * dim].reshape(vocab, dim)
    m.write(out, None, w[idx])


@semantics(Opcode.EMBEDDING_BAG)
def _embedding_bag(m, weight, indices, offsets, out, mode, num_indices, num_offsets, num_bags,
                   dim, vocab):
    idx = m.read(indices).to(torch.int64)
    off = m.read(offsets).to(torch.int64)
    w = m.read(weight).reshape(vocab, dim).to(m.fp)
    reduce = {BagMode.SUM: lambda r: r.sum(0), BagMode.MEAN: lambda r: r.mean(0),
              BagMode.MAX: lambda r: r.amax(0)}[BagMode(mode)]
    rows = []
    for b in range(num_bags):
        start, end = int(off[b]), int(off[b + 1]) if b + 1 < num_offsets else num_indices
        if start < 0 or end < start or end > num_indices:
            raise BlobExecutionError(f"embedding_bag bag {b} is [{start}, {end}), outside "
                                     f"[0, {num_indices}]")
        bag = idx[start:end]
        bad = (bag < 0) | (bag >= vocab)
        if bool(bad.any()):
            raise BlobExecutionError(f"embedding_bag index {int(bag[bad][0])} outside "
                                     f"[0, {vocab})")
        rows.append(reduce(w[bag]) if len(bag) else torch.zeros(dim, dtype=m.fp))
    m.write(out, None, torch.stack(rows) if rows else torch.zeros(0))


@semantics(Opcode.INDEX_PUT)
def _index_put(m, values, positions, out, outer, dim_size, inner, num_positions):
    pos = m.read(positions).to(torch.int64)[:num_positions]
    bad = (pos < 0) | (pos >= dim_size)
    if bool(bad.any()):
        raise BlobExecutionError(f"index_put position {int(pos[bad][0])} outside "
                                 f"[0, {dim_size})")
    v = m.read(values)
    if v.numel() != outer * num_positions * inner:
        raise BlobExecutionError(f"index_put values have {v.numel()} elements, operands say "
                                 f"{outer * num_positions * inner}")
    rows = (torch.arange(outer).reshape(outer, 1, 1) * dim_size + pos.reshape(1, -1, 1)) * inner
    m.write(out, (rows + torch.arange(inner).reshape(1, 1, inner)).reshape(-1), v)


@semantics(Opcode.GATHER)
def _gather(m, x, index, out, rank, sizes, x_strides, index_strides, index_stride, dim_size):
    i = m.gather(index, strided_index(sizes, index_strides)).to(torch.int64)
    bad = (i < -dim_size) | (i >= dim_size)
    if bool(bad.any()):
        raise BlobExecutionError(f"gather index {int(i[bad][0])} outside [-{dim_size}, "
                                 f"{dim_size})")
    i = torch.where(i < 0, i + dim_size, i)
    m.write(out, None, m.gather(x, strided_index(sizes, x_strides) + i * index_stride))


@semantics(Opcode.SCATTER)
def _scatter(m, values, out, rank, sizes, out_strides, values_strides, num_indices, indices,
             index_strides, index_out_strides, dim_sizes, accumulate):
    at = strided_index(sizes, out_strides)
    for k in range(num_indices):
        n = dim_sizes[k]
        i = m.gather(indices[k], strided_index(sizes, index_strides[k * rank:(k + 1) * rank]))
        i = i.to(torch.int64)
        bad = (i < -n) | (i >= n)
        if bool(bad.any()):
            raise BlobExecutionError(f"index_put index {int(i[bad][0])} outside [-{n}, {n})")
        at = at + torch.where(i < 0, i + n, i) * index_out_strides[k]
    v = m.gather(values, strided_index(sizes, values_strides))
    if not accumulate:
        m.write(out, at, v)
        return
    floating = m.g.tensors[out].dtype.is_floating_point
    total = m.read(out).to(m.fp if floating else torch.int64)
    total.index_put_((at,), v.to(total.dtype), accumulate=True)
    if m.g.tensors[out].dtype == torch.bool:
        total = total != 0
    m.write(out, None, total)
