// kScatter: a strided write into out at positions read from up to kMaxScatterIndices Int64 /
// Int32 index tensors on the device (index_put, accumulate too: atomic adds). A negative index
// counts from the end; one out of range skips its element and records the first such index in
// the run's DeviceErrorFlag; the executor reports it as InvalidArgument after the run. Of
// duplicate replacing writes the one latest in iteration order wins (a workspace slot per
// element of out elects it).
#pragma once

#include "runtime/engine/step.h"

namespace kiln::engine::kernels {

StepResult make_scatter_step(const ScatterArgs& args, const InitContext& ctx);

}  // namespace kiln::engine::kernels
