// kMatmul with a few rows (a decoder's one token at a time) against a linear layer's weight, as a
// GEMV: at M <= 8 the op only streams the weight once, and cuBLASLt's kernels reach about half of
// the H200's bandwidth on 8-32 MB weights. make_matmul_step (matmul.cu) tries it first.
#pragma once

#include "runtime/engine/step.h"

namespace kiln::engine::kernels {

/// Why the GEMV cannot take this op (a phrase for the log), or nullptr when it may. KILN_GEMV=off
/// turns it off.
const char* gemv_unsupported(const MatmulArgs& a, const InitContext& ctx);

StepResult make_gemv_step(const MatmulArgs& a, const InitContext& ctx);

}  // namespace kiln::engine::kernels
