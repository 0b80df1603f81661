"""Weight-only quantization of a matmul's constant weight, as kQuantMatmul stores it (format/
op_table.def): symmetric integers with one fp32 scale per output channel (int8) or per group of
K (int4), packed into Int32 words, each row padded to whole 16-byte vectors.

    int8: scale[n] = max|W[n, :]| / 127 (1 for a zero row), q = round(W / scale) in [-127, 127]
    int4: scale[n, g] = max|W[n, group g]| / 7 (1 for a zero group), q = round(W / scale) in
          [-7, 7], groups of 128 ("int4"), 64 ("int4_g64") or 32 ("int4_g32") consecutive values
          of K (a weight whose K the group does not divide is not quantized: supports() says so)

Needs only torch (the GPU check dequantizes HF models with it on a machine without executorch).
"""

import math

import torch

# weights= choice -> (bits, group size: None = K, one scale per output channel)
SCHEMES = {"int8": (8, None), "int4": (4, 128), "int4_g64": (4, 64), "int4_g32": (4, 32)}
ROW_ALIGNMENT = 16   # bytes: kQuantMatmul's vector loads (format/quant_layout.h)


def row_words(k, bits):
    """Int32 words per packed row of k values (format/quant_layout.h's quant_row_words)."""
    return math.ceil(k * bits / (8 * ROW_ALIGNMENT)) * (ROW_ALIGNMENT // 4)


def supports(scheme, k):
    """Whether `scheme` can quantize a weight of k columns (K): its group must divide k."""
    group = SCHEMES[scheme][1]
    return k > 0 and (group is None or k % group == 0)


def quantize(weight, scheme="int8"):
    """[N, K] floating weight -> (packed Int32 [N, row_words], Float32 scales [N, K / group],
    bits, group_size)."""
    bits, group = SCHEMES[scheme]
    w = weight.detach().to(torch.float32)
    n, k = w.shape
    group = k if group is None else group
    qmax = 2 ** (bits - 1) - 1
    grouped = w.reshape(n, k // group, group)
    scales = grouped.abs().amax(dim=2) / qmax
    scales = torch.where(scales > 0, scales, torch.ones_like(scales))
    q = torch.round(grouped / scales.unsqueeze(2)).clamp(-qmax, qmax).to(torch.int8).reshape(n, k)
    packed = torch.zeros(n, row_words(k, bits) * 4, dtype=torch.uint8)
    if bits == 8:
        packed[:, :k] = q.view(torch.uint8)
    else:
        nib = (q & 0xF).to(torch.uint8)
        if k % 2:
            nib = torch.cat([nib, torch.zeros(n, 1, dtype=torch.uint8)], 1)
        packed[:, :nib.shape[1] // 2] = nib[:, 0::2] | (nib[:, 1::2] << 4)
    return packed.view(torch.int32), scales.contiguous(), bits, group


def unpack(packed, k, bits):
    """The [N, k] int8 values of a packed weight."""
    b = packed.contiguous().view(torch.uint8).reshape(packed.shape[0], -1)
    if bits == 8:
        return b[:, :k].view(torch.int8)
    lo, hi = (b & 0xF).to(torch.int16), (b >> 4).to(torch.int16)
    nib = torch.stack([lo, hi], 2).reshape(b.shape[0], -1)[:, :k]
    return torch.where(nib >= 8, nib - 16, nib).to(torch.int8)


def dequantize(packed, scales, k, bits, group_size):
    """The fp32 [N, k] weight a packed weight and its scales stand for."""
    q = unpack(packed, k, bits).to(torch.float32)
    return q * scales.to(torch.float32).repeat_interleave(group_size, dim=1)


def fake_quantize(weight, scheme="int8"):
    """`weight` replaced by what Kiln computes with under `scheme`: quantized, dequantized, in
    its own dtype (the eager reference of a quantized program)."""
    packed, scales, bits, group = quantize(weight, scheme)
    return dequantize(packed, scales, weight.shape[1], bits, group).to(weight.dtype)


def fake_quantize_linears(model, scheme="int8"):
    """Replaces, in place, the weight of every torch.nn.Linear in `model` by its fake_quantize:
    the eager model whose answers a program exported with weights=`scheme` should give. Each gets
    a new Parameter, so a weight tied to an embedding (an LM head) leaves the embedding as it was,
    as the export does. Returns `model`."""
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, torch.nn.Linear):
                module.weight = torch.nn.Parameter(fake_quantize(module.weight, scheme),
                                                   requires_grad=False)
    return model
