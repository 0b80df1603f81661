#include "runtime/engine/kernels/conv2d.cuh"

#include <executorch/runtime/platform/log.h>

#include <algorithm>
#include <climits>
#include <string>
#include <vector>

#include "runtime/engine/cuda_check.h"
#include "format/fail.h"
#include "runtime/engine/kernels/autotune.cuh"
#include "runtime/engine/kernels/common.cuh"
#include "runtime/engine/kernels/conv2d_cudnn.h"

namespace kiln::engine::kernels {
namespace {

using blob::DType;
using executorch::runtime::Error;
using executorch::runtime::Result;

// The most workspace one convolution may ask for; faster algorithms that want more are skipped.
constexpr size_t kWorkspaceLimit = size_t{256} << 20;

using TensorDesc = UniqueHandle<cudnnTensorDescriptor_t, cudnnDestroyTensorDescriptor>;
using FilterDesc = UniqueHandle<cudnnFilterDescriptor_t, cudnnDestroyFilterDescriptor>;
using ConvDesc = UniqueHandle<cudnnConvolutionDescriptor_t, cudnnDestroyConvolutionDescriptor>;

Error cudnn_status(cudnnStatus_t status, size_t op, const char* what) {
  if (status == CUDNN_STATUS_SUCCESS) {
    return Error::Ok;
  }
  return fail(nullptr, Error::NotSupported, "Kiln engine: op %zu (conv2d): %s failed: %s", op, what,
              cudnnGetErrorString(status));
}

cudnnDataType_t cudnn_type(DType dtype) {
  switch (dtype) {
    case DType::kFloat16: return CUDNN_DATA_HALF;
    case DType::kBFloat16: return CUDNN_DATA_BFLOAT16;
    default: return CUDNN_DATA_FLOAT;
  }
}

// Which of cuDNN's math types keep the precision the blob asked for: strict fp32 allows FMA
// only, TF32 allows tensor cores but not down-conversion to fp16, 16-bit types allow anything.
bool math_allowed(cudnnMathType_t math, DType dtype, bool strict_fp32) {
  if (strict_fp32) {
    return math != CUDNN_TENSOR_OP_MATH && math != CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION;
  }
  return dtype != DType::kFloat32 || math != CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION;
}

// A patch convolution's input regrouped patch by patch (enqueue_space_to_depth): element i of
// patches [N, H_out, W_out, kH, kW, C] from NHWC x. Consecutive threads copy the kW * C
// contiguous elements of one patch row.
template <typename T>
__global__ void space_to_depth_kernel(const T* __restrict__ x, T* __restrict__ patches,
                                      int64_t total, int64_t h, int64_t w, int64_t c, int64_t kh,
                                      int64_t kw, int64_t h_out, int64_t w_out) {
  for (int64_t i = thread_index(); i < total; i += thread_count()) {
    const int64_t row = kw * c;  // one patch row: contiguous in x
    const int64_t in_row = i % row;
    int64_t t = i / row;
    const int64_t r = t % kh;
    t /= kh;
    const int64_t ow = t % w_out;
    t /= w_out;
    const int64_t oh = t % h_out;
    const int64_t n = t / h_out;
    patches[i] = x[((n * h + oh * kh + r) * w + ow * kw) * c + in_row];
  }
}

// The convolution's epilogue in one pass over out: out = act(out + bias[c] + residual), in fp32
// and rounded once. Element i's channel is (i / plane) % channels in NCHW (`plane` is
// H_out * W_out), i % channels in NHWC (plane 1). bias and residual may be null.
template <typename T>
__global__ void conv_epilogue_kernel(T* __restrict__ out, int64_t total, int64_t plane,
                                     int64_t channels, const void* __restrict__ bias,
                                     DType bias_dtype, const T* __restrict__ residual,
                                     blob::Epilogue act) {
  for (int64_t i = thread_index(); i < total; i += thread_count()) {
    float v = to_float(out[i]);
    if (bias != nullptr) {
      v += static_cast<float>(load_f64(bias, bias_dtype, (i / plane) % channels));
    }
    if (residual != nullptr) {
      v += to_float(residual[i]);
    }
    out[i] = from_float<T>(apply_epilogue(v, act));
  }
}

// Depthwise convolution (groups == C_in == C_out) with its epilogue in the same pass: a thread
// per output element, its k x k window read through the cache (neighbouring threads share rows
// in NCHW, channels in NHWC), fp32 accumulation, then + bias[c] + residual and the activation,
// rounded once. The weight [C, 1, kH, kW] is laid out alike in OIHW and KRSC. cuDNN runs these
// as a grouped direct convolution plus Kiln's epilogue pass, two launches at several
// microseconds each on the small planes of mobilenet and efficientnet.
template <typename T, bool kNhwc>
__global__ void depthwise_conv_kernel(const T* __restrict__ x, const T* __restrict__ w,
                                      const void* __restrict__ bias, DType bias_dtype,
                                      const T* __restrict__ residual, T* __restrict__ out,
                                      const Conv2dArgs a) {
  const uint32_t total = static_cast<uint32_t>(a.n * a.c_out * a.h_out * a.w_out);
  const uint32_t w_out = static_cast<uint32_t>(a.w_out), h_out = static_cast<uint32_t>(a.h_out);
  const uint32_t channels = static_cast<uint32_t>(a.c_out);
  const int kh = static_cast<int>(a.kh), kw = static_cast<int>(a.kw);
  const int h = static_cast<int>(a.h), wd = static_cast<int>(a.w);
  for (uint32_t i = static_cast<uint32_t>(thread_index()); i < total;
       i += static_cast<uint32_t>(thread_count())) {
    uint32_t c, ox, oy, img;
    if constexpr (kNhwc) {
      c = i % channels;
      const uint32_t t = i / channels;
      ox = t % w_out;
      oy = (t / w_out) % h_out;
      img = t / w_out / h_out;
    } else {
      ox = i % w_out;
      const uint32_t t = i / w_out;
      oy = t % h_out;
      c = (t / h_out) % channels;
      img = t / h_out / channels;
    }
    // x[img, c, iy, ix] is at xp[(iy * W + ix) * step].
    const size_t step = kNhwc ? channels : 1;
    const T* xp = kNhwc ? x + static_cast<size_t>(img) * h * wd * channels + c
                        : x + (static_cast<size_t>(img) * channels + c) * h * wd;
    const T* wp = w + static_cast<size_t>(c) * kh * kw;
    const int y0 = static_cast<int>(oy * a.stride_h) - static_cast<int>(a.pad_h);
    const int x0 = static_cast<int>(ox * a.stride_w) - static_cast<int>(a.pad_w);
    float acc = 0.0f;
    for (int r = 0; r < kh; ++r) {
      const int iy = y0 + r * static_cast<int>(a.dil_h);
      if (iy < 0 || iy >= h) continue;
      for (int q = 0; q < kw; ++q) {
        const int ix = x0 + q * static_cast<int>(a.dil_w);
        if (ix < 0 || ix >= wd) continue;
        acc += to_float(__ldg(xp + static_cast<size_t>(iy * wd + ix) * step)) *
               to_float(__ldg(wp + r * kw + q));
      }
    }
    if (bias != nullptr) acc += static_cast<float>(load_f64(bias, bias_dtype, c));
    if (residual != nullptr) acc += to_float(residual[i]);
    out[i] = from_float<T>(apply_epilogue(acc, a.epilogue));
  }
}

class Conv2dStep final : public Step {
 public:
  explicit Conv2dStep(const Conv2dArgs& a, const Graph& graph)
      : a_(a),
        dtype_(graph.tensors[a.x].dtype),
        bias_dtype_(a.bias == kNoTensor ? DType::kFloat32 : graph.tensors[a.bias].dtype),
        out_nbytes_(graph.tensors[a.out].nbytes) {}

  Error init(const InitContext& ctx) {
    const int64_t total_out = a_.n * a_.c_out * a_.h_out * a_.w_out;
    if (total_out == 0) {
      mode_ = Mode::kNothing;
      return Error::Ok;
    }
    if (a_.c_in == 0 || a_.h * a_.w == 0) {
      mode_ = Mode::kZeroInput;  // no input element reaches the output: it is just the epilogue of 0
      return Error::Ok;
    }
    if (a_.groups == a_.c_in && a_.c_in == a_.c_out &&
        a_.kh * a_.kw <= 49 && total_out <= INT32_MAX && a_.n * a_.c_in * a_.h * a_.w <= INT32_MAX) {
      mode_ = Mode::kDepthwise;
      return Error::Ok;
    }
    for (int64_t v : {a_.n, a_.c_in, a_.h, a_.w, a_.c_out, a_.kh, a_.kw, a_.stride_h, a_.stride_w,
                      a_.pad_h, a_.pad_w, a_.dil_h, a_.dil_w, a_.groups, a_.h_out, a_.w_out}) {
      if (v > INT_MAX) {
        return fail(nullptr, Error::NotSupported,
                    "Kiln engine: op %zu (conv2d): a dimension or parameter is %lld, above "
                    "cuDNN's 32-bit limit",
                    ctx.op_index, static_cast<long long>(v));
      }
    }
    const size_t op = ctx.op_index;
    const cudnnDataType_t type = cudnn_type(dtype_);
    cudnnTensorDescriptor_t x_desc = nullptr;
    cudnnTensorDescriptor_t y_desc = nullptr;
    cudnnFilterDescriptor_t w_desc = nullptr;
    cudnnConvolutionDescriptor_t conv_desc = nullptr;
    KILN_TRY(cudnn_status(cudnnCreateTensorDescriptor(&x_desc), op, "cudnnCreateTensorDescriptor"));
    x_desc_.reset(x_desc);
    KILN_TRY(cudnn_status(cudnnCreateTensorDescriptor(&y_desc), op, "cudnnCreateTensorDescriptor"));
    y_desc_.reset(y_desc);
    KILN_TRY(cudnn_status(cudnnCreateFilterDescriptor(&w_desc), op, "cudnnCreateFilterDescriptor"));
    w_desc_.reset(w_desc);
    KILN_TRY(cudnn_status(cudnnCreateConvolutionDescriptor(&conv_desc), op,
                          "cudnnCreateConvolutionDescriptor"));
    conv_desc_.reset(conv_desc);

    const auto i = [](int64_t v) { return static_cast<int>(v); };
    // channels_last: x and out NHWC, the weight KRSC (cuDNN's NHWC filter format).
    const cudnnTensorFormat_t format = a_.channels_last ? CUDNN_TENSOR_NHWC : CUDNN_TENSOR_NCHW;
    KILN_TRY(cudnn_status(cudnnSetTensor4dDescriptor(x_desc, format, type, i(a_.n), i(a_.c_in),
                                                     i(a_.h), i(a_.w)),
                          op, "describing the input"));
    KILN_TRY(cudnn_status(cudnnSetFilter4dDescriptor(w_desc, type, format, i(a_.c_out),
                                                     i(a_.c_in / a_.groups), i(a_.kh), i(a_.kw)),
                          op, "describing the weight"));
    KILN_TRY(cudnn_status(cudnnSetConvolution2dDescriptor(
                              conv_desc, i(a_.pad_h), i(a_.pad_w), i(a_.stride_h), i(a_.stride_w),
                              i(a_.dil_h), i(a_.dil_w), CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT),
                          op, "describing the convolution"));
    KILN_TRY(cudnn_status(cudnnSetConvolutionGroupCount(conv_desc, i(a_.groups)), op,
                          "setting the group count"));
    // Plain fp32 must not silently drop to TF32 tensor cores; kTf32 and 16-bit types may use them.
    strict_fp32_ = dtype_ == DType::kFloat32 && ctx.graph.precision != blob::Precision::kTf32;
    const cudnnMathType_t math = strict_fp32_                ? CUDNN_FMA_MATH
                                 : dtype_ == DType::kFloat32 ? CUDNN_DEFAULT_MATH
                                                             : CUDNN_TENSOR_OP_MATH;
    KILN_TRY(
        cudnn_status(cudnnSetConvolutionMathType(conv_desc, math), op, "setting the math type"));
    int dims[4] = {};
    KILN_TRY(cudnn_status(cudnnGetConvolution2dForwardOutputDim(conv_desc, x_desc, w_desc, &dims[0],
                                                                &dims[1], &dims[2], &dims[3]),
                          op, "computing the output shape"));
    if (dims[0] != a_.n || dims[1] != a_.c_out || dims[2] != a_.h_out || dims[3] != a_.w_out) {
      return fail(nullptr, Error::InvalidProgram,
                  "Kiln engine: op %zu (conv2d): cuDNN computes output [%d, %d, %d, %d] but the "
                  "blob declares [%lld, %lld, %lld, %lld]",
                  op, dims[0], dims[1], dims[2], dims[3], static_cast<long long>(a_.n),
                  static_cast<long long>(a_.c_out), static_cast<long long>(a_.h_out),
                  static_cast<long long>(a_.w_out));
    }
    KILN_TRY(cudnn_status(cudnnSetTensor4dDescriptor(y_desc, format, type, i(a_.n),
                                                     i(a_.c_out), i(a_.h_out), i(a_.w_out)),
                          op, "describing the output"));
    return choose_algorithm(ctx, math);
  }

  Error enqueue(const RunContext& ctx) override {
    if (mode_ == Mode::kNothing) {
      return Error::Ok;
    }
    void* y = ctx.ptr(a_.out);
    if (mode_ == Mode::kDepthwise) {
      const int64_t total = a_.n * a_.c_out * a_.h_out * a_.w_out;
      const void* bias = a_.bias == kNoTensor ? nullptr : ctx.ptr(a_.bias);
      visit_floating(dtype_, [&](auto tag) {
        using T = typename decltype(tag)::type;
        const T* residual = a_.residual == kNoTensor ? nullptr : ctx.ptr<const T>(a_.residual);
        const unsigned blocks = blocks_for(total, kBlock, ctx.max_blocks);
        const T* x = ctx.ptr<const T>(a_.x);
        const T* w = ctx.ptr<const T>(a_.weight);
        if (a_.channels_last) {
          depthwise_conv_kernel<T, true><<<blocks, kBlock, 0, ctx.stream>>>(
              x, w, bias, bias_dtype_, residual, static_cast<T*>(y), a_);
        } else {
          depthwise_conv_kernel<T, false><<<blocks, kBlock, 0, ctx.stream>>>(
              x, w, bias, bias_dtype_, residual, static_cast<T*>(y), a_);
        }
      });
      return Error::Ok;
    }
    if (mode_ == Mode::kZeroInput) {
      KILN_TRY(cuda_status(cudaMemsetAsync(y, 0, out_nbytes_, ctx.stream), Error::Internal,
                           "Kiln engine: op %zu (conv2d): cudaMemsetAsync failed", ctx.op_index));
    } else {
      KILN_TRY(cudnn_status(cudnnSetStream(ctx.cudnn, ctx.stream), ctx.op_index, "cudnnSetStream"));
      const float alpha = 1.0f;
      const float beta = 0.0f;
      const cudnnStatus_t status = cudnnConvolutionForward(
          ctx.cudnn, &alpha, x_desc_.get(), ctx.ptr(a_.x), w_desc_.get(), ctx.ptr(a_.weight),
          conv_desc_.get(), algo_, ctx.workspace, workspace_bytes_, &beta, y_desc_.get(), y);
      if (status != CUDNN_STATUS_SUCCESS) {
        return fail(nullptr, Error::Internal,
                    "Kiln engine: op %zu (conv2d): cudnnConvolutionForward failed: %s",
                    ctx.op_index, cudnnGetErrorString(status));
      }
    }
    if (a_.bias != kNoTensor || a_.residual != kNoTensor || a_.epilogue != blob::Epilogue::kNone) {
      return enqueue_conv_epilogue(a_, dtype_, y, a_.bias == kNoTensor ? nullptr : ctx.ptr(a_.bias),
                                   bias_dtype_,
                                   a_.residual == kNoTensor ? nullptr : ctx.ptr(a_.residual),
                                   a_.epilogue, ctx);
    }
    return Error::Ok;
  }

  size_t workspace_bytes() const override { return workspace_bytes_; }

 private:
  enum class Mode { kCudnn, kDepthwise, kZeroInput, kNothing };

  // By default cuDNN's heuristic ranking. With autotuning on (KILN_AUTOTUNE=1), the choice
  // remembered in the algorithm cache when the library still accepts it, else the fastest
  // algorithm timed on this device, which is then remembered.
  Error choose_algorithm(const InitContext& ctx, cudnnMathType_t math) {
    const size_t op = ctx.op_index;
    if (const std::vector<int64_t>* e = ctx.autotune ? ctx.algos.find(op, "conv") : nullptr) {
      if (use_cached(ctx.cudnn, *e, math)) {
        ++ctx.algos.hits;
        return Error::Ok;
      }
      ctx.algos.drop(op);
    }
    cudnnConvolutionFwdAlgoPerf_t perf[CUDNN_CONVOLUTION_FWD_ALGO_COUNT];
    int returned = 0;
    const bool searched = ctx.autotune && search(ctx, perf, &returned);
    if (!searched) {
      KILN_TRY(cudnn_status(cudnnGetConvolutionForwardAlgorithm_v7(
                                ctx.cudnn, x_desc_.get(), w_desc_.get(), conv_desc_.get(),
                                y_desc_.get(), CUDNN_CONVOLUTION_FWD_ALGO_COUNT, &returned, perf),
                            op, "cudnnGetConvolutionForwardAlgorithm_v7"));
    }
    for (int k = 0; k < returned; ++k) {
      if (try_algorithm(ctx.cudnn, perf[k].algo, perf[k].mathType, perf[k].status, perf[k].memory,
                        math)) {
        if (searched) {
          ++ctx.algos.misses;
          ctx.algos.put(op, "conv", {static_cast<int64_t>(algo_), static_cast<int64_t>(math_)});
        }
        return Error::Ok;
      }
    }
    return fail(nullptr, Error::NotSupported,
                "Kiln engine: op %zu (conv2d): cuDNN offers no usable algorithm for N=%lld "
                "C_in=%lld H=%lld W=%lld C_out=%lld kernel %lldx%lld groups %lld (%s)",
                op, static_cast<long long>(a_.n), static_cast<long long>(a_.c_in),
                static_cast<long long>(a_.h), static_cast<long long>(a_.w),
                static_cast<long long>(a_.c_out), static_cast<long long>(a_.kh),
                static_cast<long long>(a_.kw), static_cast<long long>(a_.groups),
                dtype_name(dtype_));
  }

  bool use_cached(cudnnHandle_t handle, const std::vector<int64_t>& e, cudnnMathType_t math) {
    if (e.size() != 2 || e[0] < 0 || e[0] >= CUDNN_CONVOLUTION_FWD_ALGO_COUNT || e[1] < 0 ||
        e[1] > CUDNN_FMA_MATH) {
      return false;
    }
    return try_algorithm(handle, static_cast<cudnnConvolutionFwdAlgo_t>(e[0]),
                         static_cast<cudnnMathType_t>(e[1]), CUDNN_STATUS_SUCCESS, 0, math);
  }

  // Takes `algo` when it keeps the blob's precision and its workspace (asked for under exactly
  // these settings) is within the limit; false leaves the step unchanged for the next candidate.
  bool try_algorithm(cudnnHandle_t handle, cudnnConvolutionFwdAlgo_t algo,
                     cudnnMathType_t algo_math, cudnnStatus_t rated, size_t rated_memory,
                     cudnnMathType_t math) {
    if (rated != CUDNN_STATUS_SUCCESS || rated_memory > kWorkspaceLimit ||
        !math_allowed(algo_math, dtype_, strict_fp32_)) {
      return false;
    }
    // Strict fp32 keeps FMA only; otherwise pin the math type the algorithm was rated with.
    const cudnnMathType_t chosen = strict_fp32_ ? math : algo_math;
    size_t bytes = 0;
    if (cudnnSetConvolutionMathType(conv_desc_.get(), chosen) != CUDNN_STATUS_SUCCESS ||
        cudnnGetConvolutionForwardWorkspaceSize(handle, x_desc_.get(), w_desc_.get(),
                                                conv_desc_.get(), y_desc_.get(), algo,
                                                &bytes) != CUDNN_STATUS_SUCCESS ||
        bytes > kWorkspaceLimit) {
      return false;
    }
    algo_ = algo;
    math_ = chosen;
    workspace_bytes_ = bytes;
    return true;
  }

  // Ranks the algorithms by their time on this device, fastest first, on scratch buffers of this
  // op's sizes. False, with nothing logged as an error, when the scratch memory is not there: the
  // heuristic's ranking is then used and nothing is remembered.
  bool search(const InitContext& ctx, cudnnConvolutionFwdAlgoPerf_t* perf, int* returned) {
    const size_t elem = element_size(dtype_);
    const size_t x_bytes = static_cast<size_t>(a_.n * a_.c_in * a_.h * a_.w) * elem;
    const size_t w_bytes =
        static_cast<size_t>(a_.c_out * (a_.c_in / a_.groups) * a_.kh * a_.kw) * elem;
    size_t free_bytes = 0, total_bytes = 0;
    if (cudaMemGetInfo(&free_bytes, &total_bytes) != cudaSuccess) {
      (void)cudaGetLastError();
      return false;
    }
    const size_t ws_bytes = std::min(kWorkspaceLimit, free_bytes / 4);
    const AutotuneScratch scratch{x_bytes, w_bytes, out_nbytes_, ws_bytes};
    const bool ok = scratch.ok() &&
                    cudnnSetStream(ctx.cudnn, ctx.stream) == CUDNN_STATUS_SUCCESS &&
                    time_candidates(ctx, scratch, ws_bytes, perf, returned) &&
                    cudaStreamSynchronize(ctx.stream) == cudaSuccess;
    (void)cudaGetLastError();
    if (!ok) {
      ET_LOG(Info,
             "Kiln engine: op %zu (conv2d): could not time algorithms here (no scratch memory?); "
             "using cuDNN's heuristic choice",
             ctx.op_index);
    }
    return ok;
  }

  // Every usable candidate of the heuristic's list, timed the way the engine runs it: one call
  // captured into a CUDA graph, the graph launched once to warm up and then kAutotuneRuns times
  // between two events; perf[k].time becomes the mean, and the list is sorted by it. (Timing
  // eager calls instead ranks by cuDNN's host-side launch cost, which graph replay removes, and
  // picks slower kernels.) A candidate that cannot be captured is not usable: the engine's runs
  // are graph replays.
  bool time_candidates(const InitContext& ctx, const AutotuneScratch& scratch, size_t ws_bytes,
                       cudnnConvolutionFwdAlgoPerf_t* perf, int* returned) {
    if (cudnnGetConvolutionForwardAlgorithm_v7(ctx.cudnn, x_desc_.get(), w_desc_.get(),
                                               conv_desc_.get(), y_desc_.get(),
                                               CUDNN_CONVOLUTION_FWD_ALGO_COUNT, returned,
                                               perf) != CUDNN_STATUS_SUCCESS) {
      return false;
    }
    const float alpha = 1.0f, beta = 0.0f;
    auto run = [&](cudnnConvolutionFwdAlgo_t algo, size_t bytes) {
      return cudnnConvolutionForward(ctx.cudnn, &alpha, x_desc_.get(), scratch.buffer(0),
                                     w_desc_.get(), scratch.buffer(1), conv_desc_.get(), algo,
                                     scratch.buffer(3), bytes, &beta, y_desc_.get(),
                                     scratch.buffer(2)) == CUDNN_STATUS_SUCCESS;
    };
    const cudnnMathType_t math = strict_fp32_ ? CUDNN_FMA_MATH : CUDNN_DEFAULT_MATH;
    constexpr int kMaxTimed = 4;  // the heuristic's first few: the rest can take milliseconds each
    int timed = 0;
    for (int k = 0; k < *returned; ++k) {
      cudnnConvolutionFwdAlgoPerf_t& p = perf[k];
      size_t bytes = 0;
      const cudnnMathType_t chosen = strict_fp32_ ? math : p.mathType;
      float ms = -1.0f;
      if (p.status == CUDNN_STATUS_SUCCESS && p.memory <= ws_bytes &&
          math_allowed(p.mathType, dtype_, strict_fp32_) &&
          cudnnSetConvolutionMathType(conv_desc_.get(), chosen) == CUDNN_STATUS_SUCCESS &&
          cudnnGetConvolutionForwardWorkspaceSize(ctx.cudnn, x_desc_.get(), w_desc_.get(),
                                                  conv_desc_.get(), y_desc_.get(), p.algo,
                                                  &bytes) == CUDNN_STATUS_SUCCESS &&
          bytes <= ws_bytes) {
        ms = time_graph_replays(ctx.stream, scratch.start, scratch.end, kAutotuneRuns,
                                [&] { return run(p.algo, bytes); });
      }
      (void)cudaGetLastError();
      if (ms >= 0.0f && timed == 0) ms /= kAutotuneMargin;  // the heuristic's own first choice
      p.time = ms;
      if (ms < 0.0f) p.status = CUDNN_STATUS_NOT_SUPPORTED;
      if (ms >= 0.0f && ++timed == kMaxTimed) {
        for (int rest = k + 1; rest < *returned; ++rest) perf[rest].status = CUDNN_STATUS_NOT_SUPPORTED;
        break;
      }
    }
    std::stable_sort(perf, perf + *returned, [](const auto& a, const auto& b) {
      const bool a_ok = a.status == CUDNN_STATUS_SUCCESS, b_ok = b.status == CUDNN_STATUS_SUCCESS;
      return a_ok != b_ok ? a_ok : a_ok && a.time < b.time;
    });
    return timed > 0;  // none timed: the caller falls back to the heuristic's ranking
  }

  Conv2dArgs a_;
  DType dtype_, bias_dtype_;
  size_t out_nbytes_;
  Mode mode_ = Mode::kCudnn;
  bool strict_fp32_ = false;
  TensorDesc x_desc_, y_desc_;
  FilterDesc w_desc_;
  ConvDesc conv_desc_;
  cudnnConvolutionFwdAlgo_t algo_ = CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM;
  cudnnMathType_t math_ = CUDNN_DEFAULT_MATH;
  size_t workspace_bytes_ = 0;
};

}  // namespace

Error enqueue_conv_epilogue(const Conv2dArgs& a, DType dtype, void* out, const void* bias,
                            DType bias_dtype, const void* residual, blob::Epilogue act,
                            const RunContext& ctx) {
  const int64_t total = a.n * a.c_out * a.h_out * a.w_out;
  const unsigned blocks = blocks_for(total, kBlock, ctx.max_blocks);
  const int64_t plane = a.channels_last ? 1 : a.h_out * a.w_out;
  visit_floating(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    conv_epilogue_kernel<T><<<blocks, kBlock, 0, ctx.stream>>>(
        static_cast<T*>(out), total, plane, a.c_out, bias, bias_dtype,
        static_cast<const T*>(residual), act);
  });
  return Error::Ok;
}

Error enqueue_space_to_depth(const Conv2dArgs& a, DType dtype, const void* x, void* patches,
                             const RunContext& ctx) {
  const int64_t total = a.n * a.h_out * a.w_out * a.kh * a.kw * a.c_in;
  const unsigned blocks = blocks_for(total, kBlock, ctx.max_blocks);
  visit_floating(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    space_to_depth_kernel<T><<<blocks, kBlock, 0, ctx.stream>>>(
        static_cast<const T*>(x), static_cast<T*>(patches), total, a.h, a.w, a.c_in, a.kh, a.kw,
        a.h_out, a.w_out);
  });
  return Error::Ok;
}

Result<UniqueCudnn> create_cudnn() {
  cudnnHandle_t handle = nullptr;
  const cudnnStatus_t status = cudnnCreate(&handle);
  if (status != CUDNN_STATUS_SUCCESS) {
    return fail(nullptr, Error::NotSupported,
                "Kiln engine: cannot create a cuDNN handle for the graph's conv2d ops: %s (is "
                "libcudnn.so.9 installed next to the CUDA libraries?)",
                cudnnGetErrorString(status));
  }
  return UniqueCudnn(handle);
}

StepResult make_conv2d_step(const Conv2dArgs& args, const InitContext& ctx) {
  if (const char* why = cudnn_fused_conv_unsupported(args, ctx.graph); why == nullptr) {
    StepResult fused = make_cudnn_fused_conv_step(args, ctx);
    if (fused.ok() || fused.error() != Error::NotSupported) return fused;
  }
  auto step = std::make_unique<Conv2dStep>(args, ctx.graph);
  KILN_TRY(step->init(ctx));
  return std::unique_ptr<Step>(std::move(step));
}

}  // namespace kiln::engine::kernels
