"""Reference semantics of the dense opcodes: kMatmul (with its epilogues and residual),
kQuantMatmul, kConv2d and kPool2d."""

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
    m.write(out, None, _activation(y, epilogue))


def _quantized_rows(packed, N, K, bits):
    """The [N, K] integers of kQuantMatmul's packed weight (op_table.def): rows of
    4 * ceil(K * bits / 128) Int32 words, element k in byte k (bits 8) or in nibble k % 2 (low
    first) of byte k / 2 (bits 4), two's complement."""
    words = -(-K * bits // 128) * 4
    if packed.numel() != N * words:
        raise BlobExecutionError(f"packed weight has {packed.numel()} words, N * row_words is "
                                 f"{N * words}")
    rows = packed.contiguous().view(torch.uint8).reshape(N, words * 4).to(torch.int64)
    if bits == 8:
        q = rows[:, :K]
        return torch.where(q >= 128, q - 256, q)
    q = torch.stack([rows & 0xF, rows >> 4], 2).reshape(N, -1)[:, :K]
    return torch.where(q >= 8, q - 16, q)


@semantics(Opcode.QUANT_MATMUL)
def _quant_matmul(m, x, weight, scales, bias, out, M, N, K, bits, group_size, epilogue,
                  residual):
    q = _quantized_rows(m.read(weight), N, K, bits).to(m.fp)
    s = m.read(scales).to(m.fp).reshape(N, K // group_size)
    w = q * s.repeat_interleave(group_size, dim=1)
    y = m.read(x).to(m.fp).reshape(M, K) @ w.t()
    if bias >= 0:
        y = y + m.read(bias).to(m.fp).reshape(1, N)
    if residual >= 0:
        y = y + m.read(residual).to(m.fp).reshape(M, N)
    m.write(out, None, _activation(y, epilogue))


def _activation(y, epilogue):
    """An op's epilogue activation applied to its (fp32 / fp64) result."""
    epilogue = Epilogue(epilogue)
    if epilogue == Epilogue.RELU:
        return torch.relu(y)
    if epilogue == Epilogue.GELU_ERF:
        return F.gelu(y)
    if epilogue == Epilogue.GELU_TANH:
        return F.gelu(y, approximate="tanh")
    if epilogue == Epilogue.RELU6:
        return torch.clamp(y, 0.0, 6.0)
    if epilogue == Epilogue.SILU:
        return F.silu(y)
    if epilogue == Epilogue.HARDSWISH:
        return F.hardswish(y)
    if epilogue == Epilogue.SIGMOID:
        return torch.sigmoid(y)
    return y


def _image(m, tid, n, c, h, w, channels_last):
    """Tensor `tid` as a logical [n, c, h, w] image stored NCHW, or NHWC when channels_last."""
    v = m.read(tid).to(m.fp)
    return v.reshape(n, h, w, c).permute(0, 3, 1, 2) if channels_last else v.reshape(n, c, h, w)


def _write_image(m, out, y, channels_last):
    m.write(out, None, y.permute(0, 2, 3, 1).contiguous() if channels_last else y)


@semantics(Opcode.CONV2D)
def _conv2d(m, x, weight, bias, out, N, C_in, H, W, C_out, kH, kW, stride_h, stride_w,
            pad_h, pad_w, dil_h, dil_w, groups, H_out, W_out, epilogue, residual, channels_last):
    v = _image(m, x, N, C_in, H, W, channels_last)
    # channels_last: the weight is KRSC, [C_out, kH, kW, C_in / groups].
    w = _image(m, weight, C_out, C_in // groups, kH, kW, channels_last)
    b = m.read(bias).to(m.fp) if bias >= 0 else None
    y = F.conv2d(v, w, b, (stride_h, stride_w), (pad_h, pad_w), (dil_h, dil_w), groups)
    if tuple(y.shape) != (N, C_out, H_out, W_out):
        raise BlobExecutionError(f"conv2d output is {list(y.shape)}, operands say "
                                 f"{[N, C_out, H_out, W_out]}")
    if residual >= 0:
        y = y + _image(m, residual, N, C_out, H_out, W_out, channels_last)
    _write_image(m, out, _activation(y, epilogue), channels_last)


@semantics(Opcode.POOL2D)
def _pool2d(m, kind, x, out, N, C, H, W, kH, kW, stride_h, stride_w, pad_h, pad_w, dil_h,
            dil_w, H_out, W_out, count_include_pad, channels_last):
    is_max = PoolKind(kind) == PoolKind.MAX
    v = _image(m, x, N, C, H, W, channels_last)
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
        _write_image(m, out, windows.amax(dim=0), channels_last)
        return
    h0, w0 = oh - pad_h, ow - pad_w
    h1, w1 = torch.clamp(h0 + kH, max=H + pad_h), torch.clamp(w0 + kW, max=W + pad_w)
    if not count_include_pad:
        h0, w0 = h0.clamp(min=0), w0.clamp(min=0)
        h1, w1 = h1.clamp(max=H), w1.clamp(max=W)
    divisor = ((h1 - h0)[:, None] * (w1 - w0)[None, :]).to(m.fp)
    _write_image(m, out, windows.sum(dim=0) / divisor, channels_last)
