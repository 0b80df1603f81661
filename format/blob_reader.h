// Reads and verifies an engine blob (blob_format.h) on the CPU. No CUDA here, so the verifier can
// be unit-tested and fuzzed on any machine.
#pragma once

#include <executorch/runtime/core/result.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "format/graph.h"

namespace kiln::engine {

/// Weights kept outside a blob: the shared weights section of a variant set (variant_set.h).
/// Borrowed; must outlive the Graph read with it.
struct WeightsView {
  const uint8_t* data = nullptr;
  uint64_t size = 0;
};

/// Validates every field of the blob at [data, data + size) before using it (sizes, offsets,
/// alignment, section overlap, tensor records, the io table, each op's operand count, tensor ids,
/// enum values and the extents its strides address) and decodes it into a Graph.
///
/// Errors: DelegateInvalidCompatibility when the blob has another format version (re-export with
/// the installed Kiln); InvalidProgram for anything else malformed. Each failure logs one sentence
/// naming the offending field and value; when `why` is not null that sentence is also stored
/// there. The returned Graph copies everything except the weights section, which it borrows from
/// `data` (see Graph::weights).
///
/// A blob with blob::kFlagExternalWeights set has no weights of its own: it is read only with
/// `external_weights` (InvalidProgram without), its kWeight extents are checked against
/// external_weights->size, and Graph::weights borrows external_weights->data. Without the flag
/// `external_weights` is ignored.
executorch::runtime::Result<Graph> read_blob(const void* data, size_t size,
                                             std::string* why = nullptr,
                                             const WeightsView* external_weights = nullptr);

}  // namespace kiln::engine
