// kReduce: sum, mean, amax, amin and any over the middle axis of [outer, reduce, inner].
// Floating inputs accumulate in double, integer and Bool inputs in int64; amax/amin propagate
// NaN like PyTorch; the result is written in the output's dtype.
#pragma once

#include "runtime/engine/step.h"

namespace kiln::engine::kernels {

StepResult make_reduce_step(const ReduceArgs& args, const InitContext& ctx);

}  // namespace kiln::engine::kernels
