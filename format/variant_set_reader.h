// Reads and verifies a variant set (variant_set.h) on the CPU: the container, and every variant
// blob in it through read_blob. No CUDA here, so it is unit-tested and fuzzed with the blob reader.
#pragma once

#include <executorch/runtime/core/result.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "format/blob_reader.h"
#include "format/variant_set.h"

namespace kiln::engine {

/// One delegate input shape a variant serves.
struct Shape {
  uint32_t rank = 0;
  int64_t sizes[blob::kMaxRank] = {};
};

/// One shape-specialised plan: an engine blob (blob_format.h) and the input shapes it serves.
/// Borrowed from the buffer given to read_variant_set.
struct Variant {
  const uint8_t* blob = nullptr;
  size_t blob_size = 0;
  std::vector<Shape> inputs;   // one per delegate input
  uint64_t arena_size = 0;
};

struct VariantSet {
  std::vector<Variant> variants;
  /// The shared weights section (size 0 when every variant carries its own). Pass it to
  /// read_blob / Engine::create with a variant's blob; borrowed from the container's buffer.
  WeightsView weights;
};

/// Whether the buffer starts with the variant set magic (it is not a plain engine blob then).
bool is_variant_set(const void* data, size_t size);

/// Validates the container at [data, data + size): header, counts, every offset and extent, each
/// InputShape, and then every variant blob with read_blob (with the shared weights when its flag
/// says so); checks that each variant's declared input shapes equal its blob's input tensors, that
/// all variants agree on the number and dtypes of inputs and outputs, and that no two variants
/// serve the same shapes. Errors: DelegateInvalidCompatibility for another container or blob
/// format version, InvalidProgram for anything else; one logged sentence names the field (also
/// stored in `*why` when not null). Nothing is copied: the result borrows `data`.
executorch::runtime::Result<VariantSet> read_variant_set(const void* data, size_t size,
                                                         std::string* why = nullptr);

/// Index of the variant whose input shapes equal `shapes` (one per input), or -1.
int find_variant(const VariantSet& set, const std::vector<Shape>& shapes);

/// The shapes a set serves, for messages: "input 0 [1..16,256]; input 1 [...]" (per dimension the
/// smallest and largest size over the variants; not every combination need be served).
std::string describe_shapes(const VariantSet& set);

}  // namespace kiln::engine
