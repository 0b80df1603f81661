// kSoftmax: softmax or log_softmax over the middle axis of [outer, dim, inner], fp32 math.
#pragma once

#include "runtime/engine/step.h"

namespace kiln::engine::kernels {

StepResult make_softmax_step(const SoftmaxArgs& args, const InitContext& ctx);

}  // namespace kiln::engine::kernels
