// kReduce: sum, mean, amax, amin, any, argmax and argmin over the middle axis of
// [outer, reduce, inner]. Floating inputs accumulate in double, integer and Bool inputs in int64;
// amax/amin propagate NaN like PyTorch, argmax/argmin take NaN as the extreme and the first index
// on ties; the result is written in the output's dtype (Int64 for argmax/argmin).
#pragma once

#include "runtime/engine/step.h"

namespace kiln::engine::kernels {

StepResult make_reduce_step(const ReduceArgs& args, const InitContext& ctx);

}  // namespace kiln::engine::kernels
