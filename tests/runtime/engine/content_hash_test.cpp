// content_hash: the properties the weight cache relies on (same bytes -> same key, any change ->
// another key) and its cost on a weight-sized buffer.
#include "runtime/engine/content_hash.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <set>
#include <utility>
#include <vector>

namespace kiln::engine {
namespace {

std::vector<unsigned char> pattern(size_t n, uint32_t seed) {
  std::vector<unsigned char> v(n);
  uint32_t x = seed * 2654435761u + 1;
  for (auto& b : v) {
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    b = static_cast<unsigned char>(x);
  }
  return v;
}

std::pair<uint64_t, uint64_t> key(const Hash128& h) { return {h.lo, h.hi}; }

TEST(ContentHash, SameBytesSameHashAtAnyAlignment) {
  const auto data = pattern(5000, 1);
  std::vector<unsigned char> shifted(data.size() + 7);
  for (size_t shift = 0; shift < 8; ++shift) {
    std::memcpy(shifted.data() + shift % 7, data.data(), data.size());
    EXPECT_EQ(content_hash(shifted.data() + shift % 7, data.size()),
              content_hash(data.data(), data.size()));
  }
}

TEST(ContentHash, VectorPathMatchesThePortableOne) {
  for (size_t n : {0u, 1u, 63u, 64u, 65u, 1023u, 1024u, 1025u, 4096u, 5000u, 70000u}) {
    const auto data = pattern(n, static_cast<uint32_t>(n) + 5);
    EXPECT_EQ(content_hash(data.data(), n), content_hash_portable(data.data(), n)) << n;
  }
}

TEST(ContentHash, EveryBitFlipGivesANewHashInBothHalves) {
  // 2100 bytes: two full 1 KiB blocks, a full stripe and a partial one.
  auto data = pattern(2100, 2);
  std::set<uint64_t> lo, hi;
  lo.insert(content_hash(data.data(), data.size()).lo);
  hi.insert(content_hash(data.data(), data.size()).hi);
  for (size_t bit = 0; bit < data.size() * 8; ++bit) {
    data[bit / 8] ^= static_cast<unsigned char>(1u << (bit % 8));
    const Hash128 h = content_hash(data.data(), data.size());
    data[bit / 8] ^= static_cast<unsigned char>(1u << (bit % 8));
    lo.insert(h.lo);
    hi.insert(h.hi);
  }
  EXPECT_EQ(lo.size(), data.size() * 8 + 1);
  EXPECT_EQ(hi.size(), data.size() * 8 + 1);
}

TEST(ContentHash, LengthAndOrderMatter) {
  std::vector<unsigned char> zeros(4096, 0);
  std::set<std::pair<uint64_t, uint64_t>> seen;
  for (size_t n = 0; n <= zeros.size(); ++n) {
    seen.insert(key(content_hash(zeros.data(), n)));  // trailing zeros change the length only
  }
  EXPECT_EQ(seen.size(), zeros.size() + 1);

  // Swapping two 64-byte stripes inside a block, or two whole 1 KiB blocks.
  auto data = pattern(4096, 3);
  const Hash128 base = content_hash(data.data(), data.size());
  auto stripes = data;
  std::swap_ranges(stripes.begin(), stripes.begin() + 64, stripes.begin() + 128);
  EXPECT_NE(content_hash(stripes.data(), stripes.size()), base);
  auto blocks = data;
  std::swap_ranges(blocks.begin(), blocks.begin() + 1024, blocks.begin() + 2048);
  EXPECT_NE(content_hash(blocks.data(), blocks.size()), base);
}

TEST(ContentHash, ManyBuffersNoCollisions) {
  std::set<std::pair<uint64_t, uint64_t>> seen;
  std::set<std::vector<unsigned char>> distinct;  // short lengths repeat data across seeds
  for (uint32_t seed = 0; seed < 20000; ++seed) {
    const auto data = pattern(1 + seed % 300, seed);
    seen.insert(key(content_hash(data.data(), data.size())));
    distinct.insert(data);
  }
  EXPECT_GT(distinct.size(), 19000u);
  EXPECT_EQ(seen.size(), distinct.size());
}

// The cost the weight cache adds to engine creation: hashing 45 MB, compared with the floor of
// reading those bytes once. Printed for the record; the bound only catches a non-vectorised or
// otherwise broken loop, not noise on a shared machine.
TEST(ContentHash, CostOnA45MegabyteBuffer) {
  const auto data = pattern(45u << 20, 4);
  using Clock = std::chrono::steady_clock;
  double hash_s = 1e9, read_s = 1e9;
  uint64_t sink = 0;
  for (int r = 0; r < 5; ++r) {
    auto t0 = Clock::now();
    sink ^= content_hash(data.data(), data.size()).lo;
    auto t1 = Clock::now();
    uint64_t acc[4] = {0, 0, 0, 0};
    for (size_t i = 0; i + 32 <= data.size(); i += 32) {
      for (int j = 0; j < 4; ++j) {
        uint64_t w;
        std::memcpy(&w, data.data() + i + 8 * j, 8);
        acc[j] += w;
      }
    }
    auto t2 = Clock::now();
    sink ^= acc[0] + acc[1] + acc[2] + acc[3];
    hash_s = std::min(hash_s, std::chrono::duration<double>(t1 - t0).count());
    read_s = std::min(read_s, std::chrono::duration<double>(t2 - t1).count());
  }
  std::printf("content_hash of 45 MiB: %.2f ms (%.1f GB/s); reading it once: %.2f ms (%.1f GB/s) "
              "[%llx]\n",
              hash_s * 1e3, data.size() / hash_s / 1e9, read_s * 1e3, data.size() / read_s / 1e9,
              static_cast<unsigned long long>(sink & 0xF));
  RecordProperty("hash_gb_per_s", std::to_string(data.size() / hash_s / 1e9));
#if !defined(__SANITIZE_ADDRESS__)  // instrumented loads make any timing meaningless
  EXPECT_LT(hash_s, 4 * read_s + 0.005);
#endif
}

}  // namespace
}  // namespace kiln::engine
