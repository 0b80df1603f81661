// Reads and verifies a state-key container (state_keys.h) on the CPU. The payload it wraps is
// checked later by read_blob / read_variant_set; this reader checks only the container.
#pragma once

#include <executorch/runtime/core/result.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "format/state_keys.h"

namespace kiln::engine {

struct StateKeyed {
  std::vector<std::string> keys;     // key i names the payload's i-th distinct state
  const uint8_t* payload = nullptr;  // borrowed from the buffer given to read_state_keys
  size_t payload_size = 0;
};

/// Whether the buffer starts with the state-key container's magic.
bool is_state_keyed(const void* data, size_t size);

/// Validates the container at [data, data + size): magic, version, header size, every length and
/// offset, that each key is non-empty, at most kMaxKeyLength bytes and unique. Errors:
/// DelegateInvalidCompatibility for another container version, InvalidProgram for anything else;
/// one logged sentence names the field (also stored in `*why` when not null).
executorch::runtime::Result<StateKeyed> read_state_keys(const void* data, size_t size,
                                                        std::string* why = nullptr);

}  // namespace kiln::engine
