// Kernels of attention_mask.cuh.
#include "runtime/engine/kernels/attention_mask.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include "runtime/engine/kernels/common.cuh"

namespace kiln::engine::kernels {
namespace {

constexpr int kMaskThreads = 256;

// One block per mask row (b, h, i): the row's bias, then whether any key is left.
template <typename T>
__global__ void mask_to_bias_kernel(MaskToBias p) {
  const int64_t row = blockIdx.x;
  const int64_t i = row % p.seq_q;
  const int64_t h = (row / p.seq_q) % p.rows_h;
  const int64_t b = row / (p.seq_q * p.rows_h);
  const int64_t base = b * p.stride_b + h * p.stride_h + i * p.stride_q;
  T* out = static_cast<T*>(p.bias) + row * p.bias_ld;
  const int64_t last = p.causal ? i : p.seq_kv - 1;  // the last key the causal bound leaves
  bool alive = false;
  for (int64_t j = threadIdx.x; j < p.seq_kv; j += blockDim.x) {
    float v;
    if (p.is_bool) {
      v = static_cast<const uint8_t*>(p.mask)[base + j * p.stride_k] != 0 ? 0.0f : -INFINITY;
    } else {
      v = to_float(static_cast<const T*>(p.mask)[base + j * p.stride_k]);
    }
    out[j] = from_float<T>(v);
    alive = alive || (j <= last && v != -INFINITY);
  }
  alive = __syncthreads_or(alive);
  if (threadIdx.x == 0) p.dead[row] = alive ? 0 : 1;
}

// One block per output row; the threads write its columns only when the row is dead.
template <typename T>
__global__ void zero_dead_rows_kernel(ZeroDeadRows p) {
  const int64_t row = blockIdx.x;
  const int64_t i = row % p.seq_q;
  const int64_t h = (row / p.seq_q) % p.heads;
  const int64_t b = row / (p.seq_q * p.heads);
  const int64_t mb = p.rows_b == 1 ? 0 : b;
  const int64_t mh = p.rows_h == 1 ? 0 : h;
  if (p.dead[(mb * p.rows_h + mh) * p.seq_q + i] == 0) return;
  T* out = static_cast<T*>(p.out) + b * p.out_stride_b + h * p.out_stride_h + i * p.out_stride_s;
  for (int64_t e = threadIdx.x; e < p.head_dim_v; e += blockDim.x) out[e] = from_float<T>(0.0f);
}

}  // namespace

cudaError_t launch_mask_to_bias(const MaskToBias& p, cudaStream_t stream) {
  const int64_t rows = p.rows_b * p.rows_h * p.seq_q;
  if (rows == 0) return cudaSuccess;
  if (p.dtype == blob::DType::kBFloat16) {
    mask_to_bias_kernel<__nv_bfloat16><<<static_cast<unsigned>(rows), kMaskThreads, 0, stream>>>(p);
  } else {
    mask_to_bias_kernel<__half><<<static_cast<unsigned>(rows), kMaskThreads, 0, stream>>>(p);
  }
  return cudaGetLastError();
}

cudaError_t launch_zero_dead_rows(const ZeroDeadRows& p, cudaStream_t stream) {
  const int64_t rows = p.batch * p.heads * p.seq_q;
  if (rows == 0) return cudaSuccess;
  if (p.dtype == blob::DType::kBFloat16) {
    zero_dead_rows_kernel<__nv_bfloat16><<<static_cast<unsigned>(rows), 64, 0, stream>>>(p);
  } else {
    zero_dead_rows_kernel<__half><<<static_cast<unsigned>(rows), 64, 0, stream>>>(p);
  }
  return cudaGetLastError();
}

}  // namespace kiln::engine::kernels
