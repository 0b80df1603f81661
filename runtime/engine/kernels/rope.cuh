// kRope: rotary position embedding in its rotate-half form, one pass that reads x in place
// (through the view the model wrote, e.g. before its head transpose) and writes the rotated heads
// contiguous. Each thread rotates one pair (d, d + head_dim / 2) of one row.
#pragma once

#include "runtime/engine/step.h"

namespace kiln::engine::kernels {

StepResult make_rope_step(const RopeArgs& args, const InitContext& ctx);

}  // namespace kiln::engine::kernels
