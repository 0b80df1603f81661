// The state-key container reader (format/state_keys.h): a valid container gives its keys and
// payload; every malformed one is a specific Error with a sentence naming the field, never a crash.

#include "format/state_keys_reader.h"

#include <gtest/gtest.h>

#include <cstddef>
#include <cstring>
#include <string>
#include <vector>

#include "tests/format/log_capture.h"

namespace kiln::engine {
namespace {

using executorch::runtime::Error;
using Bytes = std::vector<uint8_t>;

const auto* const kLog = ::testing::AddGlobalTestEnvironment(new testing::LogCaptureEnvironment);

// What the Python preprocess writes (backend.py: wrap_state_keys).
Bytes container(const std::vector<std::string>& keys, const Bytes& payload) {
  Bytes keys_section;
  for (const std::string& k : keys) {
    uint32_t n = uint32_t(k.size());
    keys_section.insert(keys_section.end(), reinterpret_cast<uint8_t*>(&n),
                        reinterpret_cast<uint8_t*>(&n) + 4);
  }
  for (const std::string& k : keys) keys_section.insert(keys_section.end(), k.begin(), k.end());
  const uint64_t payload_offset =
      (skeys::kHeaderSize + keys_section.size() + skeys::kPayloadAlignment - 1) /
      skeys::kPayloadAlignment * skeys::kPayloadAlignment;
  skeys::StateKeysHeader h{};
  std::memcpy(h.magic, skeys::kMagic, sizeof(h.magic));
  h.format_version = skeys::kFormatVersion;
  h.header_size = skeys::kHeaderSize;
  h.container_size = payload_offset + payload.size();
  h.num_states = uint32_t(keys.size());
  h.payload_offset = payload_offset;
  h.payload_size = payload.size();
  Bytes out(h.container_size, 0);
  std::memcpy(out.data(), &h, sizeof(h));
  std::memcpy(out.data() + skeys::kHeaderSize, keys_section.data(), keys_section.size());
  std::memcpy(out.data() + payload_offset, payload.data(), payload.size());
  return out;
}

template <typename T>
void patch(Bytes& b, size_t offset, T value) {
  std::memcpy(b.data() + offset, &value, sizeof(value));
}

#define FIELD(name) offsetof(skeys::StateKeysHeader, name)

const Bytes kPayload = {'K', 'I', 'L', 'N', 'B', 'L', 'O', 'B', 1, 2, 3};

Error read_error(const Bytes& b, std::string* why) {
  auto r = read_state_keys(b.data(), b.size(), why);
  return r.ok() ? Error::Ok : r.error();
}

TEST(StateKeysReader, ValidContainerGivesKeysAndPayload) {
  Bytes b = container({"decoder.k_cache_0", "decoder.v_cache_0", "x"}, kPayload);
  ASSERT_TRUE(is_state_keyed(b.data(), b.size()));
  auto r = read_state_keys(b.data(), b.size());
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->keys, (std::vector<std::string>{"decoder.k_cache_0", "decoder.v_cache_0", "x"}));
  ASSERT_EQ(r->payload_size, kPayload.size());
  EXPECT_EQ(std::memcmp(r->payload, kPayload.data(), kPayload.size()), 0);
  EXPECT_EQ((r->payload - b.data()) % skeys::kPayloadAlignment, 0);
}

TEST(StateKeysReader, BareBlobIsNotAContainer) {
  EXPECT_FALSE(is_state_keyed(kPayload.data(), kPayload.size()));
  EXPECT_FALSE(is_state_keyed(nullptr, 0));
  std::string why;
  EXPECT_EQ(read_error(kPayload, &why), Error::InvalidProgram);
  EXPECT_NE(why.find("KILNSKEY"), std::string::npos) << why;
}

TEST(StateKeysReader, OtherVersionIsIncompatible) {
  Bytes b = container({"a"}, kPayload);
  patch<uint32_t>(b, FIELD(format_version), skeys::kFormatVersion + 1);
  std::string why;
  EXPECT_EQ(read_error(b, &why), Error::DelegateInvalidCompatibility);
  EXPECT_NE(why.find("format_version is 2"), std::string::npos) << why;
}

TEST(StateKeysReader, MalformedFieldsAreNamed) {
  struct Case {
    const char* what;
    void (*damage)(Bytes&);
    const char* message;
  };
  const Case cases[] = {
      {"truncated header", [](Bytes& b) { b.resize(20); }, "truncated"},
      {"size", [](Bytes& b) { patch<uint64_t>(b, FIELD(container_size), b.size() + 1); },
       "container_size"},
      {"no states", [](Bytes& b) { patch<uint32_t>(b, FIELD(num_states), 0); }, "num_states"},
      {"too many states",
       [](Bytes& b) { patch<uint32_t>(b, FIELD(num_states), skeys::kMaxStates + 1); },
       "num_states"},
      {"lengths past the end",
       [](Bytes& b) { patch<uint32_t>(b, FIELD(num_states), 1000); }, "key lengths end"},
      {"empty key", [](Bytes& b) { patch<uint32_t>(b, skeys::kHeaderSize, 0); }, "key 0 has length 0"},
      {"key past the end",
       [](Bytes& b) { patch<uint32_t>(b, skeys::kHeaderSize + 4, 4000); }, "key 1 ends"},
      {"reserved", [](Bytes& b) { patch<uint32_t>(b, FIELD(reserved), 1); }, "reserved 1"},
      {"misaligned payload",
       [](Bytes& b) { patch<uint64_t>(b, FIELD(payload_offset), 57); }, "payload at 57"},
      {"payload size", [](Bytes& b) { patch<uint64_t>(b, FIELD(payload_size), 3); }, "payload at"},
  };
  for (const Case& c : cases) {
    Bytes b = container({"first", "second"}, kPayload);
    c.damage(b);
    std::string why;
    EXPECT_EQ(read_error(b, &why), Error::InvalidProgram) << c.what;
    EXPECT_NE(why.find(c.message), std::string::npos) << c.what << ": " << why;
  }
}

TEST(StateKeysReader, DuplicateKeyIsRefused) {
  Bytes b = container({"k", "k"}, kPayload);
  std::string why;
  EXPECT_EQ(read_error(b, &why), Error::InvalidProgram);
  EXPECT_NE(why.find("appears twice"), std::string::npos) << why;
}

TEST(StateKeysReader, EveryTruncationFailsCleanly) {
  const Bytes b = container({"decoder.k_cache_0", "decoder.v_cache_0"}, kPayload);
  for (size_t n = 0; n < b.size(); ++n) {
    Bytes cut(b.begin(), b.begin() + long(n));
    EXPECT_NE(read_error(cut, nullptr), Error::Ok) << n;
  }
}

}  // namespace
}  // namespace kiln::engine
