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

/// Why op `op` cannot be folded into the GEMV of op ctx.op_index, or nullptr when it may: that
/// op is the next one, a kMatmul whose `a` is op's output and nothing else reads it, the GEMV
/// could run the matmul, and op is a kLayerNorm (only with KILN_GEMV_NORM=on) or the gated
/// activation act(a) * b of a SwiGLU / GeGLU block over inputs read in order (KILN_GEMV_GLU=off).
/// Folded, the GEMV stages op's inputs and computes its output itself: a decoder step's RMSNorm
/// and projection, or its gate and down projection, in one kernel. A kQuantMatmul next op takes
/// a gated activation into its decode kernel the same way (quant_matmul.cuh).
const char* folded_gemv_unsupported(size_t op, const InitContext& ctx);

/// The GEMV step of op ctx.op_index with op `op` folded in (folded_gemv_unsupported said it
/// may), and the step of the folded op, which enqueues nothing.
StepResult make_folded_gemv_step(size_t op, const InitContext& ctx);
std::unique_ptr<Step> make_folded_step();

}  // namespace kiln::engine::kernels
