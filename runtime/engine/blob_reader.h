// Reads and verifies an engine blob (blob_format.h) on the CPU. No CUDA here, so the verifier can
// be unit-tested and fuzzed on any machine.
#pragma once

#include <executorch/runtime/core/result.h>

#include <cstddef>
#include <string>

#include "runtime/engine/graph.h"

namespace kiln::engine {

/// Validates every field of the blob at [data, data + size) before using it (sizes, offsets,
/// alignment, section overlap, tensor records, the io table, each op's operand count, tensor ids,
/// enum values and the extents its strides address) and decodes it into a Graph.
///
/// Errors: DelegateInvalidCompatibility when the blob has another format version (re-export with
/// the installed Kiln); InvalidProgram for anything else malformed. Each failure logs one sentence
/// naming the offending field and value; when `why` is not null that sentence is also stored
/// there. The returned Graph copies everything except the weights section, which it borrows from
/// `data` (see Graph::weights).
executorch::runtime::Result<Graph> read_blob(const void* data, size_t size,
                                             std::string* why = nullptr);

}  // namespace kiln::engine
