// kiln_runner --device-timing: GPU timing of a device-resident program's executes on a stream the
// runner hands Kiln (<kiln/executorch/stream.h>).
#pragma once

#include <executorch/runtime/executor/method.h>

#include <vector>

#include "runner/options.h"
#include "runner/tensor_io.h"

namespace kiln::runner {

// --device-timing: the program's executes on a stream the runner hands Kiln, so execute only
// enqueues (kiln/executorch/stream.h). Two figures: the GPU span of one execute between CUDA
// events recorded on that stream around it (how torch's CUDA-event timings are taken), and the
// wall time per execute of N executes enqueued back to back then waited for once.
void device_timing(et::Method& method, std::vector<InputTensor>& inputs, const Options& opts);

}  // namespace kiln::runner
