#include "runtime/engine/kernels/layer_norm.cuh"

#include <algorithm>
#include <optional>

#include "runtime/engine/kernels/common.cuh"

namespace kiln::engine::kernels {
namespace {

using blob::DType;
using executorch::runtime::Error;

struct Affine {
  const void* weight;  // null: 1
  const void* bias;    // null: 0
  DType weight_dtype, bias_dtype;
};

// One group of kGroup threads per row (a warp for short rows, the block for long ones). The mean
// comes first and the variance is taken around it, which avoids the cancellation of E[x^2]-E[x]^2;
// the re-reads of the row hit L1/L2. rms (RMSNorm): the mean is 0, the variance is mean(x^2).
template <typename T, int kGroup>
__global__ void layer_norm_kernel(const T* __restrict__ x, T* __restrict__ out, int64_t rows,
                                  int64_t cols, float eps, const Affine affine, bool rms) {
  __shared__ float scratch[32];
  const int lane = threadIdx.x % kGroup;
  const int64_t groups_per_block = blockDim.x / kGroup;
  const int64_t first = blockIdx.x * groups_per_block + threadIdx.x / kGroup;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * groups_per_block;
  const float inv_cols = 1.0f / static_cast<float>(cols);
  for (int64_t row = first; row < rows; row += stride) {
    const T* xr = x + row * cols;
    T* outr = out + row * cols;
    float sum = 0.0f;
    for (int64_t c = lane; c < cols && !rms; c += kGroup) {
      sum += to_float(xr[c]);
    }
    const float mean = rms ? 0.0f : group_reduce<kGroup>(sum, SumOp{}, scratch) * inv_cols;
    float squares = 0.0f;
    for (int64_t c = lane; c < cols; c += kGroup) {
      const float d = to_float(xr[c]) - mean;
      squares += d * d;
    }
    const float variance = group_reduce<kGroup>(squares, SumOp{}, scratch) * inv_cols;
    const float rstd = rsqrtf(variance + eps);
    for (int64_t c = lane; c < cols; c += kGroup) {
      float y = (to_float(xr[c]) - mean) * rstd;
      if (affine.weight != nullptr) {
        y *= static_cast<float>(load_f64(affine.weight, affine.weight_dtype, c));
      }
      if (affine.bias != nullptr) {
        y += static_cast<float>(load_f64(affine.bias, affine.bias_dtype, c));
      }
      outr[c] = from_float<T>(y);
    }
  }
}

// The mean (0 for RMSNorm) and 1 / sqrt(variance + eps) of a block's row held in registers, kN
// values a thread, those outside the row 0; `in(i)` says whether value i is in the row. Two
// passes: the variance is taken around the mean.
template <int kThreads, int kN, typename In>
__device__ __forceinline__ float2 row_mean_rstd(const float (&v)[kN], In in, float inv_cols,
                                                float eps, bool rms, float* scratch) {
  float sum = 0.0f;
#pragma unroll
  for (int i = 0; i < kN; ++i) sum += v[i];
  const float mean = rms ? 0.0f : group_reduce<kThreads>(sum, SumOp{}, scratch) * inv_cols;
  float squares = 0.0f;
#pragma unroll
  for (int i = 0; i < kN; ++i) {
    const float d = in(i) ? v[i] - mean : 0.0f;
    squares += d * d;
  }
  const float variance = group_reduce<kThreads>(squares, SumOp{}, scratch) * inv_cols;
  return make_float2(mean, rsqrtf(variance + eps));
}

// Rows of up to kThreads * kPerThread columns: one block per row, the row held in registers, so
// it is read from memory once (the kernel above reads it three times). Same two-pass arithmetic.
// Transformer widths (768..8192) at a few hundred rows are latency-bound, and a block per row
// spreads them over every SM where a warp per row used a handful.
template <typename T, int kThreads, int kPerThread>
__global__ void __launch_bounds__(kThreads) layer_norm_cached_kernel(
    const T* __restrict__ x, T* __restrict__ out, int64_t rows, int64_t cols, float eps,
    const Affine affine, bool rms) {
  __shared__ float scratch[32];
  const float inv_cols = 1.0f / static_cast<float>(cols);
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const T* xr = x + row * cols;
    T* outr = out + row * cols;
    float v[kPerThread];
    float w[kPerThread];  // the affine weight and bias, loaded with the row so that their
    float b[kPerThread];  // latency overlaps the row's instead of following the reductions
    const auto column = [](int i) { return threadIdx.x + static_cast<int64_t>(i) * kThreads; };
#pragma unroll
    for (int i = 0; i < kPerThread; ++i) {
      const int64_t c = column(i);
      const bool in = c < cols;
      v[i] = in ? to_float(xr[c]) : 0.0f;
      w[i] = in && affine.weight != nullptr
                 ? static_cast<float>(load_f64(affine.weight, affine.weight_dtype, c))
                 : 1.0f;
      b[i] = in && affine.bias != nullptr
                 ? static_cast<float>(load_f64(affine.bias, affine.bias_dtype, c))
                 : 0.0f;
    }
    const float2 stats = row_mean_rstd<kThreads>(
        v, [&](int i) { return column(i) < cols; }, inv_cols, eps, rms, scratch);
    const float mean = stats.x, rstd = stats.y;
#pragma unroll
    for (int i = 0; i < kPerThread; ++i) {
      const int64_t c = threadIdx.x + static_cast<int64_t>(i) * kThreads;
      if (c < cols) outr[c] = from_float<T>((v[i] - mean) * rstd * w[i] + b[i]);
    }
  }
}

// `kWidth` floats from `p[i..]` (i a multiple of kWidth), in 16-byte loads.
template <int kWidth, typename W>
__device__ __forceinline__ void load_floats(const W* __restrict__ p, int64_t i, float* dst) {
  constexpr int kChunk = 16 / static_cast<int>(sizeof(W));
  static_assert(kWidth % kChunk == 0, "a vector is whole 16-byte loads");
#pragma unroll
  for (int c = 0; c < kWidth / kChunk; ++c) {
    const Pack<W, kChunk> pk = *reinterpret_cast<const Pack<W, kChunk>*>(p + i + c * kChunk);
#pragma unroll
    for (int j = 0; j < kChunk; ++j) dst[c * kChunk + j] = to_float(pk.v[j]);
  }
}

// The common case of the register-cached kernel, vectorised: the row, the weight and the bias in
// 16-byte loads, all issued before the first reduction, their dtypes (W: the row's or fp32) fixed
// at compile time. The generic kernel's per-element dtype switches kept its loads from being
// issued together, so a 768-column row waited on a dozen dependent memory round trips.
template <typename T, typename W, int kThreads, int kVecs>
__global__ void __launch_bounds__(kThreads) layer_norm_vec_kernel(
    const T* __restrict__ x, T* __restrict__ out, int64_t rows, int64_t cols, float eps,
    const W* __restrict__ weight, const W* __restrict__ bias, bool rms) {
  constexpr int kWidth = 16 / static_cast<int>(sizeof(T));
  __shared__ float scratch[32];
  wait_for_previous_kernel();   // launched overlapped (common.cuh)
  allow_next_kernel();
  const float inv_cols = 1.0f / static_cast<float>(cols);
  const int64_t vecs = cols / kWidth;
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    const T* xr = x + row * cols;
    T* outr = out + row * cols;
    // Vector i of this thread is the row's vector threadIdx.x + i * kThreads, its values
    // v[i * kWidth ..].
    float v[kVecs * kWidth], w[kVecs * kWidth], b[kVecs * kWidth];
    const auto vector = [](int i) { return threadIdx.x + static_cast<int64_t>(i) * kThreads; };
#pragma unroll
    for (int i = 0; i < kVecs; ++i) {
#pragma unroll
      for (int j = 0; j < kWidth; ++j) {
        v[i * kWidth + j] = 0.0f, w[i * kWidth + j] = 1.0f, b[i * kWidth + j] = 0.0f;
      }
      if (vector(i) < vecs) {
        load_floats<kWidth>(xr, vector(i) * kWidth, v + i * kWidth);
        if (weight != nullptr) load_floats<kWidth>(weight, vector(i) * kWidth, w + i * kWidth);
        if (bias != nullptr) load_floats<kWidth>(bias, vector(i) * kWidth, b + i * kWidth);
      }
    }
    const float2 stats = row_mean_rstd<kThreads>(
        v, [&](int e) { return vector(e / kWidth) < vecs; }, inv_cols, eps, rms, scratch);
#pragma unroll
    for (int i = 0; i < kVecs; ++i) {
      if (vector(i) >= vecs) continue;
      Pack<T, kWidth> pk;
#pragma unroll
      for (int j = 0; j < kWidth; ++j) {
        const int e = i * kWidth + j;
        pk.v[j] = from_float<T>((v[e] - stats.x) * stats.y * w[e] + b[e]);
      }
      *reinterpret_cast<Pack<T, kWidth>*>(outr + vector(i) * kWidth) = pk;
    }
  }
}

// The vectorised kernel for one width class: rows of up to kThreads * kVecs 16-byte vectors.
template <typename T, typename W, int kThreads, int kVecs>
void launch_vec(const T* x, T* out, int64_t rows, int64_t cols, float eps, const Affine& affine,
                bool rms, const RunContext& ctx) {
  const int max_blocks = std::max(1, static_cast<int>(int64_t{ctx.max_blocks} * kBlock / kThreads));
  const unsigned blocks = blocks_for(rows, 1, max_blocks);
  launch_overlapped(layer_norm_vec_kernel<T, W, kThreads, kVecs>, blocks, kThreads, 0, ctx.stream,
                    x, out, rows, cols, eps, static_cast<const W*>(affine.weight),
                    static_cast<const W*>(affine.bias), rms);
}

// Picks the width class of the vectorised kernel; false when the row is wider than the widest.
template <typename T, typename W>
bool launch_vec_class(const T* x, T* out, int64_t rows, int64_t cols, float eps,
                      const Affine& affine, bool rms, const RunContext& ctx) {
  const int64_t vecs = cols / (16 / static_cast<int64_t>(sizeof(T)));
  if (vecs <= 128) {
    launch_vec<T, W, 128, 1>(x, out, rows, cols, eps, affine, rms, ctx);
  } else if (vecs <= 256) {
    launch_vec<T, W, 128, 2>(x, out, rows, cols, eps, affine, rms, ctx);
  } else if (vecs <= 512) {
    launch_vec<T, W, 256, 2>(x, out, rows, cols, eps, affine, rms, ctx);
  } else if (vecs <= 2048) {
    launch_vec<T, W, 1024, 2>(x, out, rows, cols, eps, affine, rms, ctx);
  } else {
    return false;
  }
  return true;
}

// The register-cached kernel for one width class: rows of up to kThreads * 8 columns.
template <typename T, int kThreads>
void launch_cached(const T* x, T* out, int64_t rows, int64_t cols, float eps,
                   const Affine& affine, bool rms, const RunContext& ctx) {
  // max_blocks is sized for kBlock threads a block; wider blocks get proportionally fewer (at
  // least one: kBlock / kThreads is 0 for the 512- and 1024-thread classes).
  const int max_blocks = std::max(1, static_cast<int>(int64_t{ctx.max_blocks} * kBlock / kThreads));
  const unsigned blocks = blocks_for(rows, 1, max_blocks);
  layer_norm_cached_kernel<T, kThreads, 8>
      <<<blocks, kThreads, 0, ctx.stream>>>(x, out, rows, cols, eps, affine, rms);
}

// The dtype the vectorised kernel reads the weight and bias in: the one they share, when it is
// the row's or fp32 (the row's when there are neither); none otherwise.
std::optional<DType> vec_affine_dtype(const LayerNormArgs& a, DType row, DType weight,
                                      DType bias) {
  if (a.weight == kNoTensor && a.bias == kNoTensor) return row;
  if (a.weight != kNoTensor && a.bias != kNoTensor && weight != bias) return std::nullopt;
  const DType shared = a.weight != kNoTensor ? weight : bias;
  if (shared != row && shared != DType::kFloat32) return std::nullopt;
  return shared;
}

class LayerNormStep final : public Step {
 public:
  LayerNormStep(const LayerNormArgs& args, const Graph& graph)
      : a_(args),
        dtype_(graph.tensors[args.x].dtype),
        weight_dtype_(args.weight == kNoTensor ? DType::kFloat32
                                               : graph.tensors[args.weight].dtype),
        bias_dtype_(args.bias == kNoTensor ? DType::kFloat32 : graph.tensors[args.bias].dtype),
        vec_affine_(vec_affine_dtype(args, dtype_, weight_dtype_, bias_dtype_)) {}

  Error enqueue(const RunContext& ctx) override {
    if (a_.rows == 0 || a_.cols == 0) {
      return Error::Ok;
    }
    const Affine affine{a_.weight == kNoTensor ? nullptr : ctx.ptr(a_.weight),
                        a_.bias == kNoTensor ? nullptr : ctx.ptr(a_.bias), weight_dtype_,
                        bias_dtype_};
    const float eps = static_cast<float>(a_.eps);
    visit_floating(dtype_, [&](auto tag) {
      using T = typename decltype(tag)::type;
      const T* x = ctx.ptr<const T>(a_.x);
      T* out = ctx.ptr<T>(a_.out);
      // Rows over 256 columns that the vectorised kernel takes run on it (its widest class is
      // 2048 vectors). Otherwise by width: a warp per row up to 256 columns, then
      // register-cached blocks of 128, 256 or 1024 threads (8 columns a thread), then the block
      // loop.
      if (a_.cols > 256 && vectorizable<T>(x, out, affine)) {
        const bool launched =
            *vec_affine_ == dtype_
                ? launch_vec_class<T, T>(x, out, a_.rows, a_.cols, eps, affine, a_.rms, ctx)
                : launch_vec_class<T, float>(x, out, a_.rows, a_.cols, eps, affine, a_.rms, ctx);
        if (launched) return;
      }
      if (a_.cols <= 256) {
        constexpr int kRowsPerBlock = kBlock / 32;
        const unsigned blocks = blocks_for(a_.rows, kRowsPerBlock, ctx.max_blocks);
        layer_norm_kernel<T, 32>
            <<<blocks, kBlock, 0, ctx.stream>>>(x, out, a_.rows, a_.cols, eps, affine, a_.rms);
      } else if (a_.cols <= 1024) {
        launch_cached<T, 128>(x, out, a_.rows, a_.cols, eps, affine, a_.rms, ctx);
      } else if (a_.cols <= 2048) {
        launch_cached<T, 256>(x, out, a_.rows, a_.cols, eps, affine, a_.rms, ctx);
      } else if (a_.cols <= 8192) {
        launch_cached<T, 1024>(x, out, a_.rows, a_.cols, eps, affine, a_.rms, ctx);
      } else {
        const unsigned blocks = blocks_for(a_.rows, 1, ctx.max_blocks);
        layer_norm_kernel<T, kRowBlock>
            <<<blocks, kRowBlock, 0, ctx.stream>>>(x, out, a_.rows, a_.cols, eps, affine, a_.rms);
      }
    });
    return Error::Ok;
  }

 private:
  // Whether the vectorised kernel takes this call: whole 16-byte vectors per row, aligned
  // operands, and a weight and bias (where present) of one dtype, the row's or fp32.
  template <typename T>
  bool vectorizable(const T* x, const T* out, const Affine& affine) const {
    const int64_t width = 16 / static_cast<int64_t>(sizeof(T));
    const auto aligned = [](const void* p) { return p == nullptr || alignment_of(p) >= 16; };
    return a_.cols % width == 0 && vec_affine_.has_value() && aligned(x) && aligned(out) &&
           aligned(affine.weight) && aligned(affine.bias);
  }

  LayerNormArgs a_;
  DType dtype_, weight_dtype_, bias_dtype_;
  std::optional<DType> vec_affine_;  // vec_affine_dtype's
};

}  // namespace

StepResult make_layer_norm_step(const LayerNormArgs& args, const InitContext& ctx) {
  return std::unique_ptr<Step>(new LayerNormStep(args, ctx.graph));
}

}  // namespace kiln::engine::kernels
