// Device helpers shared by the kernel families: storage <-> fp32 conversion, dynamic-dtype access
// for mixed-dtype ops, strided index decomposition, warp and block reductions, launch sizing.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <type_traits>
#include <utility>

#include "format/blob_format.h"
#include "runtime/engine/strided.h"
#include "runtime/engine/env_switch.h"

namespace kiln::engine::kernels {

/// Threads per block for grid-stride kernels (RunContext::max_blocks is sized for this).
inline constexpr int kBlock = 256;

// --- Programmatic dependent launch (Hopper). A kernel launched with launch_overlapped may be
// scheduled while the kernel before it on the stream (or in the captured graph) is still
// running, so its launch latency hides behind that kernel's tail: at batch 1 a decode step is
// ~200 kernels of a few microseconds each. Such a kernel must call wait_for_previous_kernel()
// before it touches global memory (it returns once the previous kernel has finished and its
// writes are visible), and may call allow_next_kernel() to let the next one be scheduled.
// KILN_PDL=off launches them plainly.

__device__ __forceinline__ void wait_for_previous_kernel() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ void allow_next_kernel() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" :::);
#endif
}

/// Whether launch_overlapped asks for programmatic dependent launch (KILN_PDL unset or not "off";
/// read at every launch, which the engine's graph capture makes once per step).
inline bool overlapped_launches_enabled() { return !env_is("KILN_PDL", "off"); }

/// kernel<<<grid, block, smem, stream>>>(args...), allowed to overlap the previous kernel's tail
/// (see above: `kernel` must start with wait_for_previous_kernel()); cluster_x > 0 launches the
/// blocks in thread block clusters of cluster_x along x.
template <typename... Params, typename... Args>
cudaError_t launch_overlapped_clusters(void (*kernel)(Params...), dim3 grid, dim3 block,
                                       size_t smem, cudaStream_t stream, unsigned cluster_x,
                                       Args&&... args) {
  cudaLaunchAttribute attributes[2] = {};
  attributes[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attributes[0].val.programmaticStreamSerializationAllowed = overlapped_launches_enabled() ? 1 : 0;
  attributes[1].id = cudaLaunchAttributeClusterDimension;
  attributes[1].val.clusterDim.x = cluster_x;
  attributes[1].val.clusterDim.y = 1;
  attributes[1].val.clusterDim.z = 1;
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  config.attrs = attributes;
  config.numAttrs = cluster_x > 0 ? 2 : 1;
  return cudaLaunchKernelEx(&config, kernel, static_cast<Params>(std::forward<Args>(args))...);
}

template <typename... Params, typename... Args>
cudaError_t launch_overlapped(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem,
                              cudaStream_t stream, Args&&... args) {
  return launch_overlapped_clusters(kernel, grid, block, smem, stream, 0u,
                                    std::forward<Args>(args)...);
}

/// Blocks for `n` work items of `per_block` each, capped at `max_blocks` (grid-stride beyond).
inline unsigned blocks_for(int64_t n, int64_t per_block, int max_blocks) {
  const int64_t blocks = (n + per_block - 1) / per_block;
  return static_cast<unsigned>(blocks < 1 ? 1 : (blocks > max_blocks ? max_blocks : blocks));
}

__device__ __forceinline__ int64_t thread_index() {
  return static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}

__device__ __forceinline__ int64_t thread_count() {
  return static_cast<int64_t>(gridDim.x) * blockDim.x;
}

// --- Storage types: float, __half, __nv_bfloat16, int32_t, int64_t, and uint8_t for Bool. ---

template <typename T>
__device__ __forceinline__ float to_float(T v) {
  if constexpr (std::is_same_v<T, __half>) {
    return __half2float(v);
  } else if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    return __bfloat162float(v);
  } else if constexpr (std::is_same_v<T, uint8_t>) {
    return v != 0 ? 1.0f : 0.0f;
  } else {
    return static_cast<float>(v);
  }
}

template <typename T>
__device__ __forceinline__ T from_float(float v) {
  if constexpr (std::is_same_v<T, __half>) {
    return __float2half_rn(v);
  } else if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    return __float2bfloat16_rn(v);
  } else if constexpr (std::is_same_v<T, uint8_t>) {
    return v != 0.0f ? 1 : 0;  // NaN is true, as in PyTorch
  } else {
    return static_cast<T>(v);
  }
}

template <typename T>
__device__ __forceinline__ int64_t to_int(T v) {
  if constexpr (std::is_same_v<T, uint8_t>) {
    return v != 0 ? 1 : 0;
  } else if constexpr (std::is_integral_v<T>) {
    return static_cast<int64_t>(v);
  } else {
    return static_cast<int64_t>(to_float(v));
  }
}

template <typename T>
__device__ __forceinline__ T from_int(int64_t v) {
  if constexpr (std::is_same_v<T, uint8_t>) {
    return v != 0 ? 1 : 0;
  } else if constexpr (std::is_integral_v<T>) {
    return static_cast<T>(v);
  } else {
    return from_float<T>(static_cast<float>(v));
  }
}

// --- Dynamic dtype, for ops whose operands have different dtypes. The switch is uniform across a
// launch, so it costs a few instructions per element and no divergence. ---

__device__ __forceinline__ double load_f64(const void* p, blob::DType dt, int64_t i) {
  switch (dt) {
    case blob::DType::kFloat32: return static_cast<const float*>(p)[i];
    case blob::DType::kFloat16: return __half2float(static_cast<const __half*>(p)[i]);
    case blob::DType::kBFloat16: return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
    case blob::DType::kInt32: return static_cast<const int32_t*>(p)[i];
    case blob::DType::kInt64: return static_cast<double>(static_cast<const int64_t*>(p)[i]);
    case blob::DType::kBool: return static_cast<const uint8_t*>(p)[i] != 0 ? 1.0 : 0.0;
  }
  return 0.0;
}

__device__ __forceinline__ int64_t load_i64(const void* p, blob::DType dt, int64_t i) {
  switch (dt) {
    case blob::DType::kInt32: return static_cast<const int32_t*>(p)[i];
    case blob::DType::kInt64: return static_cast<const int64_t*>(p)[i];
    case blob::DType::kBool: return static_cast<const uint8_t*>(p)[i] != 0 ? 1 : 0;
    default: return static_cast<int64_t>(load_f64(p, dt, i));
  }
}

__device__ __forceinline__ void store_f64(void* p, blob::DType dt, int64_t i, double v) {
  switch (dt) {
    case blob::DType::kFloat32: static_cast<float*>(p)[i] = static_cast<float>(v); return;
    case blob::DType::kFloat16: static_cast<__half*>(p)[i] = __double2half(v); return;
    case blob::DType::kBFloat16: static_cast<__nv_bfloat16*>(p)[i] = __double2bfloat16(v); return;
    case blob::DType::kInt32: static_cast<int32_t*>(p)[i] = static_cast<int32_t>(v); return;
    case blob::DType::kInt64: static_cast<int64_t*>(p)[i] = static_cast<int64_t>(v); return;
    case blob::DType::kBool: static_cast<uint8_t*>(p)[i] = v != 0.0 ? 1 : 0; return;
  }
}

__device__ __forceinline__ void store_i64(void* p, blob::DType dt, int64_t i, int64_t v) {
  switch (dt) {
    case blob::DType::kInt32: static_cast<int32_t*>(p)[i] = static_cast<int32_t>(v); return;
    case blob::DType::kInt64: static_cast<int64_t*>(p)[i] = v; return;
    case blob::DType::kBool: static_cast<uint8_t*>(p)[i] = v != 0 ? 1 : 0; return;
    default: store_f64(p, dt, i, static_cast<double>(v)); return;
  }
}

/// Calls `f(TypeTag<T>{})` with the storage type of `dtype` (uint8_t for Bool).
template <typename T>
struct TypeTag {
  using type = T;
};

template <typename F>
void visit_dtype(blob::DType dtype, F&& f) {
  switch (dtype) {
    case blob::DType::kFloat32: return f(TypeTag<float>{});
    case blob::DType::kFloat16: return f(TypeTag<__half>{});
    case blob::DType::kBFloat16: return f(TypeTag<__nv_bfloat16>{});
    case blob::DType::kInt32: return f(TypeTag<int32_t>{});
    case blob::DType::kInt64: return f(TypeTag<int64_t>{});
    case blob::DType::kBool: return f(TypeTag<uint8_t>{});
  }
}

/// Same for the floating dtypes only (the reader guarantees which ops see which).
template <typename F>
void visit_floating(blob::DType dtype, F&& f) {
  switch (dtype) {
    case blob::DType::kFloat16: return f(TypeTag<__half>{});
    case blob::DType::kBFloat16: return f(TypeTag<__nv_bfloat16>{});
    default: return f(TypeTag<float>{});
  }
}

/// `kWidth` consecutive elements moved as one aligned access (16 bytes for the vector paths).
template <typename T, int kWidth>
struct alignas(sizeof(T) * kWidth) Pack {
  T v[kWidth];
};

/// Element offsets of linear index `i` (row-major over loop.sizes) in each operand. `Index` is
/// uint32_t when the loop has fewer than 2^31 elements: 32-bit division is several times cheaper.
template <int K, typename Index>
__device__ __forceinline__ void strided_offsets(const StridedLoop<K>& loop, Index i,
                                                int64_t (&offsets)[K]) {
#pragma unroll
  for (int k = 0; k < K; ++k) {
    offsets[k] = 0;
  }
#pragma unroll
  for (int d = static_cast<int>(blob::kMaxRank) - 1; d >= 0; --d) {
    if (d < loop.rank) {
      const Index size = static_cast<Index>(loop.sizes[d]);
      const Index q = i / size;
      const Index r = i - q * size;
#pragma unroll
      for (int k = 0; k < K; ++k) {
        offsets[k] += static_cast<int64_t>(r) * loop.strides[k][d];
      }
      i = q;
    }
  }
}

// --- Reductions. Op is a functor with `T operator()(T, T) const`. ---

template <typename T, typename Op>
__device__ __forceinline__ T warp_reduce(T v, Op op) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) {
    v = op(v, __shfl_xor_sync(0xffffffffu, v, offset));
  }
  return v;
}

/// The rows a group of kGroup threads (a warp, or the whole block) takes: rows first, first +
/// stride, ... of a grid-stride loop, this thread being lane `lane` of its group.
struct RowGroup {
  int lane;
  int64_t first, stride;
};

template <int kGroup>
__device__ __forceinline__ RowGroup row_group() {
  const int64_t groups_per_block = blockDim.x / kGroup;
  return {static_cast<int>(threadIdx.x % kGroup),
          blockIdx.x * groups_per_block + threadIdx.x / kGroup,
          static_cast<int64_t>(gridDim.x) * groups_per_block};
}

/// Reduces over a group of kGroup threads that work on one row: a warp (kGroup == 32) or the whole
/// block (kGroup == blockDim.x, a multiple of 32). Every thread of the group gets the result.
/// `scratch` is shared memory for kGroup / 32 values.
template <int kGroup, typename T, typename Op>
__device__ __forceinline__ T group_reduce(T v, Op op, T* scratch) {
  v = warp_reduce(v, op);
  if constexpr (kGroup > 32) {
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    __syncthreads();  // earlier readers of scratch are done
    if (lane == 0) {
      scratch[warp] = v;
    }
    __syncthreads();
    v = scratch[0];
#pragma unroll
    for (int w = 1; w < kGroup / 32; ++w) {
      v = op(v, scratch[w]);
    }
  }
  return v;
}

struct SumOp {
  template <typename T>
  __device__ __forceinline__ T operator()(T a, T b) const {
    return a + b;
  }
};

struct MaxOp {
  __device__ __forceinline__ float operator()(float a, float b) const { return fmaxf(a, b); }
};

/// GELU with the exact erf form, and PyTorch's tanh approximation.
__device__ __forceinline__ float gelu_erf(float x) {
  return 0.5f * x * (1.0f + erff(x * 0.70710678118654752f));
}

__device__ __forceinline__ float gelu_tanh(float x) {
  const float inner = 0.79788456080286536f * (x + 0.044715f * x * x * x);
  return 0.5f * x * (1.0f + tanhf(inner));
}

/// An op's epilogue activation (kMatmul's post pass, kConv2d's epilogue) on its fp32 result, with
/// the arithmetic of the kUnary kinds it replaces (relu and relu6 keep NaN).
__device__ __forceinline__ float apply_epilogue(float v, blob::Epilogue act) {
  switch (act) {
    case blob::Epilogue::kRelu: return v != v ? v : fmaxf(v, 0.0f);
    case blob::Epilogue::kGeluErf: return gelu_erf(v);
    case blob::Epilogue::kGeluTanh: return gelu_tanh(v);
    case blob::Epilogue::kRelu6: return v != v ? v : fminf(fmaxf(v, 0.0f), 6.0f);
    case blob::Epilogue::kSilu: return v / (1.0f + expf(-v));
    case blob::Epilogue::kHardswish: return v * fminf(fmaxf(v + 3.0f, 0.0f), 6.0f) / 6.0f;
    case blob::Epilogue::kSigmoid: return 1.0f / (1.0f + expf(-v));
    case blob::Epilogue::kNone: break;
  }
  return v;
}

/// Row-wise kernels use a warp per row for short rows and a block per row for long ones.
inline constexpr int64_t kWarpRowLimit = 1024;
inline constexpr int kRowBlock = 512;

}  // namespace kiln::engine::kernels
