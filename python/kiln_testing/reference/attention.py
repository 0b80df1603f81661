"""Reference semantics of kAttention (scaled-dot-product attention)."""

import torch

from kiln_executorch.aot.blob_format import Opcode

from .machine import semantics, strided_index


@semantics(Opcode.ATTENTION)
def _attention(m, q, k, v, mask, out, batch, heads_q, heads_kv, seq_q, seq_kv, head_dim,
               head_dim_v, q_offset, k_offset, v_offset, q_stride_b, q_stride_h, q_stride_s,
               k_stride_b, k_stride_h, k_stride_s, v_stride_b, v_stride_h, v_stride_s,
               mask_stride_b, mask_stride_h, mask_stride_q, mask_stride_k, causal, scale,
               out_stride_b, out_stride_h, out_stride_s):
    def read(tid, heads, seq, dim, offset, strides):
        index = offset + strided_index([batch, heads, seq, dim], list(strides) + [1])
        return m.gather(tid, index).to(m.fp).reshape(batch, heads, seq, dim)

    qv = read(q, heads_q, seq_q, head_dim, q_offset, (q_stride_b, q_stride_h, q_stride_s))
    group = heads_q // heads_kv
    kv = read(k, heads_kv, seq_kv, head_dim, k_offset, (k_stride_b, k_stride_h, k_stride_s))
    vv = read(v, heads_kv, seq_kv, head_dim_v, v_offset,
              (v_stride_b, v_stride_h, v_stride_s))
    kv, vv = kv.repeat_interleave(group, dim=1), vv.repeat_interleave(group, dim=1)
    scores = scale * (qv @ kv.transpose(-1, -2))
    keep = torch.ones(seq_q, seq_kv, dtype=torch.bool)
    if causal:
        keep = keep.tril()
    keep = keep.expand(batch, heads_q, seq_q, seq_kv)
    if mask >= 0:
        index = strided_index([batch, heads_q, seq_q, seq_kv],
                              [mask_stride_b, mask_stride_h, mask_stride_q, mask_stride_k])
        mv = m.gather(mask, index).reshape(batch, heads_q, seq_q, seq_kv)
        if mv.dtype == torch.bool:
            keep = keep & mv
        else:
            scores = scores + mv.to(m.fp)
    scores = scores.masked_fill(~keep, float("-inf"))
    # A row with every key masked out is 0 (torch's safe softmax), not NaN.
    dead = (scores == float("-inf")).all(dim=-1, keepdim=True)
    p = torch.softmax(scores.masked_fill(dead, 0.0), dim=-1).masked_fill(dead, 0.0)
    index = strided_index([batch, heads_q, seq_q, head_dim_v],
                          [out_stride_b, out_stride_h, out_stride_s, 1])
    m.write(out, index, p @ vv)
