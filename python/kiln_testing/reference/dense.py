"""Reference semantics of the dense opcodes: kMatmul (with its epilogues and residual), kConv2d
and kPool2d."""

import math

import torch
import torch.nn.functional as F

from kiln_executorch.aot.blob_format import Epilogue, Opcode, PoolKind

from .machine import BlobExecutionError, semantics, strided_index


def _matrix(m, tid, g, batch_stride, rows, cols, transposed):
    """The g-th row-major matrix of `tid` as [rows, cols] (stored as [cols, rows] when
    transposed)."""
    start = g * batch_stride
    x = m.read(tid)
    if start < 0 or start + rows * cols > x.numel():
        raise BlobExecutionError(f"tensor {tid}: matrix {g} exceeds its {x.numel()} elements")
    m = x[start:start + rows * cols].to(m.fp)
    return m.reshape(cols, rows).t() if transposed else m.reshape(rows, cols)


@semantics(Opcode.MATMUL)
def _matmul(m, a, b, bias, out, batch, M, N, K, trans_a, trans_b, a_batch_stride,
            b_batch_stride, bias_row_stride, bias_col_stride, alpha, beta, epilogue,
            residual):
    results = []
    for g in range(batch):
        y = alpha * (_matrix(m, a, g, a_batch_stride, M, K, trans_a) @
                     _matrix(m, b, g, b_batch_stride, K, N, trans_b))
        if bias >= 0:
            y = y + beta * m.gather(bias, strided_index(
                [M, N], [bias_row_stride, bias_col_stride])).to(m.fp).reshape(M, N)
        results.append(y)
    y = torch.stack(results) if results else torch.empty(0, dtype=m.fp)
    if residual >= 0:
        y = y + m.read(residual).to(m.fp).reshape(y.shape)
    epilogue = Epilogue(epilogue)
    if epilogue == Epilogue.RELU:
        y = torch.relu(y)
    elif epilogue == Epilogue.GELU_ERF:
        y = F.gelu(y)
    elif epilogue == Epilogue.GELU_TANH:
        y = F.gelu(y, approximate="tanh")
    m.write(out, None, y)


@semantics(Opcode.CONV2D)
def _conv2d(m, x, weight, bias, out, N, C_in, H, W, C_out, kH, kW, stride_h, stride_w,
            pad_h, pad_w, dil_h, dil_w, groups, H_out, W_out):
    v = m.read(x).to(m.fp).reshape(N, C_in, H, W)
    w = m.read(weight).to(m.fp).reshape(C_out, C_in // groups, kH, kW)
    b = m.read(bias).to(m.fp) if bias >= 0 else None
    y = F.conv2d(v, w, b, (stride_h, stride_w), (pad_h, pad_w), (dil_h, dil_w), groups)
    if tuple(y.shape) != (N, C_out, H_out, W_out):
        raise BlobExecutionError(f"conv2d output is {list(y.shape)}, operands say "
                                 f"{[N, C_out, H_out, W_out]}")
    m.write(out, None, y)


@semantics(Opcode.POOL2D)
def _pool2d(m, kind, x, out, N, C, H, W, kH, kW, stride_h, stride_w, pad_h, pad_w, dil_h,
            dil_w, H_out, W_out, count_include_pad):
    is_max = PoolKind(kind) == PoolKind.MAX
    v = m.read(x).to(m.fp).reshape(N, C, H, W)
    # Pad far enough that every window of every output position lies inside the buffer.
    extra_h = max(0, (H_out - 1) * stride_h + (kH - 1) * dil_h + 1 - (H + 2 * pad_h))
    extra_w = max(0, (W_out - 1) * stride_w + (kW - 1) * dil_w + 1 - (W + 2 * pad_w))
    fill = -math.inf if is_max else 0.0
    v = F.pad(v, (pad_w, pad_w + extra_w, pad_h, pad_h + extra_h), value=fill)
    oh = torch.arange(H_out) * stride_h
    ow = torch.arange(W_out) * stride_w
    windows = torch.stack([v[:, :, (oh + i * dil_h)[:, None], (ow + j * dil_w)[None, :]]
                           for i in range(kH) for j in range(kW)])
    if is_max:
        m.write(out, None, windows.amax(dim=0))
        return
    h0, w0 = oh - pad_h, ow - pad_w
    h1, w1 = torch.clamp(h0 + kH, max=H + pad_h), torch.clamp(w0 + kW, max=W + pad_w)
    if not count_include_pad:
        h0, w0 = h0.clamp(min=0), w0.clamp(min=0)
        h1, w1 = h1.clamp(max=H), w1.clamp(max=W)
    divisor = ((h1 - h0)[:, None] * (w1 - w0)[None, :]).to(m.fp)
    m.write(out, None, windows.sum(dim=0) / divisor)
