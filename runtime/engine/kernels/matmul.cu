#include "runtime/engine/kernels/matmul.cuh"

#include <algorithm>
#include <climits>
#include <cstring>
#include <vector>
#include <utility>

#include "runtime/engine/cuda_check.h"
#include "format/fail.h"
#include "runtime/engine/kernels/autotune.cuh"
#include "runtime/engine/kernels/common.cuh"
#include "runtime/engine/kernels/gemv.cuh"

namespace kiln::engine::kernels {
namespace {

using blob::DType;
using blob::Epilogue;
using executorch::runtime::Error;
using executorch::runtime::Result;

using ll = long long;

// out = act(out + beta * bias[row * rs + col * cs]) over [batch, M, N]; bias may be null.
template <typename T>
__global__ void matmul_epilogue_kernel(T* __restrict__ out, int64_t total, int64_t m, int64_t n,
                                       const void* __restrict__ bias, DType bias_dtype,
                                       int64_t row_stride, int64_t col_stride, float beta,
                                       Epilogue act) {
  for (int64_t i = thread_index(); i < total; i += thread_count()) {
    float v = to_float(out[i]);
    if (bias != nullptr) {
      const int64_t mn = i % (m * n);
      const int64_t row = mn / n;
      const int64_t col = mn - row * n;
      v += beta *
           static_cast<float>(load_f64(bias, bias_dtype, row * row_stride + col * col_stride));
    }
    out[i] = from_float<T>(apply_epilogue(v, act));
  }
}

class MatmulStep final : public Step {
 public:
  MatmulStep(const MatmulArgs& a, const Graph& graph, cublasLtHandle_t lt)
      : a_(a),
        lt_(lt),
        in_dtype_(graph.tensors[a.a].dtype),
        out_dtype_(graph.tensors[a.out].dtype),
        bias_dtype_(a.bias == kNoTensor ? out_dtype_ : graph.tensors[a.bias].dtype),
        out_nbytes_(graph.tensors[a.out].nbytes) {}

  Error init(const InitContext& ctx) {
    op_ = ctx.op_index;
    if (a_.batch == 0 || a_.m == 0 || a_.n == 0) {
      empty_ = true;
      return Error::Ok;
    }
    // Decide what cuBLASLt fuses and what the pass after it does.
    const bool per_column_bias =
        a_.bias != kNoTensor && lt_per_column_bias(a_, bias_dtype_, out_dtype_);
    lt_bias_ = per_column_bias && a_.k > 0;
    post_bias_ = a_.bias != kNoTensor && !lt_bias_;
    post_act_ = a_.epilogue;   // cuBLASLt takes it over below where it can
    if (a_.k == 0) {
      return Error::Ok;  // out = 0 (or the residual), then the pass: no cuBLASLt call
    }
    if (a_.batch > INT_MAX) {
      return fail(nullptr, Error::NotSupported,
                  "Kiln engine: op %zu (matmul): batch %lld is above cuBLASLt's limit of %d", op_,
                  ll(a_.batch), INT_MAX);
    }
    // A bias the pass adds comes before the activation: then the pass does both.
    const cublasLtEpilogue_t epilogue = post_bias_ ? CUBLASLT_EPILOGUE_DEFAULT
                                                   : lt_epilogue(lt_bias_, a_.epilogue, post_act_);

    const cublasComputeType_t compute =
        in_dtype_ == DType::kFloat32 && ctx.graph.precision == blob::Precision::kTf32
            ? CUBLAS_COMPUTE_32F_FAST_TF32
            : CUBLAS_COMPUTE_32F;
    cublasLtMatmulDesc_t desc = nullptr;
    KILN_TRY(
        status(cublasLtMatmulDescCreate(&desc, compute, CUDA_R_32F), "cublasLtMatmulDescCreate"));
    desc_.reset(desc);
    // Row-major out = A @ B is column-major out^T = B^T @ A^T: cuBLASLt's "A" is our b and its
    // "B" is our a, each read column-major from the row-major buffer.
    const cublasOperation_t op_lt_a = a_.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
    const cublasOperation_t op_lt_b = a_.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
    KILN_TRY(set_desc(CUBLASLT_MATMUL_DESC_TRANSA, &op_lt_a, sizeof(op_lt_a)));
    KILN_TRY(set_desc(CUBLASLT_MATMUL_DESC_TRANSB, &op_lt_b, sizeof(op_lt_b)));
    KILN_TRY(set_desc(CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof(epilogue)));
    if (lt_bias_) {
      const int32_t bias_type = cublas_type(bias_dtype_);  // equal to out's, stated explicitly
      KILN_TRY(set_desc(CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type, sizeof(bias_type)));
    }

    const uint64_t m = static_cast<uint64_t>(a_.m);
    const uint64_t n = static_cast<uint64_t>(a_.n);
    const uint64_t k = static_cast<uint64_t>(a_.k);
    const cudaDataType_t in_type = cublas_type(in_dtype_);
    const cudaDataType_t out_type = cublas_type(out_dtype_);
    // Our b: K x N row-major (N x K when trans_b) = N x K (K x N) column-major.
    KILN_TRY(make_layout(layout_a_, in_type, a_.trans_b ? k : n, a_.trans_b ? n : k,
                         a_.trans_b ? a_.k : a_.n, a_.b_batch_stride));
    // Our a: M x K row-major (K x M when trans_a) = K x M (M x K) column-major.
    KILN_TRY(make_layout(layout_b_, in_type, a_.trans_a ? m : k, a_.trans_a ? k : m,
                         a_.trans_a ? a_.m : a_.k, a_.a_batch_stride));
    KILN_TRY(make_layout(layout_d_, out_type, n, m, a_.n, a_.m * a_.n));

    align_a_ = ctx.alignment[a_.b];
    align_b_ = ctx.alignment[a_.a];
    align_d_ = ctx.alignment[a_.out];
    align_c_ = has_residual() ? ctx.alignment[a_.residual] : align_d_;
    if (ctx.autotune) {
      if (const std::vector<int64_t>* e = ctx.algos.find(op_, "matmul")) {
        if (use_cached(*e)) {
          ++ctx.algos.hits;
          return Error::Ok;
        }
        ctx.algos.drop(op_);
      }
      if (tune(ctx)) {
        ++ctx.algos.misses;
        std::vector<int64_t> words(8);
        std::memcpy(words.data(), algo_.data, sizeof(algo_.data));
        ctx.algos.put(op_, "matmul", std::move(words));
        return Error::Ok;
      }
    }
    return choose_algorithm();
  }

  Error enqueue(const RunContext& ctx) override {
    if (empty_) {
      return Error::Ok;
    }
    void* out = ctx.ptr(a_.out);
    // cuBLASLt's C: the residual added with beta 1, or out itself with beta 0.
    const void* c = has_residual() ? ctx.ptr(a_.residual) : out;
    if (a_.k == 0) {
      const cudaError_t e = has_residual()
          ? cudaMemcpyAsync(out, c, out_nbytes_, cudaMemcpyDeviceToDevice, ctx.stream)
          : cudaMemsetAsync(out, 0, out_nbytes_, ctx.stream);
      KILN_TRY(cuda_status(e, Error::Internal, "Kiln engine: op %zu (matmul): %s failed", op_,
                           has_residual() ? "cudaMemcpyAsync" : "cudaMemsetAsync"));
    } else {
      const void* lt_a = ctx.ptr(a_.b);
      const void* lt_b = ctx.ptr(a_.a);
      // Bound io buffers may be less aligned than the algorithm was chosen for: choose again.
      if (alignment_of(lt_a) < align_a_ || alignment_of(lt_b) < align_b_ ||
          alignment_of(out) < align_d_ || alignment_of(c) < align_c_) {
        align_a_ = alignment_of(lt_a);
        align_b_ = alignment_of(lt_b);
        align_d_ = alignment_of(out);
        align_c_ = alignment_of(c);
        KILN_TRY(choose_algorithm());
      }
      if (lt_bias_) {
        const void* bias = ctx.ptr(a_.bias);
        KILN_TRY(set_desc(CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)));
      }
      const float alpha = static_cast<float>(a_.alpha);
      const float beta = c_beta();
      const cublasStatus_t s =
          cublasLtMatmul(ctx.lt, desc_.get(), &alpha, lt_a, layout_a_.get(), lt_b, layout_b_.get(),
                         &beta, c, layout_d_.get(), out, layout_d_.get(), &algo_, ctx.workspace,
                         kMatmulWorkspaceBytes, ctx.stream);
      if (s != CUBLAS_STATUS_SUCCESS) {
        return fail(nullptr, Error::Internal,
                    "Kiln engine: op %zu (matmul): cublasLtMatmul failed: %s", op_,
                    cublasLtGetStatusString(s));
      }
    }
    if (post_bias_ || post_act_ != Epilogue::kNone) {
      enqueue_epilogue_pass(ctx, out_dtype_, out, a_.batch * a_.m * a_.n, a_.m, a_.n,
                            post_bias_ ? ctx.ptr(a_.bias) : nullptr, bias_dtype_,
                            a_.bias_row_stride, a_.bias_col_stride, static_cast<float>(a_.beta),
                            post_act_);
    }
    return Error::Ok;
  }

  size_t workspace_bytes() const override {
    return empty_ || a_.k == 0 ? 0 : kMatmulWorkspaceBytes;
  }

 private:
  Error status(cublasStatus_t s, const char* what) const {
    if (s == CUBLAS_STATUS_SUCCESS) {
      return Error::Ok;
    }
    return fail(nullptr, Error::NotSupported, "Kiln engine: op %zu (matmul): %s failed: %s", op_,
                what, cublasLtGetStatusString(s));
  }

  Error set_desc(cublasLtMatmulDescAttributes_t attribute, const void* value, size_t size) {
    return status(cublasLtMatmulDescSetAttribute(desc_.get(), attribute, value, size),
                  "cublasLtMatmulDescSetAttribute");
  }

  Error make_layout(Layout& layout, cudaDataType_t type, uint64_t rows, uint64_t cols, int64_t ld,
                    int64_t batch_stride) {
    cublasLtMatrixLayout_t raw = nullptr;
    KILN_TRY(status(cublasLtMatrixLayoutCreate(&raw, type, rows, cols, ld),
                    "cublasLtMatrixLayoutCreate"));
    layout.reset(raw);
    if (a_.batch > 1) {
      const int32_t count = static_cast<int32_t>(a_.batch);
      KILN_TRY(status(cublasLtMatrixLayoutSetAttribute(raw, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT,
                                                       &count, sizeof(count)),
                      "setting the batch count"));
      KILN_TRY(
          status(cublasLtMatrixLayoutSetAttribute(raw, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                                                  &batch_stride, sizeof(batch_stride)),
                 "setting the batch stride"));
    }
    return Error::Ok;
  }

  // A remembered algorithm, if cuBLASLt still accepts it for these exact descriptors.
  bool use_cached(const std::vector<int64_t>& words) {
    if (words.size() != 8) return false;
    cublasLtMatmulAlgo_t algo{};
    std::memcpy(algo.data, words.data(), sizeof(algo.data));
    cublasLtMatmulHeuristicResult_t check{};
    if (cublasLtMatmulAlgoCheck(lt_, desc_.get(), layout_a_.get(), layout_b_.get(), layout_d_.get(),
                                layout_d_.get(), &algo, &check) != CUBLAS_STATUS_SUCCESS ||
        check.workspaceSize > kMatmulWorkspaceBytes) {
      return false;
    }
    algo_ = algo;
    return true;
  }

  // KILN_AUTOTUNE=1: up to kCandidates of the heuristic's algorithms, each captured into a CUDA
  // graph and timed over kAutotuneRuns replays on scratch buffers of this op's sizes (as the engine
  // runs it); the fastest wins when it beats the heuristic's first by kAutotuneMargin. False
  // (nothing logged as an error) when the scratch memory is not there or nothing could be timed.
  bool tune(const InitContext& ctx) {
    constexpr int kCandidates = 8;
    cublasLtMatmulPreference_t raw = nullptr;
    if (cublasLtMatmulPreferenceCreate(&raw) != CUBLAS_STATUS_SUCCESS) return false;
    Preference preference(raw);
    if (set_preferences(raw) != Error::Ok) return false;
    cublasLtMatmulHeuristicResult_t results[kCandidates] = {};
    int found = 0;
    if (cublasLtMatmulAlgoGetHeuristic(lt_, desc_.get(), layout_a_.get(), layout_b_.get(),
                                       layout_d_.get(), layout_d_.get(), raw, kCandidates, results,
                                       &found) != CUBLAS_STATUS_SUCCESS ||
        found == 0) {
      return false;
    }
    const auto span = [](int64_t batch_stride, int64_t batch, int64_t one) {
      return batch_stride > 0 ? std::max(batch_stride * (batch - 1) + one, one) : one;
    };
    const size_t in_elem = element_size(in_dtype_), out_elem = element_size(out_dtype_);
    const size_t sizes[5] = {
        static_cast<size_t>(span(a_.a_batch_stride, a_.batch, a_.m * a_.k)) * in_elem,
        static_cast<size_t>(span(a_.b_batch_stride, a_.batch, a_.k * a_.n)) * in_elem,
        static_cast<size_t>(a_.batch * a_.m * a_.n) * out_elem,
        lt_bias_ ? static_cast<size_t>(a_.n) * element_size(bias_dtype_) : 0,
        kMatmulWorkspaceBytes};
    const AutotuneScratch scratch{sizes[0], sizes[1], sizes[2], sizes[3], sizes[4]};
    bool ok = scratch.ok();
    if (ok && lt_bias_) {
      void* bias = scratch.buffer(3);
      ok = set_desc(CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)) == Error::Ok;
    }
    // With a residual, C is the scratch out itself (in place, beta 1): the same work per element.
    const float alpha = static_cast<float>(a_.alpha), beta = c_beta();
    auto run = [&](const cublasLtMatmulAlgo_t& algo) {
      return cublasLtMatmul(lt_, desc_.get(), &alpha, scratch.buffer(1), layout_a_.get(),
                            scratch.buffer(0), layout_b_.get(), &beta, scratch.buffer(2),
                            layout_d_.get(), scratch.buffer(2), layout_d_.get(), &algo,
                            scratch.buffer(4), kMatmulWorkspaceBytes,
                            ctx.stream) == CUBLAS_STATUS_SUCCESS;
    };
    float best = -1.0f;
    for (int k = 0; ok && k < found; ++k) {
      if (results[k].state != CUBLAS_STATUS_SUCCESS) continue;
      float ms = time_graph_replays(ctx.stream, scratch.start, scratch.end, kAutotuneRuns,
                                    [&] { return run(results[k].algo); });
      if (ms < 0.0f) continue;
      if (best < 0.0f) ms /= kAutotuneMargin;  // the heuristic's own first choice
      if (best < 0.0f || ms < best) {
        best = ms;
        algo_ = results[k].algo;
      }
    }
    return best >= 0.0f;
  }

  Error set_preferences(cublasLtMatmulPreference_t raw) {
    return status(set_preference(raw, kMatmulWorkspaceBytes,
                                 {align_a_, align_b_, align_c_, align_d_}),
                  "setting the workspace limit and alignments");
  }

  // Asks the heuristic for the best algorithm under the current alignments; host-only, so it is
  // also safe while the stream is being captured.
  Error choose_algorithm() {
    cublasLtMatmulPreference_t raw = nullptr;
    KILN_TRY(status(cublasLtMatmulPreferenceCreate(&raw), "cublasLtMatmulPreferenceCreate"));
    Preference preference(raw);
    KILN_TRY(set_preferences(raw));
    cublasLtMatmulHeuristicResult_t result{};
    int found = 0;
    const cublasStatus_t s =
        cublasLtMatmulAlgoGetHeuristic(lt_, desc_.get(), layout_a_.get(), layout_b_.get(),
                                       layout_d_.get(), layout_d_.get(), raw, 1, &result, &found);
    if (s != CUBLAS_STATUS_SUCCESS || found == 0) {
      return fail(nullptr, Error::NotSupported,
                  "Kiln engine: op %zu (matmul): cuBLASLt has no algorithm for batch %lld, M %lld, "
                  "N %lld, K %lld, trans_a %d, trans_b %d, %s -> %s (%s)",
                  op_, ll(a_.batch), ll(a_.m), ll(a_.n), ll(a_.k), a_.trans_a, a_.trans_b,
                  dtype_name(in_dtype_), dtype_name(out_dtype_),
                  s != CUBLAS_STATUS_SUCCESS ? cublasLtGetStatusString(s) : "no heuristic result");
    }
    algo_ = result.algo;
    return Error::Ok;
  }

  bool has_residual() const { return a_.residual != kNoTensor; }
  float c_beta() const { return has_residual() ? 1.0f : 0.0f; }

  MatmulArgs a_;
  cublasLtHandle_t lt_;
  DType in_dtype_, out_dtype_, bias_dtype_;
  size_t out_nbytes_;
  size_t op_ = 0;
  bool empty_ = false;
  bool lt_bias_ = false;
  bool post_bias_ = false;
  Epilogue post_act_ = Epilogue::kNone;
  MatmulDesc desc_;
  Layout layout_a_, layout_b_, layout_d_;
  uint32_t align_a_ = 16, align_b_ = 16, align_c_ = 16, align_d_ = 16;
  cublasLtMatmulAlgo_t algo_{};
};

}  // namespace

Result<UniqueCublasLt> create_cublas_lt() {
  cublasLtHandle_t handle = nullptr;
  const cublasStatus_t status = cublasLtCreate(&handle);
  if (status != CUBLAS_STATUS_SUCCESS) {
    return fail(nullptr, Error::NotSupported,
                "Kiln engine: cannot create a cuBLASLt handle for the graph's matmul ops: %s",
                cublasLtGetStatusString(status));
  }
  return UniqueCublasLt(handle);
}

bool lt_per_column_bias(const MatmulArgs& a, DType bias_dtype, DType out_dtype) {
  return a.bias_row_stride == 0 && a.bias_col_stride == 1 && a.beta == 1.0 &&
         bias_dtype == out_dtype;
}

cublasLtEpilogue_t lt_epilogue(bool bias, Epilogue act, Epilogue& rest) {
  rest = Epilogue::kNone;
  switch (act) {
    case Epilogue::kRelu: return bias ? CUBLASLT_EPILOGUE_RELU_BIAS : CUBLASLT_EPILOGUE_RELU;
    // cuBLASLt's GELU is the tanh approximation (as PyTorch's fused addmm assumes).
    case Epilogue::kGeluTanh: return bias ? CUBLASLT_EPILOGUE_GELU_BIAS : CUBLASLT_EPILOGUE_GELU;
    default:
      rest = act;
      return bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
  }
}

void enqueue_epilogue_pass(const RunContext& ctx, DType dtype, void* out, int64_t total,
                           int64_t m, int64_t n, const void* bias, DType bias_dtype,
                           int64_t row_stride, int64_t col_stride, float beta, Epilogue act) {
  const unsigned blocks = blocks_for(total, kBlock, ctx.max_blocks);
  visit_floating(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    matmul_epilogue_kernel<T><<<blocks, kBlock, 0, ctx.stream>>>(
        static_cast<T*>(out), total, m, n, bias, bias_dtype, row_stride, col_stride, beta, act);
  });
}

cublasStatus_t set_preference(cublasLtMatmulPreference_t preference, uint64_t workspace_bytes,
                              const uint32_t (&alignment)[4]) {
  cublasStatus_t s = cublasLtMatmulPreferenceSetAttribute(
      preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace_bytes,
      sizeof(workspace_bytes));
  const cublasLtMatmulPreferenceAttributes_t which[4] = {
      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
      CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
  for (int t = 0; t < 4 && s == CUBLAS_STATUS_SUCCESS; ++t) {
    s = cublasLtMatmulPreferenceSetAttribute(preference, which[t], &alignment[t],
                                             sizeof(alignment[t]));
  }
  return s;
}

StepResult make_matmul_step(const MatmulArgs& args, const InitContext& ctx) {
  if (gemv_unsupported(args, ctx) == nullptr) return make_gemv_step(args, ctx);
  auto step = std::make_unique<MatmulStep>(args, ctx.graph, ctx.lt);
  KILN_TRY(step->init(ctx));
  return std::unique_ptr<Step>(std::move(step));
}

}  // namespace kiln::engine::kernels
