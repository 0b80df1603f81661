// kEmbedding: out[i, :] = weight[indices[i], :] for Int64 or Int32 indices and any weight dtype.
// An index outside [0, vocab) writes a zero row and records the first such index in the run's
// DeviceErrorFlag; the executor reports it as InvalidArgument after the run.
#pragma once

#include "runtime/engine/step.h"

namespace kiln::engine::kernels {

StepResult make_embedding_step(const EmbeddingArgs& args, const InitContext& ctx);

}  // namespace kiln::engine::kernels
