// The Kiln state-key container, format version 1: the payload of a delegate that owns program
// state (kState tensors, e.g. KV caches). It names each state so that the delegates of one loaded
// program can share it: a `prefill` and a `decode` method exported from one module both declare
// the buffer "k_cache_0", and both engines then read and write one device buffer. This header is
// the single definition of the container; the Python preprocess (python/kiln_executorch/aot/
// backend.py) writes it, python/kiln_testing/blob_reader.py reads it for the reference
// interpreter, and format/state_keys_reader.cpp validates it for the runtime.
//
// Layout (all integers little-endian; every offset is from the start of the container):
//
//   [0, 48)          StateKeysHeader
//   48               uint32 key_length[num_states]
//   then             the keys' bytes, concatenated (UTF-8, no terminators)
//   payload_offset   payload_size bytes: an engine blob (blob_format.h) or a variant set
//                    (variant_set.h), kPayloadAlignment aligned; it ends the container
//
// Key i names the i-th distinct state of the payload: distinct states (tensor records with
// storage kState and distinct offsets) in ascending order of their initial value's offset in the
// weights section, which is the order of their tensor ids (the builder places them so). Every
// variant of a variant set declares the same states in the same order. Keys are unique and
// non-empty. Two delegates of one loaded program that name the same key share that state; their
// declarations (dtype and shape) must agree, which the runtime checks when the second one loads.
#pragma once

#include <cstdint>

namespace kiln::engine::skeys {

inline constexpr char kMagic[8] = {'K', 'I', 'L', 'N', 'S', 'K', 'E', 'Y'};
inline constexpr uint32_t kFormatVersion = 1;

struct StateKeysHeader {
  char magic[8];             // kMagic
  uint32_t format_version;   // kFormatVersion
  uint32_t header_size;      // kHeaderSize
  uint32_t num_states;       // 1..kMaxStates
  uint32_t reserved;         // 0
  uint64_t container_size;   // total bytes, equals the size of the buffer
  uint64_t payload_offset;   // kPayloadAlignment aligned, after the keys
  uint64_t payload_size;     // payload_offset + payload_size == container_size
};

// Limits a reader enforces, and the payload's alignment.
inline constexpr uint32_t kHeaderSize = sizeof(StateKeysHeader);
inline constexpr uint32_t kMaxStates = 1u << 16, kMaxKeyLength = 1u << 12, kPayloadAlignment = 8;
static_assert(kHeaderSize == 48, "StateKeysHeader layout");

}  // namespace kiln::engine::skeys
