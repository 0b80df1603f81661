// kQuantMatmul: a matmul against a weight-only quantized constant (int8 per channel, int4 per
// group of K). Decode (M <= 16) dequantizes in registers: a warp per output row streams that
// row's packed weight with 16-byte loads against the activation rows held in shared memory (fp32)
// and reduces across its lanes, reading each weight byte once. A prefill (M > 16) dequantizes the
// weight to x's dtype in chunks of output rows and multiplies each on the tensor cores through
// cuBLASLt (KILN_QUANT_DENSE=off keeps every M on the first kernel).
#pragma once

#include "runtime/engine/step.h"

namespace kiln::engine::kernels {

StepResult make_quant_matmul_step(const QuantMatmulArgs& args, const InitContext& ctx);

}  // namespace kiln::engine::kernels
