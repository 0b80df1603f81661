// kAttention on a GPU against a float64 host reference (engine_gpu_fixture.h says how): plain,
// scaled, additive and Bool masks broadcast through strides, causal (square and with more keys
// than queries), grouped-query heads, q read at an offset and strides from a packed projection,
// odd head dims, one query, long rows (several key tiles) and rows whose every key is masked out
// (0, as torch gives), in fp32, fp16 and bf16. Up to 8 query rows per KV head run on the
// flash-decoding kernel (attention_decode.cu), the rest on the generic one (attention.cu). fp16/bf16 cases without a mask, and masked ones
// of 16 queries or more, run through cuDNN's fused attention (attention_cudnn.h) where it has a
// plan; KILN_ATTENTION=kiln runs them on Kiln's kernel too. The kernel shares memory between warps, so gpu-check.sh sanitize may run
// this binary under racecheck too.
#include "tests/runtime/engine/engine_gpu_fixture.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

namespace kiln::engine::gpu_test {
namespace {

enum class Mask { kNone, kAdditiveRows, kBoolKeys, kDeadRow, kCachePositions };

struct Case {
  int64_t b, hq, hkv, sq, skv, d, dv;
  bool causal = false;
  Mask mask = Mask::kNone;
  bool strided_q = false;
  bool bshd_out = false;  // out written as [B, Sq, Hq, Dv] (out strides), as the builder folds it
};

std::string describe(DType dtype, const Case& c) {
  return std::string(dtype_name(dtype)) + " B" + std::to_string(c.b) + " Hq" +
         std::to_string(c.hq) + " Hkv" + std::to_string(c.hkv) + " Sq" + std::to_string(c.sq) +
         " Skv" + std::to_string(c.skv) + " D" + std::to_string(c.d) + " Dv" +
         std::to_string(c.dv) + (c.causal ? " causal" : "") + " mask" +
         std::to_string(static_cast<int>(c.mask)) + (c.strided_q ? " strided q" : "") +
         (c.bshd_out ? " bshd out" : "");
}

void run_case(DType dtype, const Case& c) {
  OneOp op;
  BlobBuilder::Attention a;
  a.batch = c.b, a.heads_q = c.hq, a.heads_kv = c.hkv, a.seq_q = c.sq, a.seq_kv = c.skv;
  a.head_dim = c.d, a.head_dim_v = c.dv, a.causal = c.causal;
  a.scale = 1.0 / std::sqrt(static_cast<double>(c.d));
  // Strided, q is the second half of a packed [B, Sq, 2, Hq, D] projection output (not yet
  // transposed: an offset and strides); else [B, Hq, Sq, D].
  const HostTensor q = random(dtype, c.strided_q ? Sizes{c.b, c.sq, 2, c.hq, c.d}
                                                 : Sizes{c.b, c.hq, c.sq, c.d});
  const HostTensor k = random(dtype, {c.b, c.hkv, c.skv, c.d});
  const HostTensor v = random(dtype, {c.b, c.hkv, c.skv, c.dv});
  const int64_t packed = c.strided_q ? 2 : 1;
  const int64_t qs[3] = {c.sq * packed * c.hq * c.d, c.strided_q ? c.d : c.sq * c.d,
                         c.strided_q ? packed * c.hq * c.d : c.d};
  const int64_t q_offset = c.strided_q ? c.hq * c.d : 0;
  for (int i = 0; i < 3; ++i) a.q_strides[i] = qs[i];
  a.q_offset = q_offset;
  a.q = op.add_input(q);
  a.k = op.add_input(k);
  a.v = op.add_input(v);
  HostTensor mask{DType::kFloat32, {}, {}};
  int64_t ms[4] = {0, 0, 0, 0};
  if (c.mask == Mask::kAdditiveRows) {  // [1, 1, Sq, Skv], one key of each row at -inf
    mask = random(dtype, {1, 1, c.sq, c.skv}, -3.0, 1.0);
    for (int64_t i = 0; i < c.sq; ++i) mask.v[i * c.skv + (i * 7) % c.skv] = -kInf;
    ms[2] = c.skv, ms[3] = 1;
  } else if (c.mask == Mask::kBoolKeys) {  // [B, 1, 1, Skv]: every third key masked out
    mask = HostTensor{DType::kBool, {c.b, 1, 1, c.skv}, std::vector<double>(c.b * c.skv, 1.0)};
    for (int64_t i = 0; i < c.b * c.skv; ++i) mask.v[i] = i % 3 == 1 ? 0.0 : 1.0;
    ms[0] = c.skv, ms[3] = 1;
  } else if (c.mask == Mask::kDeadRow) {  // [B, Hq, Sq, Skv] Bool, row 0 of every head dead
    const Sizes sizes{c.b, c.hq, c.sq, c.skv};
    mask = HostTensor{DType::kBool, sizes, std::vector<double>(numel(sizes), 1.0)};
    for_each_index(sizes, [&](int64_t i, const Sizes& idx) {
      if (idx[2] == 0 || (idx[3] + idx[2]) % 4 == 0) mask.v[i] = 0.0;
    });
    ms[0] = c.hq * c.sq * c.skv, ms[1] = c.sq * c.skv, ms[2] = c.skv, ms[3] = 1;
  } else if (c.mask == Mask::kCachePositions) {
    // [1, 1, Sq, Skv] Bool as a static KV cache's decode/prefill builds it: query i at position
    // 37 + i sees rows 0..37 + i, so whole tiles of keys past the positions are dead (skipped).
    mask = HostTensor{DType::kBool, {1, 1, c.sq, c.skv}, std::vector<double>(c.sq * c.skv, 0.0)};
    for (int64_t i = 0; i < c.sq; ++i) {
      for (int64_t j = 0; j < c.skv; ++j) mask.v[i * c.skv + j] = j <= 37 + i ? 1.0 : 0.0;
    }
    ms[2] = c.skv, ms[3] = 1;
  }
  if (c.mask != Mask::kNone) {
    a.mask = op.add_input(mask);
    for (int i = 0; i < 4; ++i) a.mask_strides[i] = ms[i];
  }
  if (c.bshd_out) {
    a.out = op.b.output(dtype, {c.b, c.sq, c.hq, c.dv});
    a.out_strides[0] = c.sq * c.hq * c.dv, a.out_strides[1] = c.dv, a.out_strides[2] = c.hq * c.dv;
  } else {
    a.out = op.b.output(dtype, {c.b, c.hq, c.sq, c.dv});
  }
  op.b.attention(a);
  const auto runs = run_three_ways(op.b, op.inputs);

  std::vector<double> want(static_cast<size_t>(c.b * c.hq * c.sq * c.dv), 0.0);
  const int64_t group = c.hq / c.hkv;
  std::vector<double> s(static_cast<size_t>(c.skv));
  for (int64_t b = 0; b < c.b; ++b) {
    for (int64_t h = 0; h < c.hq; ++h) {
      const int64_t hk = h / group;
      for (int64_t i = 0; i < c.sq; ++i) {
        double mx = -kInf;
        for (int64_t j = 0; j < c.skv; ++j) {
          double dotp = 0;
          for (int64_t e = 0; e < c.d; ++e) {
            dotp += q.v[q_offset + b * qs[0] + h * qs[1] + i * qs[2] + e] *
                    k.v[((b * c.hkv + hk) * c.skv + j) * c.d + e];
          }
          double score = dotp * a.scale;
          bool keep = !(c.causal && j > i);
          if (c.mask != Mask::kNone) {
            const double m = mask.v[b * ms[0] + h * ms[1] + i * ms[2] + j * ms[3]];
            if (mask.dtype == DType::kBool) keep = keep && m != 0.0;
            else score += m;
          }
          s[j] = keep ? score : -kInf;
          mx = std::max(mx, s[j]);
        }
        if (mx == -kInf) continue;  // every key masked out: 0
        double sum = 0;
        for (int64_t j = 0; j < c.skv; ++j) sum += s[j] == -kInf ? 0.0 : std::exp(s[j] - mx);
        for (int64_t j = 0; j < c.skv; ++j) {
          if (s[j] == -kInf) continue;
          const double p = std::exp(s[j] - mx) / sum;
          for (int64_t e = 0; e < c.dv; ++e) {
            want[((b * c.hq + h) * c.sq + i) * c.dv + e] +=
                p * v.v[((b * c.hkv + hk) * c.skv + j) * c.dv + e];
          }
        }
      }
    }
  }
  if (c.bshd_out) {  // the reference is [B, Hq, Sq, Dv]: permute it as the op writes
    std::vector<double> bshd(want.size());
    for (int64_t b = 0; b < c.b; ++b)
      for (int64_t h = 0; h < c.hq; ++h)
        for (int64_t i = 0; i < c.sq; ++i)
          for (int64_t e = 0; e < c.dv; ++e)
            bshd[((b * c.sq + i) * c.hq + h) * c.dv + e] = want[((b * c.hq + h) * c.sq + i) * c.dv + e];
    want = std::move(bshd);
  }
  const Tol tol = dtype == DType::kFloat32   ? Tol{2e-6, 1e-4}
                  : dtype == DType::kFloat16 ? Tol{2e-3, 5e-3}
                                             : Tol{1.5e-2, 2e-2};
  expect_output(runs, 0, want, tol, describe(dtype, c));
}

const DType kDtypes[] = {DType::kFloat32, DType::kFloat16, DType::kBFloat16};

TEST_F(EngineGpu, AttentionPlainAndOddSizes) {
  for (DType dtype : kDtypes) {
    for (const Case& c : {Case{1, 1, 1, 5, 7, 8, 8}, Case{2, 3, 3, 33, 70, 40, 40},
                          Case{1, 2, 2, 1, 45, 33, 20}, Case{1, 2, 2, 9, 3, 128, 128},
                          Case{1, 1, 1, 4, 40, 256, 256}}) {
      run_case(dtype, c);
    }
  }
}

TEST_F(EngineGpu, AttentionModelSizes) {
  // BERT-base and ViT-B/16 heads (fewer heads: the host reference is slow), a Llama prefill.
  for (DType dtype : kDtypes) {
    for (const Case& c : {Case{1, 2, 2, 128, 128, 64, 64}, Case{1, 2, 2, 197, 197, 64, 64},
                          Case{1, 4, 1, 64, 64, 128, 128, true}}) {
      run_case(dtype, c);
    }
  }
}

TEST_F(EngineGpu, AttentionMasksAndCausal) {
  for (DType dtype : kDtypes) {
    for (const Case& c : {Case{1, 2, 2, 20, 20, 16, 16, true},
                          Case{1, 2, 2, 6, 50, 16, 24, true},  // more keys than queries
                          Case{1, 3, 3, 17, 40, 32, 32, false, Mask::kAdditiveRows},
                          Case{2, 2, 2, 9, 35, 24, 24, false, Mask::kBoolKeys},
                          Case{2, 2, 2, 7, 12, 8, 8, false, Mask::kDeadRow},
                          Case{1, 2, 2, 40, 40, 8, 8, true, Mask::kBoolKeys},
                          Case{1, 4, 2, 1, 300, 64, 64, false, Mask::kCachePositions},
                          Case{1, 4, 2, 19, 300, 64, 64, false, Mask::kCachePositions},
                          // Split-K (few queries, many keys): a decode over a long cache, causal
                          // (later splits see no key at all), an additive mask, no mask.
                          Case{1, 32, 8, 1, 2048, 64, 64, false, Mask::kCachePositions},
                          Case{1, 8, 2, 3, 1000, 64, 64, true},
                          Case{1, 2, 2, 2, 600, 32, 48, false, Mask::kAdditiveRows},
                          Case{2, 4, 4, 4, 777, 16, 16},
                          // A KV head's query heads packed into one CTA (grouped decode), split:
                          // 8 heads x 2 queries per CTA with a per-head mask whose row 0 is dead,
                          // strided q and a [B, Sq, H, D] out; 4 heads x 1 query under a Bool
                          // mask of batch 2.
                          Case{2, 16, 2, 2, 500, 64, 64, false, Mask::kDeadRow, true, true},
                          Case{2, 32, 8, 1, 2048, 64, 64, false, Mask::kBoolKeys}}) {
      run_case(dtype, c);
    }
  }
}

// Up to 8 query rows per KV head take the flash-decoding kernel (attention_decode.cu): head rows
// of 128, 256 and 512 bytes (head_dim 64 / 128 / 256 in 16-bit types, 32 / 64 / 128 in fp32),
// groups of 1, 4 and 8 query heads, one and two queries, a static cache's Bool mask (the later
// splits see no key), a Bool mask over keys with batch 2, an additive mask, a dead row (0), the
// causal bound, strided q with a [B, Sq, H, D] out, a cache shorter than one split and one no
// multiple of the split. Each case runs three ways: the splits merged in a thread block cluster
// (the default), merged through global memory (KILN_ATTENTION_CLUSTER=off), and on the generic
// kernel (KILN_ATTENTION_DECODE=off).
TEST_F(EngineGpu, AttentionDecodeKernel) {
  for (const char* mode : {"cluster", "global", "off"}) {
    const std::string m = mode;
    ASSERT_EQ(setenv("KILN_ATTENTION_DECODE", m == "off" ? "off" : "on", 1), 0);
    ASSERT_EQ(setenv("KILN_ATTENTION_CLUSTER", m == "global" ? "off" : "on", 1), 0);
    for (DType dtype : kDtypes) {
      const int64_t d = dtype == DType::kFloat32 ? 32 : 64;
      for (const Case& c : {Case{1, 32, 8, 1, 2048, d, d, false, Mask::kCachePositions},
                            Case{1, 32, 8, 1, 2048, 2 * d, 2 * d, false, Mask::kCachePositions},
                            Case{1, 8, 8, 1, 1000, 4 * d, 4 * d, false, Mask::kBoolKeys},
                            Case{2, 16, 2, 1, 777, d, d, false, Mask::kBoolKeys},
                            Case{1, 8, 2, 2, 300, d, d, false, Mask::kAdditiveRows},
                            Case{2, 8, 2, 2, 500, d, d, false, Mask::kDeadRow, true, true},
                            Case{1, 4, 1, 2, 90, 2 * d, 2 * d, true},
                            Case{1, 4, 2, 1, 20, d, d},
                            Case{1, 2, 2, 1, 4100, d, d, false, Mask::kCachePositions}}) {
        run_case(dtype, c);
      }
    }
  }
  unsetenv("KILN_ATTENTION_DECODE");
  unsetenv("KILN_ATTENTION_CLUSTER");
}

TEST_F(EngineGpu, AttentionGroupedHeadsAndStridedQueries) {
  for (DType dtype : kDtypes) {
    for (const Case& c : {Case{1, 8, 2, 32, 32, 64, 64, true, Mask::kNone, true},
                          Case{2, 6, 3, 10, 21, 40, 40, false, Mask::kAdditiveRows, true},
                          Case{1, 4, 4, 1, 64, 64, 64, false, Mask::kNone, true},
                          Case{2, 4, 2, 33, 33, 64, 64, true, Mask::kNone, true, true},
                          Case{1, 3, 3, 17, 40, 32, 32, false, Mask::kAdditiveRows, false, true}}) {
      run_case(dtype, c);
    }
  }
}

// fp32 with at least 64 queries and keys runs as cuBLASLt GEMMs around a masked softmax
// (attention_gemm.cu): grouped heads with batch 2 (one GEMM per KV head), an additive mask with
// strided queries, a dead row, a Bool mask over as many keys as queries, exactly 64 of each.
TEST_F(EngineGpu, AttentionFp32PrefillAsGemms) {
  for (const Case& c : {Case{2, 6, 3, 64, 70, 40, 40, false, Mask::kAdditiveRows, true},
                        Case{2, 2, 2, 64, 64, 8, 8, false, Mask::kDeadRow},
                        Case{1, 2, 2, 65, 65, 24, 48, true, Mask::kBoolKeys},
                        Case{2, 4, 1, 64, 80, 64, 64, true, Mask::kNone, false, true}}) {
    run_case(DType::kFloat32, c);
  }
}

// Float16 / BFloat16 with a mask from 16 queries up run on cuDNN with the mask as its bias: a
// prefill chunk over a static KV cache (grouped heads, whole tiles of keys dead), dead rows (0,
// not cuDNN's NaN) with and without the causal bound, a Bool mask broadcast over heads with batch
// 2 and a key count that is no multiple of 8 (the bias rows padded), additive masks (one key of
// each row at -inf), one with strided queries and a [B, Sq, H, D] out.
TEST_F(EngineGpu, AttentionHalfMaskedOnCudnn) {
  for (DType dtype : {DType::kFloat16, DType::kBFloat16}) {
    for (const Case& c : {Case{1, 8, 2, 128, 600, 64, 64, false, Mask::kCachePositions},
                          Case{1, 4, 2, 64, 2048, 64, 64, false, Mask::kCachePositions},
                          Case{2, 2, 2, 20, 20, 16, 16, false, Mask::kDeadRow},
                          Case{1, 2, 2, 24, 30, 32, 32, true, Mask::kDeadRow},
                          Case{2, 4, 4, 33, 35, 64, 64, true, Mask::kBoolKeys},
                          Case{2, 6, 3, 40, 21, 40, 40, false, Mask::kAdditiveRows, true, true},
                          Case{1, 3, 3, 17, 40, 32, 32, false, Mask::kAdditiveRows}}) {
      run_case(dtype, c);
    }
  }
}

TEST_F(EngineGpu, AttentionHalfTypesOnKilnsKernel) {
  // The cases cuDNN (16-bit) and the GEMMs (fp32) take by default, forced onto Kiln's own kernel
  // (their fallback).
  ASSERT_EQ(setenv("KILN_ATTENTION", "kiln", 1), 0);
  for (DType dtype : {DType::kFloat16, DType::kBFloat16, DType::kFloat32}) {
    for (const Case& c : {Case{1, 2, 2, 128, 128, 64, 64}, Case{1, 4, 1, 64, 64, 128, 128, true},
                          Case{1, 8, 2, 32, 32, 64, 64, true, Mask::kNone, true},
                          Case{1, 2, 2, 6, 50, 16, 24, true},
                          Case{1, 4, 2, 19, 300, 64, 64, false, Mask::kCachePositions}}) {
      run_case(dtype, c);
    }
  }
  unsetenv("KILN_ATTENTION");
}

}  // namespace
}  // namespace kiln::engine::gpu_test
