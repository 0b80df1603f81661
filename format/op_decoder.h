// Decoding and checking one op's operands (the per-opcode layouts in blob_format.h). Part of the
// blob reader: it runs after the tensor records are validated, so it can check every tensor id
// an op names against real tensors.
#pragma once

#include <executorch/runtime/core/result.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "format/graph.h"

namespace kiln::engine {

/// Decodes op `index` from its `count` operands. Checks the operand count (rank-dependent layouts
/// use their rank operand), every tensor id (-1 only where the layout allows it), every enum and
/// flag, dtypes, the element extents strides and offsets reach, output storage (Arena or Output)
/// and that the output shares no memory with an input. `graph.tensors` must already be valid.
/// InvalidProgram with one logged sentence (also stored in `*why` when not null) on failure.
executorch::runtime::Result<Op> decode_op(const Graph& graph, size_t index, blob::Opcode opcode,
                                          const int64_t* operands, uint64_t count,
                                          std::string* why);

}  // namespace kiln::engine
