// kAttention in fp32 over whole sequences (an encoder's, a long prefill's: at least 64 queries
// and keys) as two of cuBLASLt's
// strided-batched GEMMs around a masked softmax: scores = scale * Q K^T into the workspace
// (TF32 when the blob's precision is kTf32), softmax in place, out = P V. Kiln's flash kernel
// (attention.cu) keeps fp32 decode and KV-cache shapes, where it reads only the keys a query can
// see and splits long caches across CTAs.
#pragma once

#include <memory>

#include "runtime/engine/step.h"

namespace kiln::engine::kernels {

/// Why the GEMM path cannot take this op (a phrase for the log), or nullptr when it may.
/// KILN_ATTENTION=kiln turns it off.
const char* gemm_attention_unsupported(const AttentionArgs& a, const Graph& graph);

/// The GEMM path's step. It takes `kiln` (Kiln's kernel for the same op, which runs instead at an
/// execute whose bound buffers are less aligned than the GEMMs were planned for) only when it
/// succeeds; NotSupported when cuBLASLt has no algorithm.
StepResult make_gemm_attention_step(const AttentionArgs& a, const InitContext& ctx,
                                    std::unique_ptr<Step>& kiln);

}  // namespace kiln::engine::kernels
