// kGather: a strided read of x with one axis indexed by an Int64 or Int32 tensor read on the
// device (gather, index_select, index with one index tensor). A negative index counts from the
// end; one outside [-dim_size, dim_size) writes zero and records the first such index in the
// run's DeviceErrorFlag; the executor reports it as InvalidArgument after the run.
#pragma once

#include "runtime/engine/step.h"

namespace kiln::engine::kernels {

StepResult make_gather_step(const GatherArgs& args, const InitContext& ctx);

}  // namespace kiln::engine::kernels
