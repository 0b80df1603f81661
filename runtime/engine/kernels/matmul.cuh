// kMatmul through cuBLASLt: batched, strided (batch stride 0 broadcasts), either operand
// transposed, fp32 (TF32 only when the blob's precision is kTf32) or fp16/bf16 with fp32
// accumulation. A per-column bias with beta 1 and the relu / tanh-GELU epilogues run inside
// cuBLASLt; any other bias layout, beta, or the erf GELU run as one elementwise pass after it.
#pragma once

#include "runtime/engine/device.h"
#include "runtime/engine/step.h"

namespace kiln::engine::kernels {

using UniqueCublasLt = UniqueHandle<cublasLtHandle_t, cublasLtDestroy>;
using MatmulDesc = UniqueHandle<cublasLtMatmulDesc_t, cublasLtMatmulDescDestroy>;
using Layout = UniqueHandle<cublasLtMatrixLayout_t, cublasLtMatrixLayoutDestroy>;
using Preference = UniqueHandle<cublasLtMatmulPreference_t, cublasLtMatmulPreferenceDestroy>;

/// Workspace every matmul step is given (the size cuBLAS recommends for Hopper).
inline constexpr size_t kMatmulWorkspaceBytes = size_t{32} << 20;

/// cuBLASLt's name for a floating storage dtype (fp32 for anything else).
inline cudaDataType_t cublas_type(blob::DType dtype) {
  switch (dtype) {
    case blob::DType::kFloat16: return CUDA_R_16F;
    case blob::DType::kBFloat16: return CUDA_R_16BF;
    default: return CUDA_R_32F;
  }
}

executorch::runtime::Result<UniqueCublasLt> create_cublas_lt();

/// Sets a cuBLASLt preference's workspace limit and the byte alignments of cuBLASLt's A, B, C and
/// D (in that order); CUBLAS_STATUS_SUCCESS or the first failing call's status.
cublasStatus_t set_preference(cublasLtMatmulPreference_t preference, uint64_t workspace_bytes,
                              const uint32_t (&alignment)[4]);

/// Whether cuBLASLt's epilogue can add the op's bias itself: one value per output column, beta 1,
/// in out's dtype (otherwise the pass after the call adds it).
bool lt_per_column_bias(const MatmulArgs& a, blob::DType bias_dtype, blob::DType out_dtype);

/// The cuBLASLt epilogue for an optional per-column bias followed by `act`; `rest` becomes the
/// activation still to apply after the cuBLASLt call (kNone when cuBLASLt fused `act`: relu and
/// its GELU, which is the tanh approximation).
cublasLtEpilogue_t lt_epilogue(bool bias, blob::Epilogue act, blob::Epilogue& rest);

/// out = act(out + beta * bias[row * row_stride + col * col_stride]) over `total` elements of
/// [*, M, N] `dtype` on ctx.stream, bias (of bias_dtype) may be null: what follows a cuBLASLt
/// call whose epilogue has no form of it.
void enqueue_epilogue_pass(const RunContext& ctx, blob::DType dtype, void* out, int64_t total,
                           int64_t m, int64_t n, const void* bias, blob::DType bias_dtype,
                           int64_t row_stride, int64_t col_stride, float beta, blob::Epilogue act);

StepResult make_matmul_step(const MatmulArgs& args, const InitContext& ctx);

}  // namespace kiln::engine::kernels
