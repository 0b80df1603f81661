// No input may crash the blob reader: every byte of a valid blob flipped, random mutations.
#include "tests/format/reader_test_support.h"  // the standard headers the tests use, too

namespace kiln::engine {
namespace {

using namespace reader_test;

// No input may crash the reader: flip every byte of a valid blob, then mutate at random.
TEST(BlobReader, SurvivesEveryByteFlipped) {
  const Bytes good = kitchen_sink().build();
  size_t rejected = 0;
  for (size_t i = 0; i < good.size(); ++i) {
    for (uint8_t mask : {uint8_t{0x01}, uint8_t{0x80}, uint8_t{0xFF}}) {
      Bytes bytes = good;
      bytes[i] ^= mask;
      std::string why;
      auto r = read_blob(bytes.data(), bytes.size(), &why);
      if (!r.ok()) {
        ++rejected;
        EXPECT_FALSE(why.empty());
      }
    }
  }
  EXPECT_GT(rejected, good.size());
  g_log.clear();
}

TEST(BlobReader, SurvivesRandomOperandsAndTruncation) {
  std::mt19937_64 rng(1234);
  BlobBuilder base = kitchen_sink();
  const int64_t interesting[] = {-2,
                                 -1,
                                 0,
                                 1,
                                 2,
                                 3,
                                 7,
                                 8,
                                 9,
                                 1 << 20,
                                 std::numeric_limits<int64_t>::max(),
                                 std::numeric_limits<int64_t>::min()};
  for (int iter = 0; iter < 3000; ++iter) {
    BlobBuilder b = base;
    const int edits = 1 + static_cast<int>(rng() % 4);
    for (int e = 0; e < edits; ++e) {
      b.operands[rng() % b.operands.size()] = interesting[rng() % std::size(interesting)];
    }
    Bytes bytes = b.build();
    size_t size = bytes.size();
    if (iter % 5 == 0) {
      size = rng() % (bytes.size() + 1);
    }
    std::string why;
    auto r = read_blob(bytes.data(), size, &why);
    EXPECT_TRUE(r.ok() || !why.empty());
  }
  g_log.clear();
}


}  // namespace
}  // namespace kiln::engine
