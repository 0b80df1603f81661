#include "runtime/engine/kernels/attention_gemm.cuh"

#include <algorithm>
#include <climits>
#include <initializer_list>
#include <utility>

#include "format/fail.h"
#include "runtime/engine/cuda_check.h"
#include "runtime/engine/kernels/attention.cuh"
#include "runtime/engine/kernels/common.cuh"
#include "runtime/engine/kernels/matmul.cuh"
#include "runtime/engine/env_switch.h"

namespace kiln::engine::kernels {
namespace {

using executorch::runtime::Error;

// Below: decode, and short prefills (a 32-token Llama prefill ran 16% slower end to end as three
// launches than on Kiln's one), which Kiln's kernel keeps.
constexpr int64_t kMinQueries = 64;
constexpr size_t kMaxScoreBytes = size_t{64} << 20;  // the scores' share of the workspace
constexpr size_t kGemmWorkspaceBytes = size_t{4} << 20;

struct SoftmaxParams {
  float* scores;  // [batch, heads_q, seq_q, seq_kv], dense
  const void* mask;
  MaskKind mask_kind;
  int64_t heads_q, seq_q, seq_kv;
  int64_t ms[4];
  bool causal;
};

// Row r of the scores (one query of one head) in place: softmax over its keys after the
// additive mask, the Bool mask and the causal bound (key j > query i hidden); a row with every
// key hidden becomes 0, as torch's scaled_dot_product_attention gives. A warp per row; the row
// is re-read from L1 / L2 between the passes.
__global__ void masked_softmax_kernel(const SoftmaxParams p, int64_t rows) {
  const int lane = threadIdx.x & 31;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * (blockDim.x / 32);
  for (int64_t r = thread_index() / 32; r < rows; r += warps) {
    const int64_t i = r % p.seq_q;
    const int64_t bh = r / p.seq_q;
    const int64_t base = (bh / p.heads_q) * p.ms[0] + (bh % p.heads_q) * p.ms[1] + i * p.ms[2];
    float* row = p.scores + r * p.seq_kv;
    const auto score = [&](int64_t j) {
      if (p.causal && j > i) return -INFINITY;
      float s = row[j];
      if (p.mask_kind == MaskKind::kAdditive) {
        s += static_cast<const float*>(p.mask)[base + j * p.ms[3]];
      } else if (p.mask_kind == MaskKind::kBool &&
                 static_cast<const uint8_t*>(p.mask)[base + j * p.ms[3]] == 0) {
        s = -INFINITY;
      }
      return s;
    };
    float m = -INFINITY;
    for (int64_t j = lane; j < p.seq_kv; j += 32) m = fmaxf(m, score(j));
    m = warp_reduce(m, MaxOp{});
    float sum = 0.0f;
    for (int64_t j = lane; j < p.seq_kv; j += 32) {
      const float e = m == -INFINITY ? 0.0f : expf(score(j) - m);
      row[j] = e;
      sum += e;
    }
    sum = warp_reduce(sum, SumOp{});
    const float inv = sum == 0.0f ? 0.0f : 1.0f / sum;
    for (int64_t j = lane; j < p.seq_kv; j += 32) row[j] *= inv;
  }
}

// One strided-batched GEMM in cuBLASLt's column-major terms: D[m, n] = alpha * op(A) B, op(A)
// A^T when trans_a (A stored k x m), B stored k x n; every operand fp32.
class BatchedGemm {
 public:
  Error init(cublasLtHandle_t lt, cublasComputeType_t compute, bool trans_a, uint64_t m,
             uint64_t n, uint64_t k, const int64_t ld[3], const int64_t stride[3], int32_t batch,
             const uint32_t align[3], size_t op) {
    op_ = op;
    cublasLtMatmulDesc_t desc = nullptr;
    KILN_TRY(check(cublasLtMatmulDescCreate(&desc, compute, CUDA_R_32F), "creating a descriptor"));
    desc_.reset(desc);
    const cublasOperation_t ta = trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
    KILN_TRY(check(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta,
                                                  sizeof(ta)),
                   "setting the transpose"));
    const uint64_t rows[3] = {trans_a ? k : m, k, m}, cols[3] = {trans_a ? m : k, n, n};
    Layout* layouts[3] = {&a_, &b_, &d_};
    for (int t = 0; t < 3; ++t) {
      cublasLtMatrixLayout_t raw = nullptr;
      KILN_TRY(check(cublasLtMatrixLayoutCreate(&raw, CUDA_R_32F, rows[t], cols[t], ld[t]),
                     "creating a layout"));
      layouts[t]->reset(raw);
      KILN_TRY(check(cublasLtMatrixLayoutSetAttribute(raw, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT,
                                                      &batch, sizeof(batch)),
                     "setting the batch count"));
      KILN_TRY(check(cublasLtMatrixLayoutSetAttribute(
                         raw, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride[t],
                         sizeof(stride[t])),
                     "setting the batch stride"));
    }
    cublasLtMatmulPreference_t raw = nullptr;
    KILN_TRY(check(cublasLtMatmulPreferenceCreate(&raw), "creating a preference"));
    Preference preference(raw);
    KILN_TRY(check(
        set_preference(raw, kGemmWorkspaceBytes, {align[0], align[1], align[2], align[2]}),
        "setting the workspace limit and alignments"));
    cublasLtMatmulHeuristicResult_t result{};
    int found = 0;
    const cublasStatus_t s = cublasLtMatmulAlgoGetHeuristic(lt, desc, a_.get(), b_.get(), d_.get(),
                                                            d_.get(), raw, 1, &result, &found);
    if (s != CUBLAS_STATUS_SUCCESS || found == 0) {
      ET_LOG(Info, "Kiln engine: op %zu (attention): cuBLASLt has no algorithm for the %llu x "
             "%llu x %llu score GEMMs; Kiln's kernel runs it", op_, (unsigned long long)m,
             (unsigned long long)n, (unsigned long long)k);
      return Error::NotSupported;
    }
    algo_ = result.algo;
    return Error::Ok;
  }

  Error run(const RunContext& ctx, float alpha, const void* a, const void* b, void* d,
            void* workspace) const {
    const float beta = 0.0f;
    return check(cublasLtMatmul(ctx.lt, desc_.get(), &alpha, a, a_.get(), b, b_.get(), &beta, d,
                                d_.get(), d, d_.get(), &algo_, workspace, kGemmWorkspaceBytes,
                                ctx.stream),
                 "cublasLtMatmul");
  }

 private:
  Error check(cublasStatus_t s, const char* what) const {
    if (s == CUBLAS_STATUS_SUCCESS) return Error::Ok;
    return fail(nullptr, Error::Internal, "Kiln engine: op %zu (attention): cuBLASLt %s failed: %s",
                op_, what, cublasLtGetStatusString(s));
  }

  size_t op_ = 0;
  MatmulDesc desc_;
  Layout a_, b_, d_;
  cublasLtMatmulAlgo_t algo_{};
};

class GemmAttentionStep final : public Step {
 public:
  explicit GemmAttentionStep(const AttentionArgs& a) : a_(a) {
    group_ = a.heads_q / a.heads_kv;
    // Grouped heads: one batch of `group` query heads per KV head, the K / V batch stride 0.
    batch_heads_ = group_ == 1 ? a.heads_q : group_;
    score_bytes_ = static_cast<size_t>(a.batch * a.heads_q * a.seq_q * a.seq_kv) * sizeof(float);
    score_bytes_ = (score_bytes_ + 255) / 256 * 256;
  }

  Error init(const InitContext& ctx) {
    const Graph& g = ctx.graph;
    const cublasComputeType_t compute = g.precision == blob::Precision::kTf32
                                            ? CUBLAS_COMPUTE_32F_FAST_TF32
                                            : CUBLAS_COMPUTE_32F;
    const int64_t f = sizeof(float);
    const int64_t sq = a_.seq_q, skv = a_.seq_kv, scores = sq * skv;
    const int64_t kv_head = group_ == 1 ? 1 : 0;  // K / V batch stride in heads
    // Every pointer a call forms (base + offset + batch / head / unit steps) keeps these.
    const auto align = [&](int64_t t, int64_t offset, std::initializer_list<int64_t> steps) {
      uint32_t al = min_alignment(ctx.alignment[t], offset * f);
      for (int64_t s : steps) al = min_alignment(al, s * f);
      return al;
    };
    const uint32_t q_al = align(a_.q, a_.q_offset, {a_.q_stride_b, a_.q_stride_h});
    const uint32_t k_al = align(a_.k, a_.k_offset, {a_.k_stride_b, a_.k_stride_h});
    const uint32_t v_al = align(a_.v, a_.v_offset, {a_.v_stride_b, a_.v_stride_h});
    const uint32_t o_al = align(a_.out, 0, {a_.out_stride_b, a_.out_stride_h});
    const uint32_t s_al = min_alignment(256, scores * f);  // the workspace is cudaMalloc's
    base_align_[0] = ctx.alignment[a_.q], base_align_[1] = ctx.alignment[a_.k];
    base_align_[2] = ctx.alignment[a_.v], base_align_[3] = ctx.alignment[a_.out];
    const int32_t batch = static_cast<int32_t>(batch_heads_);
    {  // scores (Skv x Sq) = K^T (K stored D x Skv) . Q (D x Sq)
      const int64_t ld[3] = {a_.k_stride_s, a_.q_stride_s, skv};
      const int64_t stride[3] = {kv_head * a_.k_stride_h, a_.q_stride_h, scores};
      const uint32_t al[3] = {k_al, q_al, s_al};
      KILN_TRY(qk_.init(ctx.lt, compute, true, uint64_t(skv), uint64_t(sq), uint64_t(a_.head_dim),
                        ld, stride, batch, al, ctx.op_index));
    }
    {  // out (Dv x Sq) = V (Dv x Skv) . P (Skv x Sq)
      const int64_t ld[3] = {a_.v_stride_s, skv, a_.out_stride_s};
      const int64_t stride[3] = {kv_head * a_.v_stride_h, scores, a_.out_stride_h};
      const uint32_t al[3] = {v_al, s_al, o_al};
      KILN_TRY(pv_.init(ctx.lt, compute, false, uint64_t(a_.head_dim_v), uint64_t(sq),
                        uint64_t(skv), ld, stride, batch, al, ctx.op_index));
    }
    softmax_.mask_kind = mask_kind(a_, g);
    softmax_.heads_q = a_.heads_q, softmax_.seq_q = sq, softmax_.seq_kv = skv;
    softmax_.ms[0] = a_.mask_stride_b, softmax_.ms[1] = a_.mask_stride_h;
    softmax_.ms[2] = a_.mask_stride_q, softmax_.ms[3] = a_.mask_stride_k;
    softmax_.causal = a_.causal;
    return Error::Ok;
  }

  Error enqueue(const RunContext& ctx) override {
    if (a_.batch == 0 || a_.seq_q == 0) return Error::Ok;
    const int64_t ids[4] = {a_.q, a_.k, a_.v, a_.out};
    for (int t = 0; t < 4; ++t) {
      if (alignment_of(ctx.ptr(ids[t])) < base_align_[t]) return kiln_->enqueue(ctx);
    }
    const float* q = ctx.ptr<const float>(a_.q) + a_.q_offset;
    const float* k = ctx.ptr<const float>(a_.k) + a_.k_offset;
    const float* v = ctx.ptr<const float>(a_.v) + a_.v_offset;
    float* out = ctx.ptr<float>(a_.out);
    float* scores = static_cast<float*>(ctx.workspace);
    void* gemm_workspace = static_cast<char*>(ctx.workspace) + score_bytes_;
    const int64_t per_head = a_.seq_q * a_.seq_kv;
    const int64_t units = a_.heads_q / batch_heads_;  // KV heads when grouped, else 1
    // Calls `call(b, h0, hk)` for each GEMM call: batch row b, its first query head h0 and
    // (grouped) KV head hk.
    const auto each_call = [&](auto call) {
      for (int64_t b = 0; b < a_.batch; ++b) {
        for (int64_t u = 0; u < units; ++u) {
          KILN_TRY(call(b, u * batch_heads_, group_ == 1 ? 0 : u));
        }
      }
      return Error::Ok;
    };
    KILN_TRY(each_call([&](int64_t b, int64_t h0, int64_t hk) {
      return qk_.run(ctx, static_cast<float>(a_.scale), k + b * a_.k_stride_b + hk * a_.k_stride_h,
                     q + b * a_.q_stride_b + h0 * a_.q_stride_h,
                     scores + (b * a_.heads_q + h0) * per_head, gemm_workspace);
    }));
    SoftmaxParams sp = softmax_;
    sp.scores = scores;
    sp.mask = a_.mask == kNoTensor ? nullptr : ctx.ptr(a_.mask);
    const int64_t rows = a_.batch * a_.heads_q * a_.seq_q;
    masked_softmax_kernel<<<blocks_for(rows, kBlock / 32, ctx.max_blocks), kBlock, 0,
                            ctx.stream>>>(sp, rows);
    return each_call([&](int64_t b, int64_t h0, int64_t hk) {
      return pv_.run(ctx, 1.0f, v + b * a_.v_stride_b + hk * a_.v_stride_h,
                     scores + (b * a_.heads_q + h0) * per_head,
                     out + b * a_.out_stride_b + h0 * a_.out_stride_h, gemm_workspace);
    });
  }

  size_t workspace_bytes() const override {
    return std::max(score_bytes_ + kGemmWorkspaceBytes, kiln_->workspace_bytes());
  }

  std::unique_ptr<Step> kiln_;  // Kiln's kernel for the op: less aligned bound buffers

 private:
  AttentionArgs a_;
  int64_t group_ = 1, batch_heads_ = 1;
  size_t score_bytes_ = 0;
  uint32_t base_align_[4] = {};  // q, k, v, out: what the GEMMs were planned for
  BatchedGemm qk_, pv_;
  SoftmaxParams softmax_{};
};

}  // namespace

const char* gemm_attention_unsupported(const AttentionArgs& a, const Graph& graph) {
  if (env_is("KILN_ATTENTION", "kiln")) return "KILN_ATTENTION=kiln";
  const blob::DType dtype = graph.tensors[a.q].dtype;
  if (dtype != blob::DType::kFloat32 || graph.tensors[a.out].dtype != dtype) return "not fp32";
  if (a.seq_q < kMinQueries || a.seq_kv < kMinQueries) return "fewer than 64 queries or keys";
  // A Bool mask over more keys than queries is a KV cache's: Kiln's kernel skips its unwritten
  // rows, the GEMMs would score every one.
  if (mask_kind(a, graph) == MaskKind::kBool && a.seq_kv > a.seq_q) {
    return "a KV cache's Bool mask";
  }
  if (a.heads_kv <= 0 || a.heads_q % a.heads_kv != 0 || a.heads_q > INT32_MAX) {
    return "heads that do not group";
  }
  if (static_cast<size_t>(a.batch * a.heads_q * a.seq_q * a.seq_kv) * sizeof(float) >
      kMaxScoreBytes) {
    return "scores larger than the workspace share";
  }
  return nullptr;
}

StepResult make_gemm_attention_step(const AttentionArgs& a, const InitContext& ctx,
                                    std::unique_ptr<Step>& kiln) {
  if (ctx.lt == nullptr) return Error::NotSupported;
  auto step = std::make_unique<GemmAttentionStep>(a);
  KILN_TRY(step->init(ctx));
  step->kiln_ = std::move(kiln);
  return std::unique_ptr<Step>(std::move(step));
}

}  // namespace kiln::engine::kernels
