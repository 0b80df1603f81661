// The per-op checks the op table cannot state as simple relations (op_table.def states those):
// shape arithmetic, strided extents, dtype rules that depend on a kind, and the fused program.
// Each check() is written against the op's Args struct, after the table decoding succeeded.
#include <string>

#include "format/op_decoder_internal.h"
#include "format/quant_layout.h"

namespace kiln::engine::op_decoder {
namespace {

int64_t numel_of(OpDecoder& d, uint32_t rank, const int64_t* sizes) {
  int64_t n = 1;
  for (uint32_t i = 0; i < rank && d.ok(); ++i) {
    n = d.product("the element count of sizes", {n, sizes[i]});
  }
  return n;
}

bool is_compare_or_logical(blob::BinaryKind k) {
  return k >= blob::BinaryKind::kEq && k <= blob::BinaryKind::kLogicalOr;
}

bool is_floating_kind(blob::UnaryKind k) { return k != blob::UnaryKind::kLogicalNot; }

// floor((in + 2 * pad - dil * (k - 1) - 1) / stride) + 1, the convolution / pooling output size.
int64_t window_count(OpDecoder& d, const char* axis, int64_t in, int64_t pad, int64_t dil,
                     int64_t k, int64_t stride, bool* ceil_ok) {
  int64_t padded, reach, span;
  if (__builtin_mul_overflow(pad, 2, &padded) || __builtin_add_overflow(in, padded, &padded) ||
      __builtin_mul_overflow(dil, k - 1, &reach) || __builtin_add_overflow(reach, 1, &reach) ||
      __builtin_sub_overflow(padded, reach, &span)) {
    d.fail("output size along %s overflows int64", axis);
    return 0;
  }
  if (span < 0) {
    d.fail("the dilated kernel along %s (%lld) is larger than the padded input (%lld)", axis,
           ll(reach), ll(padded));
    return 0;
  }
  *ceil_ok = span % stride != 0;
  return span / stride + 1;
}

}  // namespace

void check(OpDecoder& d, const CopyArgs& a) {
  table_checks(d, a);
  numel_of(d, a.rank, a.sizes);
  d.check_extent("x", a.x, a.rank, a.sizes, a.in_offset, a.in_strides);
  d.check_extent("out", a.out, a.rank, a.sizes, a.out_offset, a.out_strides);
}

void check(OpDecoder& d, const BinaryArgs& a) {
  table_checks(d, a);
  d.require_numel(a.out, "out", numel_of(d, a.rank, a.sizes), "sizes");
  d.check_extent("a", a.a, a.rank, a.sizes, 0, a.a_strides);
  if (a.b != kNoTensor) {
    d.check_extent("b", a.b, a.rank, a.sizes, 0, a.b_strides);
  }
  if (is_compare_or_logical(a.kind)) {
    d.require_dtype(a.out, "out", d.t(a.out).dtype == blob::DType::kBool,
                    "Bool for a comparison or logical kind");
  }
}

void check(OpDecoder& d, const UnaryArgs& a) {
  table_checks(d, a);
  d.require_numel(a.out, "out", d.t(a.x).numel, "the element count of x");
  if (a.kind == blob::UnaryKind::kLogicalNot) {
    d.require_dtype(a.out, "out", d.t(a.out).dtype == blob::DType::kBool, "Bool for logical_not");
  }
}

void check(OpDecoder& d, const WhereArgs& a) {
  table_checks(d, a);
  d.require_numel(a.out, "out", numel_of(d, a.rank, a.sizes), "sizes");
  d.check_extent("cond", a.cond, a.rank, a.sizes, 0, a.cond_strides);
  d.check_extent("a", a.a, a.rank, a.sizes, 0, a.a_strides);
  d.check_extent("b", a.b, a.rank, a.sizes, 0, a.b_strides);
}

void check(OpDecoder& d, const MatmulArgs& a) {
  table_checks(d, a);
  if (d.ok() && d.t(a.out).dtype != d.t(a.a).dtype && d.t(a.out).dtype != blob::DType::kFloat32) {
    d.fail("out (tensor %lld) is %s, expected %s (as a) or Float32", ll(a.out),
           dtype_name(d.t(a.out).dtype), dtype_name(d.t(a.a).dtype));
  }
  d.require_floating(a.bias, "bias");
  // Each batch reads one dense M x K (K x M) matrix of a and K x N (N x K) of b.
  const int64_t a_matrix = d.product("M * K", {a.m, a.k});
  const int64_t b_matrix = d.product("K * N", {a.k, a.n});
  const int64_t one = 1;
  const int64_t a_sizes[2] = {a.batch, a_matrix};
  const int64_t a_strides[2] = {a.a_batch_stride, one};
  d.check_extent("a", a.a, 2, a_sizes, 0, a_strides);
  const int64_t b_sizes[2] = {a.batch, b_matrix};
  const int64_t b_strides[2] = {a.b_batch_stride, one};
  d.check_extent("b", a.b, 2, b_sizes, 0, b_strides);
  const int64_t out_numel = d.product("batch * M * N", {a.batch, a.m, a.n});
  d.require_numel(a.out, "out", out_numel, "batch * M * N");
  if (a.residual != kNoTensor) {
    d.require_same_dtype(a.residual, "residual", a.out, "out");
    d.require_numel(a.residual, "residual", out_numel, "batch * M * N");
  }
  if (a.bias != kNoTensor) {
    const int64_t bias_sizes[3] = {a.batch, a.m, a.n};
    const int64_t bias_strides[3] = {0, a.bias_row_stride, a.bias_col_stride};
    d.check_extent("bias", a.bias, 3, bias_sizes, 0, bias_strides);
  }
}

void check(OpDecoder& d, const ReduceArgs& a) {
  table_checks(d, a);
  const int64_t kept = d.product("outer * inner", {a.outer, a.inner});
  const blob::DType out = d.ok() ? d.t(a.out).dtype : blob::DType::kBool;
  if (a.kind == blob::ReduceKind::kAny) {
    d.require_dtype(a.out, "out", out == blob::DType::kBool, "Bool for any");
  } else if (a.kind == blob::ReduceKind::kMean) {
    d.require_dtype(a.out, "out", is_floating(out), "a floating dtype for mean");
  }
  const bool arg = a.kind == blob::ReduceKind::kArgmax || a.kind == blob::ReduceKind::kArgmin;
  if (arg) {
    d.require_dtype(a.out, "out", out == blob::DType::kInt64, "Int64 for argmax/argmin");
  } else if (a.kind == blob::ReduceKind::kMedian) {
    d.require_same_dtype(a.out, "out", a.x, "x");
  }
  if (d.ok() && a.reduce == 0 && kept > 0 &&
      (arg || a.kind == blob::ReduceKind::kAmax || a.kind == blob::ReduceKind::kAmin ||
       a.kind == blob::ReduceKind::kMedian)) {
    d.fail("amax/amin/argmax/argmin/median over an empty axis (reduce = 0) has no identity");
  }
}

void check(OpDecoder& d, const Conv2dArgs& a) {
  if (a.c_in % a.groups != 0 || a.c_out % a.groups != 0) {
    d.fail("groups (%lld) must divide C_in (%lld) and C_out (%lld)", ll(a.groups), ll(a.c_in),
           ll(a.c_out));
    return;
  }
  bool unused;
  const int64_t h_out = window_count(d, "H", a.h, a.pad_h, a.dil_h, a.kh, a.stride_h, &unused);
  const int64_t w_out = window_count(d, "W", a.w, a.pad_w, a.dil_w, a.kw, a.stride_w, &unused);
  if (d.ok() && (h_out != a.h_out || w_out != a.w_out)) {
    d.fail(
        "H_out x W_out is %lld x %lld, but the input, kernel, stride, padding and dilation give "
        "%lld x %lld",
        ll(a.h_out), ll(a.w_out), ll(h_out), ll(w_out));
  }
  d.require_numel(a.x, "x", d.product("N * C_in * H * W", {a.n, a.c_in, a.h, a.w}),
                  "N * C_in * H * W");
  d.require_numel(
      a.weight, "weight",
      d.product("C_out * C_in / groups * kH * kW", {a.c_out, a.c_in / a.groups, a.kh, a.kw}),
      "C_out * C_in / groups * kH * kW");
  if (a.bias != kNoTensor) {
    d.require_numel(a.bias, "bias", a.c_out, "C_out");
  }
  d.require_numel(a.out, "out",
                  d.product("N * C_out * H_out * W_out", {a.n, a.c_out, a.h_out, a.w_out}),
                  "N * C_out * H_out * W_out");
  d.require_floating(a.x, "x");
  d.require_same_dtype(a.weight, "weight", a.x, "x");
  d.require_same_dtype(a.out, "out", a.x, "x");
  d.require_floating(a.bias, "bias");
  if (a.residual != kNoTensor) {
    d.require_same_dtype(a.residual, "residual", a.out, "out");
    d.require_numel(a.residual, "residual",
                    d.product("N * C_out * H_out * W_out", {a.n, a.c_out, a.h_out, a.w_out}),
                    "N * C_out * H_out * W_out");
  }
  table_checks(d, a);
}

void check(OpDecoder& d, const Pool2dArgs& a) {
  if (a.kind == blob::PoolKind::kAvg && (a.dil_h != 1 || a.dil_w != 1)) {
    d.fail("average pooling has no dilation, but dil_h x dil_w is %lld x %lld", ll(a.dil_h),
           ll(a.dil_w));
    return;
  }
  // ceil_mode is folded into H_out / W_out: either the floor count or one more.
  bool h_ceil = false;
  bool w_ceil = false;
  const int64_t h_out = window_count(d, "H", a.h, a.pad_h, a.dil_h, a.kh, a.stride_h, &h_ceil);
  const int64_t w_out = window_count(d, "W", a.w, a.pad_w, a.dil_w, a.kw, a.stride_w, &w_ceil);
  if (d.ok() && (a.h_out < h_out || a.h_out > h_out + (h_ceil ? 1 : 0) || a.w_out < w_out ||
                 a.w_out > w_out + (w_ceil ? 1 : 0))) {
    d.fail(
        "H_out x W_out is %lld x %lld, but the input, kernel, stride, padding and dilation give "
        "%lld x %lld (floor) or one more along an axis (ceil_mode)",
        ll(a.h_out), ll(a.w_out), ll(h_out), ll(w_out));
  }
  d.require_numel(a.x, "x", d.product("N * C * H * W", {a.n, a.c, a.h, a.w}), "N * C * H * W");
  d.require_numel(a.out, "out", d.product("N * C * H_out * W_out", {a.n, a.c, a.h_out, a.w_out}),
                  "N * C * H_out * W_out");
  d.require_floating(a.x, "x");
  d.require_same_dtype(a.out, "out", a.x, "x");
  table_checks(d, a);
}

// kFusedElementwise: per-input arrays from the inputs / strides lists, and the program decoded
// (and checked) into instructions.
void fill(OpDecoder& d, FusedElementwiseArgs& a) {
  a.out = d.value(KILN_FIELD(FusedElementwise, "out"));
  a.rank = static_cast<uint32_t>(d.value(KILN_FIELD(FusedElementwise, "rank")));
  d.copy_list(KILN_FIELD(FusedElementwise, "sizes"), a.sizes);
  a.num_inputs = static_cast<uint32_t>(d.value(KILN_FIELD(FusedElementwise, "num_inputs")));
  const int64_t* inputs = d.list(KILN_FIELD(FusedElementwise, "inputs"));
  const int64_t* strides = d.list(KILN_FIELD(FusedElementwise, "strides"));
  for (uint32_t i = 0; i < a.num_inputs; ++i) {
    a.inputs[i] = inputs[i];
    for (uint32_t k = 0; k < a.rank; ++k) a.strides[i][k] = strides[i * a.rank + k];
  }
  a.num_instrs = static_cast<uint32_t>(d.value(KILN_FIELD(FusedElementwise, "num_instrs")));
  const size_t program_at = d.position(KILN_FIELD(FusedElementwise, "program"));
  const uint32_t n_in = a.num_inputs;
  for (uint32_t j = 0; j < a.num_instrs && d.ok(); ++j) {
    const size_t at = program_at + size_t{j} * blob::kFusedInstrWidth;
    FusedInstr& in = a.instrs[j];
    in.form =
        d.kind<blob::FusedForm>(at, "program form", "FusedForm", blob::kCount<blob::FusedForm>);
    const int64_t defined = int64_t{n_in} + j;  // registers written before instruction j
    int needed = 1;
    if (in.form == blob::FusedForm::kUnary) {
      const auto k = d.kind<blob::UnaryKind>(at + 1, "program kind", "UnaryKind",
                                             blob::kCount<blob::UnaryKind>);
      if (d.ok() && !is_floating_kind(k)) {
        d.fail("instruction %u: logical_not is not a fused kind", j);
      }
      in.kind = static_cast<int64_t>(k);
    } else if (in.form == blob::FusedForm::kBinary) {
      const auto k = d.kind<blob::BinaryKind>(at + 1, "program kind", "BinaryKind",
                                              blob::kCount<blob::BinaryKind>);
      if (d.ok() && is_compare_or_logical(k)) {
        d.fail("instruction %u: compare and logical kinds are not fused kinds", j);
      }
      in.kind = static_cast<int64_t>(k);
      needed = 2;
    } else {
      in.kind = d.integer(at + 1, "program kind", 0, 0);
      needed = 3;
    }
    for (int s = 0; s < 3 && d.ok(); ++s) {
      const int64_t v = d.raw(at + 2 + s);
      // A binary's second source may be -1 (the scalar); sources past the form's are -1.
      const bool may_be_absent = s >= needed || (in.form == blob::FusedForm::kBinary && s == 1);
      if ((v == -1 && may_be_absent) || (s < needed && v >= 0 && v < defined)) {
        in.src[s] = static_cast<int32_t>(v);
      } else {
        d.fail(
            "instruction %u: source %d is register %lld; it must be one written before "
            "(0..%lld)%s",
            j, s, ll(v), ll(defined - 1), may_be_absent ? " or -1" : "");
      }
    }
    in.p0 = d.real(at + 5);
    in.p1 = d.real(at + 6);
    const int64_t rnd = d.raw(at + 7);
    in.round = static_cast<blob::DType>(rnd);
    if (d.ok() && rnd != static_cast<int64_t>(blob::DType::kFloat32) &&
        rnd != static_cast<int64_t>(blob::DType::kFloat16) &&
        rnd != static_cast<int64_t>(blob::DType::kBFloat16)) {
      d.fail("instruction %u: round dtype %lld is not Float32, Float16 or BFloat16", j, ll(rnd));
    }
  }
}

void check(OpDecoder& d, const FusedElementwiseArgs& a) {
  d.require_numel(a.out, "out", numel_of(d, a.rank, a.sizes), "sizes");
  table_checks(d, a);
  for (uint32_t i = 0; i < a.num_inputs && d.ok(); ++i) {
    const blob::DType dt = d.t(a.inputs[i]).dtype;
    d.require_dtype(a.inputs[i], "an input", is_floating(dt) || dt == blob::DType::kBool,
                    "Float32, Float16, BFloat16 or Bool");
    d.check_extent("an input", a.inputs[i], a.rank, a.sizes, 0, a.strides[i]);
  }
}

void check(OpDecoder& d, const AttentionArgs& a) {
  table_checks(d, a);
  if (d.ok() && a.heads_q % a.heads_kv != 0) {
    d.fail("heads_q (%lld) must be a multiple of heads_kv (%lld)", ll(a.heads_q), ll(a.heads_kv));
    return;
  }
  if (a.mask != kNoTensor && d.ok() && d.t(a.mask).dtype != blob::DType::kBool) {
    d.require_same_dtype(a.mask, "mask", a.q, "q");
  }
  const int64_t one = 1;
  const int64_t q_sizes[4] = {a.batch, a.heads_q, a.seq_q, a.head_dim};
  const int64_t q_strides[4] = {a.q_stride_b, a.q_stride_h, a.q_stride_s, one};
  d.check_extent("q", a.q, 4, q_sizes, a.q_offset, q_strides);
  const int64_t k_sizes[4] = {a.batch, a.heads_kv, a.seq_kv, a.head_dim};
  const int64_t k_strides[4] = {a.k_stride_b, a.k_stride_h, a.k_stride_s, one};
  d.check_extent("k", a.k, 4, k_sizes, a.k_offset, k_strides);
  const int64_t v_sizes[4] = {a.batch, a.heads_kv, a.seq_kv, a.head_dim_v};
  const int64_t v_strides[4] = {a.v_stride_b, a.v_stride_h, a.v_stride_s, one};
  d.check_extent("v", a.v, 4, v_sizes, a.v_offset, v_strides);
  if (a.mask != kNoTensor) {
    const int64_t m_sizes[4] = {a.batch, a.heads_q, a.seq_q, a.seq_kv};
    const int64_t m_strides[4] = {a.mask_stride_b, a.mask_stride_h, a.mask_stride_q,
                                  a.mask_stride_k};
    d.check_extent("mask", a.mask, 4, m_sizes, 0, m_strides);
  }
}

void check(OpDecoder& d, const GatherArgs& a) {
  table_checks(d, a);
  d.require_numel(a.out, "out", numel_of(d, a.rank, a.sizes), "sizes");
  d.check_extent("index", a.index, a.rank, a.sizes, 0, a.index_strides);
  // x is read over `sizes` plus the indexed axis: every in-range index is one of its positions.
  int64_t sizes[blob::kMaxRank + 1];
  int64_t strides[blob::kMaxRank + 1];
  for (uint32_t i = 0; i < a.rank; ++i) {
    sizes[i] = a.sizes[i];
    strides[i] = a.x_strides[i];
  }
  sizes[a.rank] = a.dim_size;
  strides[a.rank] = a.index_stride;
  d.check_extent("x", a.x, a.rank + 1, sizes, 0, strides);
}

// kScatter: per-index arrays from the indices / index_strides / index_out_strides / dim_sizes
// lists.
void fill(OpDecoder& d, ScatterArgs& a) {
  a.values = d.value(KILN_FIELD(Scatter, "values"));
  a.out = d.value(KILN_FIELD(Scatter, "out"));
  a.rank = static_cast<uint32_t>(d.value(KILN_FIELD(Scatter, "rank")));
  d.copy_list(KILN_FIELD(Scatter, "sizes"), a.sizes);
  d.copy_list(KILN_FIELD(Scatter, "out_strides"), a.out_strides);
  d.copy_list(KILN_FIELD(Scatter, "values_strides"), a.values_strides);
  a.num_indices = static_cast<uint32_t>(d.value(KILN_FIELD(Scatter, "num_indices")));
  const int64_t* indices = d.list(KILN_FIELD(Scatter, "indices"));
  const int64_t* strides = d.list(KILN_FIELD(Scatter, "index_strides"));
  const int64_t* out_strides = d.list(KILN_FIELD(Scatter, "index_out_strides"));
  const int64_t* dim_sizes = d.list(KILN_FIELD(Scatter, "dim_sizes"));
  for (uint32_t k = 0; k < a.num_indices; ++k) {
    a.indices[k] = indices[k];
    for (uint32_t e = 0; e < a.rank; ++e) a.index_strides[k][e] = strides[k * a.rank + e];
    a.index_out_strides[k] = out_strides[k];
    a.dim_sizes[k] = dim_sizes[k];
  }
  a.accumulate = static_cast<uint32_t>(d.value(KILN_FIELD(Scatter, "accumulate")));
}

void check(OpDecoder& d, const ScatterArgs& a) {
  table_checks(d, a);
  d.check_extent("values", a.values, a.rank, a.sizes, 0, a.values_strides);
  // out is written over `sizes` plus one axis per index: every in-range position is one of these.
  int64_t sizes[blob::kMaxRank + blob::kMaxScatterIndices];
  int64_t strides[blob::kMaxRank + blob::kMaxScatterIndices];
  for (uint32_t e = 0; e < a.rank; ++e) {
    sizes[e] = a.sizes[e];
    strides[e] = a.out_strides[e];
  }
  for (uint32_t k = 0; k < a.num_indices && d.ok(); ++k) {
    d.require_class(a.indices[k], "an index", blob::DTypeClass::kIndex);
    d.check_extent("an index", a.indices[k], a.rank, a.sizes, 0, a.index_strides[k]);
    sizes[a.rank + k] = a.dim_sizes[k];
    strides[a.rank + k] = a.index_out_strides[k];
  }
  d.check_extent("out", a.out, a.rank + a.num_indices, sizes, 0, strides);
}

void check(OpDecoder& d, const EmbeddingBagArgs& a) {
  table_checks(d, a);
  if (d.ok() && a.num_bags != a.num_offsets && a.num_bags + 1 != a.num_offsets) {
    d.fail("num_bags (%lld) must be num_offsets (%lld) or one less", ll(a.num_bags),
           ll(a.num_offsets));
  }
}

void check(OpDecoder& d, const RopeArgs& a) {
  table_checks(d, a);
  if (d.ok() && a.sizes[a.rank - 1] % 2 != 0) {
    d.fail("the rotated (last) size %lld must be even: its halves trade places",
           ll(a.sizes[a.rank - 1]));
    return;
  }
  d.require_numel(a.out, "out", numel_of(d, a.rank, a.sizes), "sizes");
  d.check_extent("x", a.x, a.rank, a.sizes, a.x_offset, a.x_strides);
  d.check_extent("cos", a.cos, a.rank, a.sizes, a.cos_offset, a.cos_strides);
  d.check_extent("sin", a.sin, a.rank, a.sizes, a.sin_offset, a.sin_strides);
}

void check(OpDecoder& d, const QuantMatmulArgs& a) {
  table_checks(d, a);
  if (!d.ok()) return;
  if (a.bits != 4 && a.bits != 8) {
    d.fail("bits is %lld: 8 (int8) or 4 (int4) only", ll(a.bits));
    return;
  }
  if (a.group_size != a.k && (a.group_size % 32 != 0 || a.k % a.group_size != 0)) {
    d.fail("group_size %lld must be K (%lld) or a multiple of 32 dividing K", ll(a.group_size),
           ll(a.k));
    return;
  }
  const int64_t row_words = blob::quant_row_words(a.k, a.bits);
  if (row_words < 0) {
    d.fail("a packed row of K = %lld %lld-bit values overflows int64", ll(a.k), ll(a.bits));
    return;
  }
  d.require_dtype(a.weight, "weight", d.t(a.weight).dtype == blob::DType::kInt32,
                  "Int32 (the packed quantized weight)");
  d.require_numel(a.weight, "weight", d.product("N * row_words", {a.n, row_words}),
                  "N * row_words (each packed row of K values padded to 16 bytes)");
  d.require_dtype(a.scales, "scales", d.t(a.scales).dtype == blob::DType::kFloat32, "Float32");
  d.require_numel(a.scales, "scales", d.product("N * K / group_size", {a.n, a.k / a.group_size}),
                  "N * K / group_size");
}

}  // namespace kiln::engine::op_decoder
