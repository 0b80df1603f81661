// Kiln IR -> engine blob bytes (format/blob_format.h) and blobs -> variant set
// (format/variant_set.h).
#pragma once

#include <cstdint>
#include <vector>

#include "builder/src/ir.h"

namespace kiln::builder {

/// Lays the sections out in the header's order, each 8-byte aligned, the weights section and every
/// weight in it 64-byte aligned. Views get their own records at their root's storage and offset.
/// Identical weights (same dtype and bytes) are stored once; each state's initial value on its own.
std::vector<uint8_t> write_blob(const Graph& g);

struct VariantBlob {
  std::vector<uint8_t> blob;
  std::vector<std::vector<int64_t>> input_shapes;   // one per delegate input
};

/// When every blob has the same non-empty weights section it is stored once and the blobs refer
/// to it (blob::kFlagExternalWeights); otherwise each keeps its own.
std::vector<uint8_t> write_variant_set(const std::vector<VariantBlob>& variants);

}  // namespace kiln::builder
