// kIndexPut: out[o, positions[i], :] = values[o, i, :] into a kState tensor, in place. Positions
// are read on the device. A first kernel checks every position and records the first one outside
// [0, dim_size) in the run's DeviceErrorFlag; the write kernel then writes nothing when the flag
// holds any error of this run, so a bad position leaves the state as it was, and the executor
// reports it as InvalidArgument after the run.
#pragma once

#include "runtime/engine/step.h"

namespace kiln::engine::kernels {

StepResult make_index_put_step(const IndexPutArgs& args, const InitContext& ctx);

}  // namespace kiln::engine::kernels
