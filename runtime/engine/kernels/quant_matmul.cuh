// kQuantMatmul: a matmul against a weight-only quantized constant (int8 per channel, int4 per
// group of K), dequantized in registers. One kernel for every M: a warp per output row streams
// that row's packed weight with 16-byte loads against up to 16 activation rows held in shared
// memory (fp32) and reduces across its lanes. Decode (M <= 16) reads each weight byte once; a
// larger M runs the same kernel over chunks of 16 rows (see quant_matmul.cu for what that costs).
#pragma once

#include "runtime/engine/step.h"

namespace kiln::engine::kernels {

StepResult make_quant_matmul_step(const QuantMatmulArgs& args, const InitContext& ctx);

}  // namespace kiln::engine::kernels
