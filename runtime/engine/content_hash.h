// A fast 128-bit content hash, so the weight cache can recognise identical weight bytes without
// keeping or comparing them. Non-cryptographic: it spreads ordinary data (weights) well and runs
// at memory bandwidth; it is not built to resist someone crafting collisions.
#pragma once

#include <cstddef>
#include <cstdint>

namespace kiln::engine {

struct Hash128 {
  uint64_t lo = 0;
  uint64_t hi = 0;
  bool operator==(const Hash128& o) const { return lo == o.lo && hi == o.hi; }
  bool operator!=(const Hash128& o) const { return !(*this == o); }
};

/// Hash of `nbytes` bytes at `data` (any alignment). The same bytes give the same value on every
/// call and every x86-64 or little-endian machine; the length takes part, so a prefix of a buffer
/// hashes differently from the buffer.
Hash128 content_hash(const void* data, size_t nbytes);

/// content_hash without the AVX2 path, for tests: both must agree on every input.
Hash128 content_hash_portable(const void* data, size_t nbytes);

}  // namespace kiln::engine
