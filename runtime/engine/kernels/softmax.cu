#include "runtime/engine/kernels/softmax.cuh"

#include "runtime/engine/kernels/common.cuh"

namespace kiln::engine::kernels {
namespace {

using executorch::runtime::Error;

// Running (max, sum of exp(x - max)). -inf entries contribute nothing, so a group that saw only
// -inf (or nothing) merges cleanly; a NaN input makes the sum NaN, as in PyTorch.
struct MaxSum {
  float max;
  float sum;
};

__device__ __forceinline__ MaxSum merge(MaxSum a, MaxSum b) {
  const float m = fmaxf(a.max, b.max);
  const float sa = a.max == -INFINITY ? 0.0f : a.sum * expf(a.max - m);
  const float sb = b.max == -INFINITY ? 0.0f : b.sum * expf(b.max - m);
  return {m, sa + sb};
}

__device__ __forceinline__ void accumulate(MaxSum& acc, float v) {
  if (v > acc.max) {
    acc.sum = (acc.max == -INFINITY ? 0.0f : acc.sum * expf(acc.max - v)) + 1.0f;
    acc.max = v;
  } else if (v != -INFINITY) {
    acc.sum += expf(v - acc.max);  // NaN v lands here and poisons the sum
  }
}

__device__ __forceinline__ MaxSum shfl_xor(MaxSum v, int offset) {
  return {__shfl_xor_sync(0xffffffffu, v.max, offset), __shfl_xor_sync(0xffffffffu, v.sum, offset)};
}

template <int kGroup>
__device__ __forceinline__ MaxSum group_merge(MaxSum v, MaxSum* scratch) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) {
    v = merge(v, shfl_xor(v, offset));
  }
  if constexpr (kGroup > 32) {
    __syncthreads();
    if ((threadIdx.x & 31) == 0) {
      scratch[threadIdx.x >> 5] = v;
    }
    __syncthreads();
    v = scratch[0];
#pragma unroll
    for (int w = 1; w < kGroup / 32; ++w) {
      v = merge(v, scratch[w]);
    }
  }
  return v;
}

__device__ __forceinline__ float finish(float v, MaxSum s, bool is_log) {
  return is_log ? v - s.max - logf(s.sum) : expf(v - s.max) / s.sum;
}

// inner == 1: each row of `cols` contiguous elements is handled by a group of kGroup threads
// (a warp for short rows, the whole block for long ones).
template <typename T, int kGroup>
__global__ void softmax_rows_kernel(const T* __restrict__ x, T* __restrict__ out, int64_t rows,
                                    int64_t cols, bool is_log) {
  __shared__ MaxSum scratch[32];
  const int lane = threadIdx.x % kGroup;
  const int64_t groups_per_block = blockDim.x / kGroup;
  const int64_t first = blockIdx.x * groups_per_block + threadIdx.x / kGroup;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * groups_per_block;
  for (int64_t row = first; row < rows; row += stride) {
    const T* xr = x + row * cols;
    T* outr = out + row * cols;
    MaxSum acc{-INFINITY, 0.0f};
    for (int64_t c = lane; c < cols; c += kGroup) {
      accumulate(acc, to_float(xr[c]));
    }
    const MaxSum total = group_merge<kGroup>(acc, scratch);
    for (int64_t c = lane; c < cols; c += kGroup) {
      outr[c] = from_float<T>(finish(to_float(xr[c]), total, is_log));
    }
  }
}

// inner > 1: one thread per (outer, inner) column walks `dim` with stride `inner`; neighbouring
// threads read neighbouring addresses.
template <typename T>
__global__ void softmax_columns_kernel(const T* __restrict__ x, T* __restrict__ out, int64_t outer,
                                       int64_t dim, int64_t inner, bool is_log) {
  const int64_t columns = outer * inner;
  for (int64_t col = thread_index(); col < columns; col += thread_count()) {
    const int64_t o = col / inner;
    const int64_t base = o * dim * inner + (col - o * inner);
    MaxSum acc{-INFINITY, 0.0f};
    for (int64_t d = 0; d < dim; ++d) {
      accumulate(acc, to_float(x[base + d * inner]));
    }
    for (int64_t d = 0; d < dim; ++d) {
      const int64_t i = base + d * inner;
      out[i] = from_float<T>(finish(to_float(x[i]), acc, is_log));
    }
  }
}

class SoftmaxStep final : public Step {
 public:
  SoftmaxStep(const SoftmaxArgs& args, const Graph& graph)
      : a_(args), dtype_(graph.tensors[args.x].dtype) {}

  Error enqueue(const RunContext& ctx) override {
    if (a_.outer == 0 || a_.dim == 0 || a_.inner == 0) {
      return Error::Ok;
    }
    const void* x = ctx.ptr(a_.x);
    void* out = ctx.ptr(a_.out);
    visit_floating(dtype_, [&](auto tag) {
      using T = typename decltype(tag)::type;
      const T* xt = static_cast<const T*>(x);
      T* ot = static_cast<T*>(out);
      if (a_.inner > 1) {
        const unsigned blocks = blocks_for(a_.outer * a_.inner, kBlock, ctx.max_blocks);
        softmax_columns_kernel<T>
            <<<blocks, kBlock, 0, ctx.stream>>>(xt, ot, a_.outer, a_.dim, a_.inner, a_.is_log);
      } else if (a_.dim <= kWarpRowLimit) {
        constexpr int kRowsPerBlock = kBlock / 32;
        const unsigned blocks = blocks_for(a_.outer, kRowsPerBlock, ctx.max_blocks);
        softmax_rows_kernel<T, 32>
            <<<blocks, kBlock, 0, ctx.stream>>>(xt, ot, a_.outer, a_.dim, a_.is_log);
      } else {
        const unsigned blocks = blocks_for(a_.outer, 1, ctx.max_blocks);
        softmax_rows_kernel<T, kRowBlock>
            <<<blocks, kRowBlock, 0, ctx.stream>>>(xt, ot, a_.outer, a_.dim, a_.is_log);
      }
    });
    return Error::Ok;
  }

 private:
  SoftmaxArgs a_;
  blob::DType dtype_;
};

}  // namespace

StepResult make_softmax_step(const SoftmaxArgs& args, const InitContext& ctx) {
  return std::unique_ptr<Step>(new SoftmaxStep(args, ctx.graph));
}

}  // namespace kiln::engine::kernels
