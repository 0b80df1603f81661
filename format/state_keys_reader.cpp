#include "format/state_keys_reader.h"

#include <cstring>
#include <set>
#include <utility>

#include "format/fail.h"

namespace kiln::engine {

using executorch::runtime::Error;
using executorch::runtime::Result;
using ull = unsigned long long;

bool is_state_keyed(const void* data, size_t size) {
  return data != nullptr && size >= sizeof(skeys::kMagic) &&
         std::memcmp(data, skeys::kMagic, sizeof(skeys::kMagic)) == 0;
}

Result<StateKeyed> read_state_keys(const void* data, size_t size, std::string* why) {
  const auto* bytes = static_cast<const uint8_t*>(data);
  if (!is_state_keyed(data, size)) {
    return fail(why, Error::InvalidProgram,
                "not a Kiln state-key container: the %zu-byte buffer does not start with "
                "'KILNSKEY'", data == nullptr ? size_t{0} : size);
  }
  if (size < sizeof(skeys::StateKeysHeader)) {
    return fail(why, Error::InvalidProgram,
                "Kiln state keys: truncated: %zu bytes is smaller than the %u-byte header", size,
                skeys::kHeaderSize);
  }
  skeys::StateKeysHeader h{};
  std::memcpy(&h, bytes, sizeof(h));
  if (h.format_version != skeys::kFormatVersion) {
    return fail(why, Error::DelegateInvalidCompatibility,
                "Kiln state keys: format_version is %u, but this Kiln reads version %u; "
                "re-export the model with the installed Kiln", h.format_version,
                skeys::kFormatVersion);
  }
  if (h.header_size != skeys::kHeaderSize || h.reserved != 0) {
    return fail(why, Error::InvalidProgram,
                "Kiln state keys: header_size is %u and reserved %u; version %u has a %u-byte "
                "header and reserved 0", h.header_size, h.reserved, skeys::kFormatVersion,
                skeys::kHeaderSize);
  }
  if (h.container_size != size) {
    return fail(why, Error::InvalidProgram,
                "Kiln state keys: container_size is %llu but the buffer holds %zu bytes",
                (ull)h.container_size, size);
  }
  if (h.num_states == 0 || h.num_states > skeys::kMaxStates) {
    return fail(why, Error::InvalidProgram, "Kiln state keys: num_states is %u, expected 1..%u",
                h.num_states, skeys::kMaxStates);
  }
  const uint64_t lengths_end = uint64_t(skeys::kHeaderSize) + 4ull * h.num_states;
  if (lengths_end > size) {
    return fail(why, Error::InvalidProgram,
                "Kiln state keys: %u key lengths end at byte %llu, past the %zu-byte buffer",
                h.num_states, (ull)lengths_end, size);
  }
  StateKeyed out;
  out.keys.reserve(h.num_states);
  std::set<std::string> seen;
  uint64_t at = lengths_end;
  for (uint32_t i = 0; i < h.num_states; ++i) {
    uint32_t length = 0;
    std::memcpy(&length, bytes + skeys::kHeaderSize + 4ull * i, sizeof(length));
    if (length == 0 || length > skeys::kMaxKeyLength) {
      return fail(why, Error::InvalidProgram,
                  "Kiln state keys: key %u has length %u, expected 1..%u", i, length,
                  skeys::kMaxKeyLength);
    }
    if (at + length > size) {
      return fail(why, Error::InvalidProgram,
                  "Kiln state keys: key %u ends at byte %llu, past the %zu-byte buffer", i,
                  (ull)(at + length), size);
    }
    std::string key(reinterpret_cast<const char*>(bytes + at), length);
    if (!seen.insert(key).second) {
      return fail(why, Error::InvalidProgram, "Kiln state keys: key %u ('%s') appears twice", i,
                  key.c_str());
    }
    out.keys.push_back(std::move(key));
    at += length;
  }
  if (h.payload_offset < at || h.payload_offset % skeys::kPayloadAlignment != 0 ||
      h.payload_offset > size || h.payload_size != size - h.payload_offset ||
      h.payload_size == 0) {
    return fail(why, Error::InvalidProgram,
                "Kiln state keys: payload at %llu of %llu bytes; expected a non-empty, %u-byte "
                "aligned payload after the keys (byte %llu) that ends the %zu-byte container",
                (ull)h.payload_offset, (ull)h.payload_size, skeys::kPayloadAlignment, (ull)at,
                size);
  }
  out.payload = bytes + h.payload_offset;
  out.payload_size = h.payload_size;
  return out;
}

}  // namespace kiln::engine
