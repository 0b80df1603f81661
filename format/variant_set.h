// The Kiln variant set, format version 1: the payload of a delegate whose partition has bounded
// dynamic dimensions. The AOT builder lowers such a partition once per assignment of its symbolic
// sizes and stores the resulting engine blobs (blob_format.h) side by side, each with the
// delegate input shapes it serves. This header is the single definition of the container; the
// C++ builder (builder/) writes it from here, the Python reader's mirror
// (python/kiln_executorch/aot/blob_format.py) repeats it and a test checks it against the
// builder's format description. A partition without dynamic dimensions is a plain engine blob,
// never a variant set.
//
// Layout (all integers little-endian; every offset is from the start of the container):
//
//   [0, 64)            VariantSetHeader
//   variants_offset    VariantRecord[num_variants]                (8-byte aligned)
//   shapes_offset      InputShape[num_variants * num_inputs]      variant v's input i at v * num_inputs + i
//   blobs              each variant's engine blob at its blob_offset (8-byte aligned)
//   weights_offset     weights_size bytes: the shared weights section (64-byte aligned), or none
//
// Shared weights: when every variant's weights section is identical, the builder stores it once
// here. Those variant blobs then have weights_size 0 and bit kFlagExternalWeights set in
// blob::Header::flags, and their kWeight tensors address this section instead of their own.
// A variant without the flag carries its own weights as any engine blob does.
//
// Every variant has the same number of inputs and outputs with the same dtypes; no two variants
// serve the same input shapes.
#pragma once

#include <cstdint>

#include "format/blob_format.h"

namespace kiln::engine::vset {

inline constexpr char kMagic[8] = {'K', 'I', 'L', 'N', 'V', 'S', 'E', 'T'};
inline constexpr uint32_t kFormatVersion = 1;
inline constexpr uint32_t kHeaderSize = 64;
/// Most variants one set may hold: the builder declines partitions that would need more.
inline constexpr uint32_t kMaxVariants = 64;
inline constexpr uint32_t kMaxInputs = 1024;
inline constexpr uint32_t kBlobAlignment = 8;

struct VariantSetHeader {
  char magic[8];             // kMagic
  uint32_t format_version;   // kFormatVersion
  uint32_t header_size;      // kHeaderSize
  uint64_t container_size;   // total bytes, equals the size of the buffer
  uint32_t num_variants;     // 1..kMaxVariants
  uint32_t num_inputs;       // delegate inputs of every variant, <= kMaxInputs
  uint64_t variants_offset;
  uint64_t shapes_offset;
  uint64_t weights_offset;   // shared weights section; 0 together with weights_size 0 when none
  uint64_t weights_size;
};
static_assert(sizeof(VariantSetHeader) == kHeaderSize, "VariantSetHeader layout");

struct VariantRecord {
  uint64_t blob_offset;      // an engine blob, kBlobAlignment aligned
  uint64_t blob_size;        // equals that blob's Header::blob_size
};
static_assert(sizeof(VariantRecord) == 16, "VariantRecord layout");

struct InputShape {
  uint32_t rank;             // <= blob::kMaxRank
  uint32_t reserved;         // 0
  int64_t sizes[blob::kMaxRank];  // first `rank` used, rest 0; equal to the variant's input tensor
};
static_assert(sizeof(InputShape) == 72, "InputShape layout");

}  // namespace kiln::engine::vset
