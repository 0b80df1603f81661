// kEmbedding: out[i, :] = weight[indices[i], :] for Int64 or Int32 indices and any weight dtype.
// An index outside [0, vocab) writes a zero row and records the first such index in the run's
// DeviceErrorFlag; the executor reports it as InvalidArgument after the run.
// kEmbeddingBag: sum / mean / max of the rows of each bag of indices (op_table.def); a bad index
// or bag is reported the same way.
#pragma once

#include "runtime/engine/step.h"

namespace kiln::engine::kernels {

StepResult make_embedding_step(const EmbeddingArgs& args, const InitContext& ctx);
StepResult make_embedding_bag_step(const EmbeddingBagArgs& args, const InitContext& ctx);

}  // namespace kiln::engine::kernels
