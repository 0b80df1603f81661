// A kAttention mask made ready for cuDNN's fused attention, which takes an additive bias tensor
// but not a Bool mask, and gives NaN (not torch's 0) for a query whose every key is masked out.
// Before the cuDNN graph, mask_to_bias writes the mask as a dense additive bias in the query's
// dtype (a Bool false becomes -inf) and flags every dead row; after it, zero_dead_rows writes 0
// over the output rows so flagged.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "format/dtype.h"

namespace kiln::engine::kernels {

/// The mask as the bias reads it: [rows_b, rows_h, seq_q, seq_kv] with the op's mask strides
/// (rows_b / rows_h are 1 where the mask broadcasts over batch / heads).
struct MaskToBias {
  const void* mask;
  bool is_bool;                 // else additive, in `dtype`
  blob::DType dtype;            // the query's (and the bias's) dtype: Float16 or BFloat16
  int64_t rows_b, rows_h, seq_q, seq_kv;
  int64_t stride_b, stride_h, stride_q, stride_k;
  int64_t bias_ld;              // the bias's row pitch in elements (seq_kv rounded up to 8)
  bool causal;                  // keys j > i count as masked when deciding a row is dead
  void* bias;                   // rows_b * rows_h * seq_q * bias_ld elements
  uint8_t* dead;                // rows_b * rows_h * seq_q flags
};

cudaError_t launch_mask_to_bias(const MaskToBias& p, cudaStream_t stream);

/// Zeroes out[b, h, i, :] (head_dim_v columns at the out strides) where the mask row of (b, h, i)
/// is flagged dead.
struct ZeroDeadRows {
  const uint8_t* dead;
  blob::DType dtype;
  int64_t batch, heads, seq_q, head_dim_v;
  int64_t rows_b, rows_h;
  int64_t out_stride_b, out_stride_h, out_stride_s;
  void* out;
};

cudaError_t launch_zero_dead_rows(const ZeroDeadRows& p, cudaStream_t stream);

}  // namespace kiln::engine::kernels
