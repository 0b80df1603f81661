// kQuantMatmul: a matmul against a weight-only quantized constant (int8 per channel, int4 per
// group of K). Decode (M <= 16) dequantizes in registers: a warp per output row streams that
// row's packed weight with 16-byte loads against the activation rows held in shared memory (fp32)
// and reduces across its lanes, reading each weight byte once. A prefill (M > 16) dequantizes the
// weight to x's dtype in chunks of output rows and multiplies each on the tensor cores through
// cuBLASLt (KILN_QUANT_DENSE=off keeps every M on the first kernel). The decode kernel is
// launched overlapped (PDL) and may fold in the gated activation before it (gemv.cuh).
#pragma once

#include "runtime/engine/step.h"

namespace kiln::engine::kernels {

/// A gated activation act(a) * b (a SwiGLU / GeGLU gate) that the decode kernel computes as it
/// stages its activations, in place of reading the op's x (gemv.cuh's fold decides).
struct QuantGate {
  int64_t a = kNoTensor, b = kNoTensor;
  blob::UnaryKind act = blob::UnaryKind::kSilu;
};

/// Why the decode kernel cannot take the op (so nothing can fold into it); nullptr when it can.
const char* quant_gemv_unsupported(const QuantMatmulArgs& args);

/// The step (the step registry's), and the step with `gate` folded in (its op's step enqueues
/// nothing).
StepResult make_quant_matmul_step(const QuantMatmulArgs& args, const InitContext& ctx);
StepResult make_quant_matmul_step(const QuantMatmulArgs& args, const InitContext& ctx,
                                  const QuantGate& gate);

}  // namespace kiln::engine::kernels
