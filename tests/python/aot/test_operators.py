"""Every supported operator, lowered by Kiln and run through the reference interpreter, gives eager
PyTorch's answer; and the partitioner's decision (with its reason) for operators it refuses."""

import operator

import pytest
import torch
import torch.nn.functional as F
from executorch.exir import EdgeCompileConfig, to_edge
from torch import nn

from kiln_executorch.aot import KilnPartitioner, lower
from kiln_executorch.aot.supported_ops import aten_op
from kiln_testing.reference import run_program

g = torch.Generator().manual_seed(0)


def randn(*shape):
    return torch.randn(*shape, generator=g)


def randint(high, *shape, dtype=torch.int64):
    return torch.randint(0, high, shape, generator=g, dtype=dtype)


def seeded(*shape, seed=16):
    """randn from a generator of its own (the cases appended last keep `g`'s sequence for the
    tests that draw from it after CASES)."""
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


class Fn(nn.Module):
    def __init__(self, fn, **modules):
        super().__init__()
        self.fn = fn
        for name, m in modules.items():
            setattr(self, name, m)

    def forward(self, *args):
        return self.fn(self, *args)


def bn(channels, seed=1, kind=nn.BatchNorm2d):
    m = kind(channels)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        m.running_mean.copy_(torch.randn(channels, generator=gen) * 0.2)
        m.running_var.copy_(torch.rand(channels, generator=gen) + 0.5)
        m.weight.copy_(torch.randn(channels, generator=gen) * 0.2 + 1)
        m.bias.copy_(torch.randn(channels, generator=gen) * 0.1)
    return m


def _rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


def _rope(x, cos, sin):
    """HF's apply_rotary_pos_emb for one tensor."""
    return x * cos + _rotate_half(x) * sin


x45, y45 = randn(4, 5), randn(4, 5)
x4d = randn(2, 4, 9, 7)
CASES = {
    # Binary arithmetic, broadcasting, alpha, scalars, type promotion.
    "add_alpha": (lambda m, x, y: torch.add(x, y, alpha=2.5), (x45, y45)),
    "add_broadcast": (lambda m, x, y: x + y, (randn(4, 1, 8), randn(3, 1))),
    "sub_scalar": (lambda m, x: x - 3.5, (x45,)),
    "rsub_scalar": (lambda m, x: 2 - x, (x45,)),
    "mul_scalar": (lambda m, x: x * 0.25, (x45,)),
    "div": (lambda m, x, y: x / (y.abs() + 0.5), (x45, y45)),
    "div_floor": (lambda m, x, y: torch.div(x, y.abs() + 0.5, rounding_mode="floor"), (x45, y45)),
    # trunc division: the quotient, then trunc (negative quotients round toward zero).
    "div_trunc": (lambda m, x, y: torch.div(x * 3, y.abs() + 0.5, rounding_mode="trunc"), (x45, y45)),
    "remainder": (lambda m, x: torch.remainder(x, 0.7), (x45,)),
    "maximum_minimum": (lambda m, x, y: torch.maximum(x, y) - torch.minimum(x, y), (x45, y45)),
    "pow_tensor": (lambda m, x, y: x.abs() ** y, (x45, y45)),
    "int_arithmetic": (lambda m, i: (i * 3 + 1) // 2 - i % 4, (randint(50, 3, 4),)),
    "int_plus_float": (lambda m, i, x: i + x, (randint(9, 4, 5), x45)),
    "bool_times_float": (lambda m, x: (x > 0) * x, (x45,)),
    # Comparisons and logic (Bool results).
    "compare_tensor": (lambda m, x, y: torch.stack(
        [x == y, x != y, x < y, x <= y, x > y, x >= y]).int(), (x45, x45.round())),
    "compare_scalar": (lambda m, x: (x > 0.5) | ((x <= -0.5) & ~(x == 1.0)), (x45,)),
    "where": (lambda m, x, y: torch.where(x > y, x, y * 2), (x45, y45)),
    "where_scalar_branches": (lambda m, x: torch.where(x > 0, 1.0, -x), (x45,)),
    # Unary.
    "relu": (lambda m, x: torch.relu(x), (x45,)),
    "gelu": (lambda m, x: F.gelu(x), (x45,)),
    "gelu_tanh": (lambda m, x: F.gelu(x, approximate="tanh"), (x45,)),
    "sigmoid_tanh_silu": (lambda m, x: torch.sigmoid(x) + torch.tanh(x) * F.silu(x), (x45,)),
    "exp_log": (lambda m, x: torch.exp(x) + torch.log(x.abs() + 1), (x45,)),
    "cos_sin": (lambda m, x: torch.cos(x) * torch.sin(x), (x45,)),
    "rsqrt_sqrt": (lambda m, x: torch.rsqrt(x.abs() + 0.1) + torch.sqrt(x.abs()), (x45,)),
    "neg_abs": (lambda m, x: -x + x.abs(), (x45,)),
    "hardswish_hardsigmoid": (lambda m, x: F.hardswish(x * 4) + F.hardsigmoid(x * 4), (x45,)),
    "pow_scalar": (lambda m, x: x ** 3, (x45,)),
    "clamp": (lambda m, x: torch.clamp(x, -0.5, 0.75), (x45,)),
    "clamp_min": (lambda m, x: torch.clamp(x, min=-0.25), (x45,)),
    "hardtanh_relu6": (lambda m, x: F.hardtanh(x, -0.3, 0.7) + F.relu6(x * 8), (x45,)),
    "leaky_relu": (lambda m, x: F.leaky_relu(x, 0.2), (x45,)),
    "erf_reciprocal": (lambda m, x: torch.erf(x) + torch.reciprocal(x.abs() + 1), (x45,)),
    # Up to the poles and past them: erfinv(+-1) = +-inf, |x| > 1 gives NaN.
    "erfinv": (lambda m, x: torch.erfinv(x), (torch.tensor(
        [-2, -1, -0.999999, -0.5, -0.0, 0, 0.3, 0.99, 0.9999, 1 - 2**-24, 1, 3]),)),
    "tanh_erfinv": (lambda m, x: torch.erfinv(torch.tanh(x)), (x45,)),
    "int_relu_clamp": (lambda m, i: torch.clamp(torch.relu(i - 4), max=3), (randint(9, 4, 5),)),
    # Matmul family.
    "mm": (lambda m, x, y: x @ y, (randn(4, 6), randn(6, 3))),
    "mm_transposed_activation": (lambda m, x, y: x @ y.t(), (randn(4, 6), randn(3, 6))),
    "bmm": (lambda m, x, y: torch.bmm(x, y), (randn(2, 4, 6), randn(2, 6, 3))),
    "bmm_transposed": (lambda m, x, y: x @ y.transpose(1, 2), (randn(2, 4, 6), randn(2, 3, 6))),
    "addmm_alpha_beta": (lambda m, b, x, y: torch.addmm(b, x, y, beta=0.5, alpha=2.0),
                         (randn(4, 3), randn(4, 6), randn(6, 3))),
    "linear_3d": (lambda m, x: m.lin(x), (randn(2, 3, 8),), dict(lin=nn.Linear(8, 5))),
    "linear_no_bias_relu": (lambda m, x: torch.relu(m.lin(x)), (randn(3, 8),),
                            dict(lin=nn.Linear(8, 5, bias=False))),
    # Data movement and views.
    "permute_transpose": (lambda m, x: x.permute(2, 0, 1).transpose(0, 2) + 1, (randn(3, 4, 5),)),
    "expand": (lambda m, x: x.expand(3, 4, 5) * 2, (randn(4, 1),)),
    "view_squeeze_unsqueeze": (lambda m, x: (x.reshape(2, 10).unsqueeze(1) * 2).squeeze(1),
                               (x45,)),
    "clone": (lambda m, x: (x * 2).clone() + 1, (x45,)),
    "cat": (lambda m, x, y: torch.cat([x, y * 2, x[:1]], dim=0), (x45, y45)),
    "slice_select": (lambda m, x: x[:, 1:6:2] + x[:, 3].unsqueeze(1) + x[-2:, -3:-1].sum(),
                     (randn(4, 8),)),
    "prefix_select_slice": (lambda m, x: x.reshape(3, 4, 5)[0] * 2 + x[:4].reshape(4, 5),
                            (randn(12, 5),)),
    "to_dtype": (lambda m, x: (x * 3).to(torch.int32), (x45,)),
    "to_half": (lambda m, x: (x * 3).to(torch.float16), (x45,)),
    "bool_to_float": (lambda m, x: (x > 0).float() + 1, (x45,)),
    # Normalisation.
    "softmax": (lambda m, x: torch.softmax(x, dim=1), (randn(2, 5, 3),)),
    "log_softmax": (lambda m, x: torch.log_softmax(x, dim=-1), (randn(2, 5, 3),)),
    "layer_norm": (lambda m, x: m.ln(x), (randn(2, 3, 8),), dict(ln=nn.LayerNorm(8))),
    "layer_norm_plain": (lambda m, x: F.layer_norm(x, (3, 8)), (randn(2, 3, 8),)),
    "batch_norm": (lambda m, x: m.bn(x), (x4d,), dict(bn=bn(4))),
    # Convolution and pooling.
    "conv_grouped_strided": (lambda m, x: m.conv(x), (x4d,),
                             dict(conv=nn.Conv2d(4, 6, 3, stride=2, padding=1, dilation=2,
                                                 groups=2, bias=False))),
    "conv_bn_relu": (lambda m, x: torch.relu(m.bn(m.conv(x))), (x4d,),
                     dict(conv=nn.Conv2d(4, 5, 3), bn=bn(5))),
    "conv_shared_then_bn": (lambda m, x: m.bn(m.conv(x)) + m.conv(x), (x4d,),
                            dict(conv=nn.Conv2d(4, 5, 3, padding=1), bn=bn(5))),
    "max_pool_ceil": (lambda m, x: F.max_pool2d(x, 3, 2, padding=1, ceil_mode=True), (x4d,)),
    "max_pool_dilated": (lambda m, x: F.max_pool2d(x, 2, 1, dilation=2), (x4d,)),
    "avg_pool": (lambda m, x: F.avg_pool2d(x, 2), (x4d,)),
    "avg_pool_ceil_pad": (lambda m, x: F.avg_pool2d(x, 3, 2, padding=1, ceil_mode=True,
                                                    count_include_pad=False), (x4d,)),
    "avg_pool_ceil_include_pad": (lambda m, x: F.avg_pool2d(x, 3, 2, padding=1, ceil_mode=True),
                                  (x4d,)),
    # Reductions.
    "mean_adjacent": (lambda m, x: x.mean(dim=(-1, -2), keepdim=True), (x4d,)),
    "mean_split_dims": (lambda m, x: x.mean(dim=(1, 3)), (x4d,)),
    "sum_amax_amin": (lambda m, x: x.sum(1) + x.amax(0) - x.amin(1, keepdim=True), (randn(3, 3),)),
    "sum_all_int": (lambda m, i: i.sum(), (randint(9, 4, 5, dtype=torch.int32),)),
    "any": (lambda m, x: torch.any(x > 1.0, dim=1), (x45,)),
    # Embedding and constants.
    "embedding": (lambda m, i: m.emb(i) * 2, (randint(10, 2, 3),), dict(emb=nn.Embedding(10, 4))),
    "embedding_int32": (lambda m, i: m.emb(i) + 1, (randint(10, 5, dtype=torch.int32),),
                        dict(emb=nn.Embedding(10, 4))),
    "arange_full": (lambda m, x: x * torch.arange(5) + torch.full((4, 5), 0.5), (x45,)),
    "full_like_matmul": (lambda m, x: x @ torch.ones(5, 3) + torch.zeros_like(x[:, :3]), (x45,)),
    # Prefix sums (kCumsum): each axis of a 3-D tensor, a row longer than a warp's step, and the
    # integer position ids HF models compute from an attention mask (Bool and int sums are int64).
    "cumsum_dims": (lambda m, x: torch.cat([x.cumsum(0), x.cumsum(1), x.cumsum(-1)]),
                    (randn(3, 5, 4),)),
    "cumsum_long_row": (lambda m, x: torch.cumsum(x, dim=-1), (randn(2, 300),)),
    "cumsum_position_ids": (lambda m, mask: (mask.cumsum(-1) - 1) * mask,
                            (torch.tensor([[0, 0, 1, 1, 1, 1, 1], [1] * 7]),)),
    "cumsum_bool_and_int32": (lambda m, x: (x > 0).cumsum(0) + x.int().cumsum(1),
                              (randn(6, 5) * 3,)),
    "cumsum_to_float": (lambda m, i: torch.cumsum(i, 0, dtype=torch.float32), (randint(9, 5, 3),)),
    "causal_mask": (lambda m, x: x.masked_fill(torch.ones(4, 4, dtype=torch.bool).triu(1),
                                               float("-inf")).softmax(-1), (randn(4, 4),)),
    # RMSNorm as decoders write it (fused into one kLayerNorm with rms set), with a weight over a
    # row one warp takes, and without one over rows a block takes.
    "rms_norm_weight": (lambda m, x: m.w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)),
                        (randn(3, 7, 96) * 2,), dict(w=nn.Parameter(randn(96)))),
    "rms_norm_long_rows": (lambda m, x: x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5),
                           (randn(4, 1000),)),
    # Indexing with index tensors read on the device (kGather); negative indices count from the
    # end. With constant operands (HF's masks from arange) index is evaluated ahead of time.
    "gather": (lambda m, x, i: torch.gather(x, 1, i) * 2, (randn(3, 5), randint(5, 3, 4))),
    "gather_dim0_3d": (lambda m, x, i: torch.gather(x + 1, 0, i), (randn(4, 3, 2),
                                                                   randint(4, 2, 3, 2))),
    "index_select": (lambda m, x, i: x.index_select(1, i) + 1, (randn(3, 6, 2),
                                                                randint(6, 4, dtype=torch.int32))),
    "index_tensor": (lambda m, x, i: x[i] * 2, (randn(6, 3), torch.tensor([[0, -1], [5, 2]]))),
    "index_tensor_middle": (lambda m, x, i: (x * 2)[:, i], (randn(2, 5, 3), torch.tensor([4, 0]))),
    "index_int_table": (lambda m, t, i: t[i] + 1, (randint(50, 7), randint(7, 3, 2))),
    "index_constant_two_tensors": (lambda m, x: x + torch.arange(20).reshape(4, 5)[
        torch.arange(4)[:, None], torch.arange(5)[None]], (x45,)),
    # Several constant index tensors on a computed value: one kGather at precomputed offsets
    # (broadcast index tensors; apart ones, whose dimensions torch moves to the front; negative).
    "index_constant_tensors_on_computed": (lambda m, x: (x * 2)[
        torch.tensor([0, 3, -1])[:, None], torch.tensor([4, 0])], (x45,)),
    "index_constant_tensors_apart": (lambda m, x: (x + 1)[
        torch.tensor([1, 0]), :, torch.tensor([2, -1])], (randn(2, 4, 3),)),
    # index_put on any tensor but owned state: a copy, then a kScatter reading the index tensors
    # on the device (negative ones count from the end; accumulate adds every duplicate).
    "index_put_rows": (lambda m, x, i, v: torch.index_put(x * 2, (i,), v) + 1,
                       (randn(5, 3), torch.tensor([0, -1, 2]), randn(3, 3))),
    "index_put_accumulate_duplicates": (
        lambda m, x, i, v: torch.index_put(x, (i,), v, accumulate=True),
        (randn(5, 2), torch.tensor([1, 1, 3, -4]), randn(4, 2))),
    "index_put_two_indices_broadcast": (
        lambda m, x, i, j, v: torch.index_put(x, (i, j), v),
        (randn(4, 5, 3), torch.tensor([[0], [3]]), torch.tensor([1, 3, -5]), randn(3))),
    "index_put_indices_apart": (
        lambda m, x, i, j, v: torch.ops.aten.index_put(x, [i, None, j], v, True),
        (randn(4, 3, 5), torch.tensor([0, 3]), torch.tensor([-1, 2]), randn(2, 3))),
    "index_put_int_accumulate_int32_index": (
        lambda m, t, i, v: torch.index_put(t, (i,), v, accumulate=True) * 2,
        (randint(50, 6), torch.tensor([5, 0, 5], dtype=torch.int32), randint(9, 3))),
    "index_put_in_place_on_a_clone": (lambda m, x, i, v: x.clone().index_put_((i,), v) * 3,
                                      (randn(4, 2), torch.tensor([3, 1]), randn(2))),
    # Movement: split, flip, roll, padding, as_strided, slice_scatter, copy (kCopy, kFill).
    "split_with_sizes": (lambda m, x: torch.cat(x.split([2, 3], dim=1)[::-1], 1) * 2, (x45,)),
    "chunk": (lambda m, x: x.chunk(2, dim=0)[1] - x.chunk(2, dim=0)[0], (x45,)),
    "alias": (lambda m, x: torch.ops.aten.alias(x * 2) + 1, (x45,)),
    "flip": (lambda m, x: torch.flip(x * 2, [0, 2]), (randn(3, 4, 5),)),
    "roll": (lambda m, x: torch.roll(x * 2, shifts=(1, -2), dims=(0, 2)), (randn(3, 4, 5),)),
    "roll_flat": (lambda m, x: torch.roll(x + 1, 7), (x45,)),
    "constant_pad": (lambda m, x: F.pad(x * 2, (1, 2, 0, 1), value=0.5), (randn(2, 3, 4),)),
    "constant_pad_crop": (lambda m, x: F.pad(x * 2, (-1, 2, 1, -1)), (randn(2, 3, 4),)),
    "as_strided": (lambda m, x: (x * 2).as_strided((3, 2), (1, 3), 1), (x45,)),
    "slice_scatter": (lambda m, x, y: torch.slice_scatter(x * 1, y, dim=1, start=1, end=5, step=2),
                      (randn(4, 8), randn(4, 2))),
    "copy_broadcast_cast": (lambda m, x, y: (x * 1).copy_(y.int()), (x45, randn(5) * 4)),
    # Rounding, logarithms, elu, fmod.
    # round with decimals: halves of the scaled value go to even, negative decimals round to
    # tens; inf and nan pass through.
    "round_decimals": (lambda m, x: torch.stack([torch.round(x, decimals=1), torch.round(x, decimals=2),
                                                 torch.round(x * 1000, decimals=-2)]),
                       (torch.tensor([1.44, 1.45, 1.46, -1.45, 0.125, 2.5, 149.96, float("inf"),
                                      float("-inf"), float("nan")]),)),
    "ceil_floor_trunc_round": (lambda m, x: torch.stack(
        [torch.ceil(x), torch.floor(x), torch.trunc(x), torch.round(x)]),
        (torch.tensor([-2.5, -1.5, -0.5, -0.2, 0.0, 0.5, 1.5, 2.5, 2.7, -3.7]),)),
    "log1p_log2_log10": (lambda m, x: torch.log1p(x.abs()) + torch.log2(x.abs() + 0.1)
                         - torch.log10(x.abs() + 0.2), (x45,)),
    "elu_selu": (lambda m, x: F.elu(x, 0.7) + F.selu(x), (x45,)),
    "fmod": (lambda m, x: torch.fmod(x * 3, 0.7) + torch.fmod(x, x.abs() + 0.5), (x45,)),
    "fmod_int": (lambda m, i: torch.fmod(i - 20, 3) + torch.fmod(i, -4), (randint(40, 4, 5),)),
    # Nearest upsampling by whole factors (one kCopy with zero strides).
    "upsample_nearest": (lambda m, x: F.interpolate(x * 2, scale_factor=(2, 3), mode="nearest"),
                         (randn(1, 2, 3, 4),)),
    "upsample_nearest_size": (lambda m, x: F.interpolate(x + 1, size=(6, 4)), (randn(2, 1, 3, 2),)),
    # Scaled-dot-product attention (kAttention): masks broadcast through strides, causal (square
    # and with more keys than queries), grouped-query heads, q/k/v read strided from projections,
    # an odd head dim, one query, a fully masked row (0, as torch gives), folded constant masks.
    "sdpa": (lambda m, q, k, v: F.scaled_dot_product_attention(q, k, v),
             (randn(2, 3, 10, 64), randn(2, 3, 12, 64), randn(2, 3, 12, 64))),
    "sdpa_scale_rank3_odd_dim": (lambda m, q, k, v: F.scaled_dot_product_attention(
        q, k, v, scale=0.3), (randn(2, 7, 40), randn(2, 9, 40), randn(2, 9, 24))),
    "sdpa_additive_mask_rows": (lambda m, q, k, v, a: F.scaled_dot_product_attention(
        q, k, v, attn_mask=a), (randn(1, 2, 6, 16), randn(1, 2, 8, 16), randn(1, 2, 8, 16),
                                randn(1, 1, 6, 8))),
    "sdpa_additive_mask_keys": (lambda m, q, k, v, a: F.scaled_dot_product_attention(
        q, k, v, attn_mask=a), (randn(2, 2, 5, 16), randn(2, 2, 7, 16), randn(2, 2, 7, 16),
                                randn(2, 1, 1, 7))),
    "sdpa_bool_mask_dead_row": (lambda m, q, k, v, a: F.scaled_dot_product_attention(
        q, k, v, attn_mask=(a > 0) & (torch.arange(5)[:, None] > 0)),
        (randn(1, 2, 5, 8), randn(1, 2, 6, 8), randn(1, 2, 6, 8), randn(1, 2, 5, 6))),
    "sdpa_causal": (lambda m, q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
                    (randn(1, 2, 9, 32), randn(1, 2, 9, 32), randn(1, 2, 9, 32))),
    "sdpa_causal_more_keys": (lambda m, q, k, v: F.scaled_dot_product_attention(
        q, k, v, is_causal=True), (randn(1, 2, 4, 32), randn(1, 2, 11, 32), randn(1, 2, 11, 32))),
    "sdpa_gqa_one_query": (lambda m, q, k, v: F.scaled_dot_product_attention(
        q, k, v, enable_gqa=True), (randn(1, 8, 1, 64), randn(1, 2, 13, 64), randn(1, 2, 13, 64))),
    "sdpa_projections_strided": (
        lambda m, x: F.scaled_dot_product_attention(
            *(p(x).view(1, 10, 4, 16).transpose(1, 2) for p in (m.q, m.k, m.v)))
        .transpose(1, 2).reshape(1, 10, 64),
        (randn(1, 10, 64),), dict(q=nn.Linear(64, 64), k=nn.Linear(64, 64), v=nn.Linear(64, 64))),
    "sdpa_repeat_kv_constant_causal_mask": (
        lambda m, q, k, v: F.scaled_dot_product_attention(
            q, *(t[:, :, None].expand(1, 2, 3, 7, 16).reshape(1, 6, 7, 16) for t in (k, v)),
            attn_mask=torch.full((7, 7), -1e9).triu(1)[None, None]),
        (randn(1, 6, 7, 16), randn(1, 2, 7, 16), randn(1, 2, 7, 16))),
    "sdpa_constant_zero_mask": (lambda m, q, k, v: F.scaled_dot_product_attention(
        q, k, v, attn_mask=torch.zeros(1, 1, 4, 6)),
        (randn(1, 2, 4, 8), randn(1, 2, 6, 8), randn(1, 2, 6, 8))),
    # Conv nets: epilogues (bias, residual, activation) fused into kConv2d, and channels-last
    # activations between convolutions (the builder's layout pass, the default).
    "conv_bn_add_relu": (lambda m, x: torch.relu(m.bn2(m.conv2(torch.relu(m.bn1(m.conv1(x)))))
                                                 + x), (randn(1, 8, 6, 6),),
                         dict(conv1=nn.Conv2d(8, 8, 3, padding=1, bias=False), bn1=bn(8),
                              conv2=nn.Conv2d(8, 8, 3, padding=1, bias=False), bn2=bn(8, 2))),
    "conv_relu6": (lambda m, x: F.relu6(m.conv(x)), (x4d,), dict(conv=nn.Conv2d(4, 6, 3))),
    "conv_silu": (lambda m, x: F.silu(m.bn(m.conv(x))), (x4d,),
                  dict(conv=nn.Conv2d(4, 6, 3, padding=1), bn=bn(6))),
    "conv_hardswish": (lambda m, x: F.hardswish(m.conv(x)), (x4d,),
                       dict(conv=nn.Conv2d(4, 6, 1))),
    "conv_depthwise": (lambda m, x: F.relu6(m.dw(F.relu6(m.pw(x)))), (x4d,),
                       dict(pw=nn.Conv2d(4, 8, 1), dw=nn.Conv2d(8, 8, 3, stride=2, padding=1,
                                                                groups=8))),
    "conv_maxpool_conv": (lambda m, x: m.c2(F.max_pool2d(torch.relu(m.c1(x)), 3, 2, padding=1)),
                          (x4d,), dict(c1=nn.Conv2d(4, 6, 3, padding=1),
                                       c2=nn.Conv2d(6, 5, 3, padding=1))),
    "conv_avgpool_conv": (lambda m, x: m.c2(F.avg_pool2d(m.c1(x), 2)), (x4d,),
                          dict(c1=nn.Conv2d(4, 6, 3, padding=1), c2=nn.Conv2d(6, 5, 1))),
    "conv_net_gap_linear": (lambda m, x: m.fc(torch.flatten(F.adaptive_avg_pool2d(
        torch.relu(m.bn(m.conv(x))), 1), 1)), (x4d,),
        dict(conv=nn.Conv2d(4, 8, 3, padding=1), bn=bn(8), fc=nn.Linear(8, 3))),
    "conv_view_softmax": (lambda m, x: m.conv(x).flatten(1).softmax(-1), (x4d,),
                          dict(conv=nn.Conv2d(4, 3, 3, padding=(0, 1)))),
    "conv_cat_slice": (lambda m, x: torch.cat([m.conv(x), x[:, :2, 1:8]], 1)[:, 1:, ::2], (x4d,),
                       dict(conv=nn.Conv2d(4, 3, 3, padding=(0, 1)))),
    "conv_se_block": (lambda m, x: m.c2(m.c1(x) * torch.sigmoid(m.fc(F.adaptive_avg_pool2d(
        m.c1(x), 1)))), (x4d,), dict(c1=nn.Conv2d(4, 6, 3, padding=1), fc=nn.Conv2d(6, 6, 1),
                                     c2=nn.Conv2d(6, 4, 1))),
    # argmax / argmin (kReduce's arg kinds, Int64 out): along a dim with keepdim, over everything,
    # the first index on ties and NaN as the extreme (torch's rules), a row a block takes,
    # integer inputs down columns.
    "argmax_argmin_keepdim": (lambda m, x: x.argmax(1, keepdim=True) + x.argmin(-1, keepdim=True),
                              (randn(3, 4, 5),)),
    "argmax_argmin_flat": (lambda m, x: torch.stack(
        [x.argmax(), x.argmin(), (x * 2).argmax(0)[1]]), (randn(4, 5),)),
    "argmax_argmin_ties_nan": (lambda m, x, y: torch.stack(
        [x.argmax(-1), x.argmin(-1), y.argmax(-1), y.argmin(-1)]),
        (torch.tensor([[1.0, 3.0, 3.0, -2.0, -2.0], [0.0, 0.0, 0.0, 0.0, 0.0]]),
         torch.tensor([[1.0, float("nan"), 3.0, float("nan"), -1.0],
                       [-float("inf"), -float("inf"), float("inf"), float("inf"), 0.0]]))),
    "argmax_long_rows": (lambda m, x: x.argmax(-1) - x.argmin(1), (randn(3, 3000),)),
    "argmax_int_columns": (lambda m, i: i.argmax(0) * 10 + i.int().argmin(0),
                           (randint(4, 6, 7),)),
    # 1-D convolutions (a kConv2d of height 1): Whisper's encoder stem (k=3, pad=1, stride 1 then
    # 2, gelu after each, then [B, T, C]), grouped and dilated with a folded BatchNorm1d, and a
    # 1x1 convolution of a length-1 sequence (a GEMM).
    "conv1d_whisper_stem": (lambda m, x: F.gelu(m.c2(F.gelu(m.c1(x)))).permute(0, 2, 1),
                            (randn(1, 8, 20),),
                            dict(c1=nn.Conv1d(8, 16, 3, padding=1),
                                 c2=nn.Conv1d(16, 16, 3, stride=2, padding=1))),
    "conv1d_grouped_dilated_bn": (lambda m, x: torch.relu(m.bn(m.conv(x))), (randn(2, 4, 15),),
                                  dict(conv=nn.Conv1d(4, 6, 3, dilation=2, groups=2, bias=False),
                                       bn=bn(6, kind=nn.BatchNorm1d))),
    "conv1d_pointwise_length_1": (lambda m, x: m.conv(x) + 1, (randn(3, 4, 1),),
                                  dict(conv=nn.Conv1d(4, 5, 1))),
    "conv1d_residual_block": (lambda m, x: torch.relu(m.c2(torch.relu(m.c1(x))) + m.c1(x)),
                              (randn(2, 8, 12),), dict(c1=nn.Conv1d(8, 8, 3, padding=1),
                                                       c2=nn.Conv1d(8, 8, 5, padding=2))),
    # Resampling (resampling.py: gathers at torch's source positions, weighted sums, matrices):
    # bilinear by a scale factor, by a size with align_corners, down; nearest by fractional sizes
    # and by a fractional factor whose size happens to be a whole multiple (torch reads
    # floor(i / 3.1) there, not i // 3); adaptive average and max pools with windows that do not
    # divide the input and with uniform ones (a kPool2d); 1-D pools (torch pools them as 2-D).
    "upsample_bilinear_scale": (lambda m, x: F.interpolate(x * 2, scale_factor=1.5,
                                                           mode="bilinear"), (randn(1, 2, 5, 4),)),
    "upsample_bilinear_align_corners": (lambda m, x: F.interpolate(
        x + 1, size=(7, 9), mode="bilinear", align_corners=True), (randn(2, 3, 4, 5),)),
    "upsample_bilinear_2x": (lambda m, x: F.interpolate(x, scale_factor=2, mode="bilinear"),
                             (randn(1, 2, 3, 4),)),
    "upsample_bilinear_down": (lambda m, x: F.interpolate(x, size=(3, 2), mode="bilinear"),
                               (randn(1, 2, 7, 5),)),
    "upsample_nearest_fractional": (lambda m, x: F.interpolate(x * 2, size=(5, 7)),
                                    (randn(1, 2, 3, 4),)),
    "upsample_nearest_fractional_scale": (lambda m, x: F.interpolate(x, scale_factor=(3.1, 1.5)),
                                          (randn(1, 2, 5, 4),)),
    "adaptive_avg_pool_uneven": (lambda m, x: F.adaptive_avg_pool2d(x * 2, (3, 5)),
                                 (randn(1, 2, 7, 9),)),
    "adaptive_avg_pool_uniform": (lambda m, x: F.adaptive_avg_pool2d(x + 1, (2, 3)),
                                  (randn(2, 3, 4, 9),)),
    "adaptive_max_pool_uneven": (lambda m, x: F.adaptive_max_pool2d(x * 2, (3, 4)),
                                 (randn(1, 2, 7, 9),)),
    "adaptive_max_pool_uniform": (lambda m, x: F.adaptive_max_pool2d(x + 1, 2),
                                  (randn(1, 3, 6, 4),)),
    "adaptive_pool1d": (lambda m, x: F.adaptive_avg_pool1d(x, 4) + F.adaptive_max_pool1d(x, 4),
                        (randn(2, 3, 10),)),
    "pool1d": (lambda m, x: F.avg_pool1d(x, 3, 2, padding=1) + F.max_pool1d(x, 3, 2, padding=1),
               (randn(2, 3, 11),)),
    # Transposed convolutions (a kConv2d of the input spread out by the stride, the weight
    # flipped and its channels swapped ahead of time): strided and grouped with output padding,
    # stride 1 (the convolution pads by itself), a padding past the window that crops, 1-D.
    "conv_transpose2d_strided_grouped": (lambda m, x: m.conv(x), (randn(2, 4, 5, 4),),
                                         dict(conv=nn.ConvTranspose2d(4, 6, 3, stride=2, padding=1,
                                                                      output_padding=1,
                                                                      groups=2))),
    "conv_transpose2d_same_relu": (lambda m, x: torch.relu(m.conv(x)), (x4d,),
                                   dict(conv=nn.ConvTranspose2d(4, 3, 3, padding=1))),
    "conv_transpose2d_crop_dilated": (lambda m, x: m.conv(x), (randn(1, 3, 6, 5),),
                                      dict(conv=nn.ConvTranspose2d(3, 2, (3, 2), stride=(2, 3),
                                                                   padding=(3, 1),
                                                                   dilation=(1, 2),
                                                                   bias=False))),
    "conv_transpose1d": (lambda m, x: F.gelu(m.conv(x)), (randn(2, 4, 9),),
                         dict(conv=nn.ConvTranspose1d(4, 3, 4, stride=2, padding=1))),
    # 3-D convolutions (volumetric.py: depth unfolded into channels, one kConv2d): padded, strided
    # and dilated, grouped without bias, a depth of one output (no copy back), a runtime weight,
    # transposed with stride, output padding and groups; 3-D pools as two kPool2d (H, W then D):
    # max with ceil_mode and dilation, average with and without the padding counted; adaptive
    # 3-D pools per axis.
    "conv3d_padded_strided_dilated": (lambda m, x: torch.relu(m.conv(x)), (randn(2, 3, 7, 6, 5),),
                                      dict(conv=nn.Conv3d(3, 4, 3, stride=(2, 1, 2),
                                                          padding=(1, 2, 0),
                                                          dilation=(2, 1, 1)))),
    "conv3d_grouped_no_bias": (lambda m, x: m.conv(x) + 1, (randn(1, 4, 4, 5, 5),),
                               dict(conv=nn.Conv3d(4, 6, (2, 3, 3), groups=2, bias=False))),
    "conv3d_single_output_depth": (lambda m, x: m.conv(x), (randn(1, 2, 3, 4, 4),),
                                   dict(conv=nn.Conv3d(2, 3, 3, padding=(0, 1, 1)))),
    "conv3d_runtime_weight": (lambda m, x, w: F.conv3d(x, w * 2, padding=1),
                              (randn(1, 2, 3, 4, 4), randn(3, 2, 3, 3, 3))),
    "conv_transpose3d_strided_grouped": (lambda m, x: m.conv(x), (randn(1, 4, 3, 4, 3),),
                                         dict(conv=nn.ConvTranspose3d(4, 6, 3, stride=(2, 1, 2),
                                                                      padding=1,
                                                                      output_padding=(1, 0, 1),
                                                                      groups=2))),
    "max_pool3d_ceil_dilated": (lambda m, x: F.max_pool3d(x, 3, 2, padding=1, dilation=(1, 2, 1),
                                                          ceil_mode=True),
                                (randn(2, 3, 7, 8, 6),)),
    "avg_pool3d_pad_counted": (lambda m, x: F.avg_pool3d(x, (2, 3, 3), (2, 2, 1), padding=1,
                                                         ceil_mode=True),
                               (randn(1, 2, 5, 6, 7),)),
    "avg_pool3d_pad_not_counted": (lambda m, x: F.avg_pool3d(x * 2, 3, 2, padding=1,
                                                             count_include_pad=False),
                                   (randn(1, 3, 6, 5, 7),)),
    "adaptive_pools3d": (lambda m, x: F.adaptive_avg_pool3d(x, (2, 3, 4)) +
                         F.adaptive_max_pool3d(x, (2, 3, 4)), (randn(1, 2, 5, 7, 6),)),
    # median (kReduce's median kind: the lower median, NaN when the axis holds one): over
    # everything, along a middle dim of even length with keepdim, integers with ties, NaN rows.
    "median_global": (lambda m, x: torch.median(x * 2), (randn(5, 7),)),
    "median_dim_even_keepdim": (lambda m, x: torch.median(x, 1, keepdim=True).values + 1,
                                (randn(3, 6, 4),)),
    "median_int_ties": (lambda m, i: torch.median(i, -1)[0] * 10 + torch.median(i),
                        (randint(4, 5, 6),)),
    "median_nan": (lambda m, x: torch.median(x, -1).values, (torch.tensor(
        [[1.0, float("nan"), 3.0, 0.5], [4.0, -1.0, 2.0, 2.0]]),)),
    # median.dim's indices (the first position of the median, or of the first NaN: argmax of a
    # mask) and adaptive max pooling's (window gather, argmax, table lookup) in 1-D, 2-D, 3-D.
    "median_indices": (lambda m, x: tuple(torch.median(x * 2, 1, keepdim=True)), (randn(3, 6, 4),)),
    "median_indices_nan_row": (lambda m, x: torch.median(x, -1).indices, (torch.tensor(
        [[1.0, float("nan"), 3.0, float("nan")], [4.0, -1.0, 2.0, 0.5]]),)),
    "adaptive_max_pool_indices": (lambda m, x: F.adaptive_max_pool2d(x, (3, 4), return_indices=True),
                                  (randn(2, 3, 7, 9),)),
    "adaptive_max_pool_indices_uniform": (
        lambda m, x: F.adaptive_max_pool2d(x, 2, return_indices=True)[1] * 2, (randn(1, 2, 4, 6),)),
    "adaptive_max_pool1d_indices": (
        lambda m, x: F.adaptive_max_pool1d(x + 1, 3, return_indices=True), (randn(2, 4, 7),)),
    "adaptive_max_pool3d_indices": (
        lambda m, x: F.adaptive_max_pool3d(x, (2, 3, 2), return_indices=True), (randn(1, 2, 5, 7, 4),)),
    # circular padding: ExecuTorch builds the padded input in an empty tensor (evaluated as a
    # zero fill) with slice copies into it.
    "conv_circular_padding": (lambda m, x, y: (m.c1(x), m.c2(y)), (randn(1, 3, 9), randn(1, 2, 6, 5)),
                              dict(c1=nn.Conv1d(3, 4, 3, padding=1, padding_mode="circular"),
                                   c2=nn.Conv2d(2, 3, 3, padding=(2, 1), padding_mode="circular"))),
    # mean / sum with dtype=: the input cast first, as torch does.
    "mean_int_as_float": (lambda m, i: torch.mean(i, dim=1, dtype=torch.float32), (randint(10, 5, 6),)),
    "sum_as_int32": (lambda m, i: torch.sum(i, dim=0, dtype=torch.int32), (randint(10, 5, 6),)),
    # embedding_bag (kEmbeddingBag, offsets read on the device): each mode, an empty bag with the
    # last offset closing the last bag, Int32 indices, and 2-D input (fixed-size bags).
    "embedding_bag_sum": (lambda m, i, o: m.bag(i, o) * 2, (torch.tensor([1, 2, 4, 5, 4, 3, 2, 9]),
                                                             torch.tensor([0, 4])),
                          dict(bag=nn.EmbeddingBag(10, 3, mode="sum"))),
    "embedding_bag_mean_empty_last_offset": (lambda m, i, o: m.bag(i, o), (
        torch.tensor([1, 2, 4, 5, 4, 3, 2, 9]), torch.tensor([0, 3, 3, 8])),
        dict(bag=nn.EmbeddingBag(10, 5, mode="mean", include_last_offset=True))),
    "embedding_bag_max_int32": (lambda m, i, o: m.bag(i, o), (
        torch.tensor([5, 20, 10, 43, 7], dtype=torch.int32),
        torch.tensor([0, 2, 4], dtype=torch.int32)), dict(bag=nn.EmbeddingBag(50, 10, mode="max"))),
    "embedding_bag_2d_input": (lambda m, i: m.bag(i), (randint(10, 3, 4),),
                               dict(bag=nn.EmbeddingBag(10, 6, mode="max"))),
    # Rotary embedding (rotate-half) as one kRope: q read in place from its projection through
    # the head transpose, cos/sin broadcast over heads; the other operand order; a head dim the
    # vector paths would not take (2 x 5).
    "rope_projection_in_place": (
        lambda m, x, c, s: _rope(m.q(x).view(1, 10, 4, 16).transpose(1, 2), c[:, None],
                                 s[:, None]),
        (randn(1, 10, 64), randn(1, 10, 16), randn(1, 10, 16)), dict(q=nn.Linear(64, 64))),
    "rope_swapped_operands_odd_half": (
        lambda m, x, c, s: s * _rotate_half(x) + c * x, (randn(2, 3, 7, 10), randn(7, 10),
                                                        randn(7, 10))),
    # Attention on GPT-2's packed c_attn output split into q, k and v (getitem of a split, each
    # read in place at its offset), and on chunks of a tensor computed in the program.
    "attention_split_qkv": (lambda m, x: F.scaled_dot_product_attention(
        *(t.view(2, 6, 2, 8).transpose(1, 2) for t in m.qkv(x).split(16, dim=2)),
        is_causal=True).transpose(1, 2).reshape(2, 6, 16), (randn(2, 6, 16),),
        dict(qkv=nn.Linear(16, 48))),
    "attention_chunked_qkv": (lambda m, x: F.scaled_dot_product_attention(
        *torch.tanh(x).chunk(3, dim=-1)), (randn(1, 3, 5, 24),)),
    # aten._adaptive_avg_pool2d to the input's own size (AlexNet's and VGG's classifier input),
    # a view, between two ops and alone (its output then aliases the partition's input);
    # adaptive max to the same size.
    "adaptive_avg_pool_identity": (lambda m, x: m.fc(torch.flatten(F.adaptive_avg_pool2d(
        torch.relu(x), (9, 7)), 1)), (x4d,), dict(fc=nn.Linear(4 * 9 * 7, 5))),
    "adaptive_avg_pool_identity_alone": (lambda m, x: F.adaptive_avg_pool2d(x, (9, 7)), (x4d,)),
    "adaptive_max_pool_identity": (lambda m, x: F.adaptive_max_pool2d(x * 2, (9, 7)) - x,
                                   (x4d,)),
    # Weight-only quantization (a fourth entry: KilnPartitioner options): against eager on the
    # dequantized weights (reference_module). Decode-shaped (M = 1, odd N), M > 16 (chunked) with
    # K not a multiple of 8, a fused residual and relu, int4 in groups of 32.
    "linear_int8_decode": (lambda m, x: m.lin(x), (seeded(1, 64),), dict(lin=nn.Linear(64, 37)),
                           dict(weights="int8")),
    "linear_int8_rows": (lambda m, x: m.lin(x), (seeded(2, 17, 45),), dict(lin=nn.Linear(45, 19)),
                         dict(weights="int8")),
    "linear_int8_residual_relu": (lambda m, x: torch.relu(m.lin(x) + x), (seeded(3, 40),),
                                  dict(lin=nn.Linear(40, 40, bias=False)), dict(weights="int8")),
    "linear_int4_g32": (lambda m, x: m.lin(x), (seeded(5, 96),), dict(lin=nn.Linear(96, 21)),
                        dict(weights="int4_g32")),
}


def build(name):
    fn, inputs, *mods = CASES[name]
    torch.manual_seed(0)
    return Fn(fn, **(mods[0] if mods else {})).eval(), inputs


def case_options(name):
    """The KilnPartitioner options of a case (its fourth entry; none for most)."""
    entry = CASES[name]
    return dict(entry[3]) if len(entry) > 3 else {}


def reference_module(module, options):
    """The eager module a case's program should match: `module` itself, or with weights=...
    a copy whose linears' weights are dequantized as the export quantizes them."""
    if options.get("weights") is None:
        return module
    import copy

    from kiln_executorch.quantize import fake_quantize_linears
    return fake_quantize_linears(copy.deepcopy(module), options["weights"])


def not_delegated(program):
    return [n for n in program.graph.nodes if n.op == "call_function"
            and n.target is not operator.getitem and "call_delegate" not in str(n.target)]


@pytest.mark.parametrize("name", CASES)
def test_operator_matches_eager(name):
    module, inputs = build(name)
    options = case_options(name)
    program = lower(module, inputs, **options).exported_program()
    assert not_delegated(program) == [], "left outside Kiln"
    with torch.no_grad():
        expected = reference_module(module, options)(*inputs)
    expected = tuple(expected) if isinstance(expected, (tuple, list)) else (expected,)
    outputs = run_program(program, inputs)
    assert len(outputs) == len(expected)
    for actual, want in zip(outputs, expected):
        assert actual.dtype == want.dtype and actual.shape == want.shape
        torch.testing.assert_close(actual, want, atol=1e-5, rtol=1e-5, equal_nan=True)


def decisions(module, inputs, exclude_ops=None, **export_kwargs):
    """{op name: [decision per node]} of KilnPartitioner(exclude_ops=exclude_ops).explain on the
    module's edge program."""
    ep = torch.export.export(module, inputs, **export_kwargs)
    config = EdgeCompileConfig(_check_ir_validity=False)
    found = {}
    partitioner = KilnPartitioner(exclude_ops=exclude_ops)
    for d in partitioner.explain(to_edge(ep, compile_config=config)):
        found.setdefault(str(aten_op(d.node)), []).append(d)
    return found


def refused(found, op):
    assert op in found, sorted(found)
    return [d.reason for d in found[op] if not d.supported]


@pytest.mark.parametrize("fn, inputs, op, reason", [
    (lambda m, x, y: torch.div(x, y, rounding_mode="trunc"), (randint(9, 4, 5), randint(9, 4, 5) + 1),
     "aten.div.Tensor_mode", "integer division with rounding_mode='trunc'"),
    (lambda m, x: torch.cumprod(x, 0), (x45,), "aten.cumprod.default",
     "not in Kiln's operator table"),
    (lambda m, x: x * 2, (x45.double(),), "aten.mul.Tensor", "dtype torch.float64"),
    (lambda m, x: torch.sigmoid(x), (randint(5, 3),), "aten.sigmoid.default",
     "floating tensors only"),
    (lambda m, x, w: F.conv_transpose2d(x, w * 2), (randn(1, 4, 8, 8), randn(4, 2, 3, 3)),
     "aten.convolution.default", "transposed convolution with a weight computed at run time"),
    (lambda m, x: F.max_pool3d(x, 2, return_indices=True)[1].float(), (randn(1, 2, 4, 4, 4),),
     "aten.max_pool3d_with_indices.default", "the indices output is used"),
    (lambda m, x: F.avg_pool3d(x, 2, divisor_override=3), (randn(1, 2, 4, 4, 4),),
     "aten.avg_pool3d.default", "divisor_override"),
    (lambda m, x: F.max_pool2d(x, 2, return_indices=True)[1].float(), (x4d,),
     "aten.max_pool2d_with_indices.default", "the indices output is used"),
    (lambda m, x: F.avg_pool2d(x, 2, divisor_override=3), (x4d,), "aten.avg_pool2d.default",
     "divisor_override"),
    (lambda m, x: x.to(memory_format=torch.channels_last) * 2, (x4d,),
     "dim_order_ops._to_dim_order_copy.default", "dim order"),
    (lambda m, x: (x > 0) ^ (x < 1), (x45,), "aten.bitwise_xor.Tensor", "operator table"),
    (lambda m, i: i & 6, (randint(9, 4),), "aten.bitwise_and.Scalar", "operator table"),
    (lambda m, i, j: i | j, (randint(9, 4), randint(9, 4)), "aten.bitwise_or.Tensor",
     "Bool operands only"),
    (lambda m, x: torch.matmul(x.int(), x.int()), (randn(3, 3),), "aten.mm.default",
     "one floating dtype required"),
    (lambda m, x, i, j: x[i, j], (x45, randint(4, 3), randint(5, 3)), "aten.index.Tensor",
     "index with 2 index tensors computed at run time"),
    (lambda m, x, i, v: torch.index_put(x, (i > 0,), v), (x45, randint(3, 4), randn(1)),
     "aten.index_put.default", "Bool masks write a data-dependent set of elements"),
    (lambda m, x, v: torch.index_put(x, (torch.tensor([0]),) * 5, v),
     (randn(2, 2, 2, 2, 2), randn(1)), "aten.index_put.default",
     "index_put with 5 index tensors (Kiln scatters with at most 4)"),
    (lambda m, x, i, v: torch.index_put(x, (i,), v), (x45, randint(4, 2), randn(3, 5)),
     "aten.index_put.default", "values of shape [3, 5] do not broadcast to the indexed shape"),
    (lambda m, x: torch.ops.aten.elu(x, 1.0, 1.0, 2.0), (x45,), "aten.elu.default",
     "input_scale"),
    (lambda m, x: x.argmax(1), (x45.double(),), "aten.argmax.default", "dtype torch.float64"),
    (lambda m, x: torch.mean(x, 1, dtype=torch.float64), (x45,), "aten.mean.dim", "float64"),
    (lambda m, i, o, w: F.embedding_bag(i, m.table, o, mode="sum", per_sample_weights=w),
     (randint(10, 6), torch.tensor([0, 2]), randn(6)), "aten._embedding_bag.default",
     "per_sample_weights"),
])
def test_refused_operators_say_why(fn, inputs, op, reason):
    modules = dict(table=nn.Parameter(randn(10, 3)))
    reasons = refused(decisions(Fn(fn, **modules).eval(), inputs), op)
    assert any(reason in r for r in reasons), reasons


def test_excluded_erfinv_runs_on_the_cpu_between_two_partitions():
    module = Fn(lambda m, x: torch.cos(torch.erfinv(torch.tanh(x))))
    found = decisions(module, (x45,), exclude_ops=["aten.erfinv.default"])
    assert refused(found, "aten.erfinv.default") == [
        "aten.erfinv.default is excluded by KilnPartitioner(exclude_ops=...); ExecuTorch runs it"]
    assert refused(decisions(module, (x45,)), "aten.erfinv.default") == []
    program = lower(module, (x45,), exclude_ops=["aten::erfinv"]).exported_program()
    assert [str(aten_op(n)) for n in not_delegated(program)] == ["aten.erfinv.default"]
    assert len([n for n in program.graph.nodes if "call_delegate" in str(n.target)]) == 2
    (actual,) = run_program(program, (x45,))
    torch.testing.assert_close(actual, module(x45), atol=1e-5, rtol=1e-5)


def test_excluded_operators_are_left_to_executorch_and_say_why():
    module = Fn(lambda m, x: torch.cos(torch.tanh(x)) * 2)
    found = decisions(module, (x45,), exclude_ops=["aten::cos"])
    assert refused(found, "aten.cos.default") == [
        "aten.cos.default is excluded by KilnPartitioner(exclude_ops=...); ExecuTorch runs it"]
    assert refused(found, "aten.tanh.default") == refused(found, "aten.mul.Tensor") == []
    program = lower(module, (x45,), exclude_ops=[torch.ops.aten.cos.default]).exported_program()
    assert [str(aten_op(n)) for n in not_delegated(program)] == ["aten.cos.default"]
    (actual,) = run_program(program, (x45,))
    torch.testing.assert_close(actual, module(x45), atol=1e-5, rtol=1e-5)


def test_an_excluded_name_that_is_no_operator_is_an_error():
    with pytest.raises(ValueError, match="'aten::erfinv.no_such_overload' names no operator"):
        lower(Fn(lambda m, x: torch.erfinv(x)), (x45,),
              exclude_ops=["aten::erfinv.no_such_overload"])
    with pytest.raises(ValueError, match="'aten::no_such_op' names no operator"):
        lower(Fn(lambda m, x: torch.cos(x)), (x45,), exclude_ops=["aten::no_such_op"])
    with pytest.raises(ValueError, match="'aten.cos.no_such_overload' names no operator"):
        KilnPartitioner(exclude_ops=["aten.cos.no_such_overload"])


def test_index_put_into_a_buffer_is_claimed_only_as_an_in_place_update():
    class Cache(nn.Module):
        def __init__(self, accumulate=False):
            super().__init__()
            self.accumulate = accumulate
            self.register_buffer("cache", torch.zeros(4, 5))

        def forward(self, x, pos):
            if self.accumulate:
                self.cache.index_put_((pos,), x, accumulate=True)
            else:
                self.cache.index_copy_(0, pos, x)
            return self.cache * 2

    found = decisions(Cache(), (randn(1, 5), torch.tensor([2])))
    assert refused(found, "aten.index_put.default") == []
    assert refused(found, "aten.mul.Tensor") == []
    found = decisions(Cache(accumulate=True), (randn(1, 5), torch.tensor([2])))
    assert "accumulate=True" in refused(found, "aten.index_put.default")[0]
    # A functional index_put on a user tensor is not program state: a copy and a kScatter.
    found = decisions(Fn(lambda m, t, x, pos: torch.index_put(t, (pos,), x, accumulate=True)),
                      (randn(4, 5), randn(1, 5), torch.tensor([2])))
    assert refused(found, "aten.index_put.default") == []


def test_bounded_symbolic_shapes_are_claimed():
    batch = torch.export.Dim("batch", min=1, max=16)
    found = decisions(Fn(lambda m, x: torch.relu(x) * 2), (randn(4, 3),),
                      dynamic_shapes={"args": ({0: batch},)})
    assert refused(found, "aten.relu.default") == []
    assert refused(found, "aten.mul.Tensor") == []


def test_unbounded_symbolic_shapes_stay_on_cpu():
    found = decisions(Fn(lambda m, x: torch.relu(x) * 2), (randn(4, 3),),
                      dynamic_shapes={"args": ({0: torch.export.Dim("batch")},)})
    assert "no finite upper bound" in refused(found, "aten.relu.default")[0]


def test_symbolic_shapes_past_the_variant_cap_stay_on_cpu():
    batch = torch.export.Dim("batch", min=1, max=100)
    found = decisions(Fn(lambda m, x: torch.relu(x) * 2), (randn(4, 3),),
                      dynamic_shapes={"args": ({0: batch},)})
    assert "more than the 64 shape-specialised plans" in refused(found, "aten.relu.default")[0]


def test_training_batch_norm_stays_on_cpu():
    found = decisions(Fn(lambda m, x: m.bn(x), bn=bn(4)).train(), (x4d,))
    assert refused(found, "aten._native_batch_norm_legit_functional.default")


def test_batch_norm_needs_constant_statistics():
    found = decisions(Fn(lambda m, x, mean: F.batch_norm(x, mean, torch.ones(4))), (x4d, randn(4)))
    reasons = refused(found, "aten._native_batch_norm_legit_no_training.default")
    assert "running_mean is not a constant" in reasons[0]
