// kiln_llm's one kernel: feeding a device-resident decode step its inputs on the GPU.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace kiln::runner {

/// Enqueues on `stream`: *token_in = next ? *next : token; *position_in = position; and, when
/// history is not null, history[index] = *next. One launch instead of three copies between two
/// decode steps (the greedy token never visits the host).
cudaError_t enqueue_feed(const int64_t* next, int64_t token, int64_t* token_in,
                         int64_t position, int64_t* position_in, int64_t* history, int64_t index,
                         cudaStream_t stream);

}  // namespace kiln::runner
