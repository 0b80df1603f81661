// kFill: out[:] = value, converted to out's dtype (any dtype).
#pragma once

#include "runtime/engine/step.h"

namespace kiln::engine::kernels {

StepResult make_fill_step(const FillArgs& args, const InitContext& ctx);

}  // namespace kiln::engine::kernels
