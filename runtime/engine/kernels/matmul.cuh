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

StepResult make_matmul_step(const MatmulArgs& args, const InitContext& ctx);

}  // namespace kiln::engine::kernels
