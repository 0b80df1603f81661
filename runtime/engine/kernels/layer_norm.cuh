// kLayerNorm: normalises rows of `cols` elements (mean and variance in fp32, two passes for
// accuracy), then scales by the optional per-column weight and shifts by the optional bias.
#pragma once

#include "runtime/engine/step.h"

namespace kiln::engine::kernels {

StepResult make_layer_norm_step(const LayerNormArgs& args, const InitContext& ctx);

}  // namespace kiln::engine::kernels
