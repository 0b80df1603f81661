// The variant set reader: a valid container round-trips; every malformed one is a specific Error
// with a sentence naming the field, never a crash.

#include "format/variant_set_reader.h"

#include <gtest/gtest.h>

#include <cstddef>
#include <cstring>
#include <string>
#include <vector>

#include "tests/format/log_capture.h"
#include "tests/format/variant_set_builder.h"

namespace kiln::engine {
namespace {

using executorch::runtime::Error;
using testing::Bytes;
using testing::linear_relu;
using testing::linear_relu_set;

const auto* const kLog = ::testing::AddGlobalTestEnvironment(new testing::LogCaptureEnvironment);

template <typename T>
void patch(Bytes& b, size_t offset, T value) {
  std::memcpy(b.data() + offset, &value, sizeof(value));
}

#define FIELD(name) offsetof(vset::VariantSetHeader, name)

vset::VariantSetHeader header_of(const Bytes& b) {
  vset::VariantSetHeader h;
  std::memcpy(&h, b.data(), sizeof(h));
  return h;
}

vset::VariantRecord record_of(const Bytes& b, uint32_t v) {
  vset::VariantRecord r;
  std::memcpy(&r, b.data() + header_of(b).variants_offset + v * sizeof(r), sizeof(r));
  return r;
}

::testing::AssertionResult fails_with(const Bytes& bytes, Error code, const std::string& needle,
                                      size_t size = SIZE_MAX) {
  std::string why;
  auto result = read_variant_set(bytes.data(), size == SIZE_MAX ? bytes.size() : size, &why);
  if (result.ok()) return ::testing::AssertionFailure() << "accepted; expected '" << needle << "'";
  if (result.error() != code) {
    return ::testing::AssertionFailure() << "error " << executorch::runtime::to_string(result.error())
                                         << ", expected " << executorch::runtime::to_string(code)
                                         << ": " << why;
  }
  if (why.find(needle) == std::string::npos) {
    return ::testing::AssertionFailure() << "message lacks '" << needle << "': " << why;
  }
  return ::testing::AssertionSuccess() << why;
}

Shape shape(std::vector<int64_t> sizes) {
  Shape s;
  s.rank = static_cast<uint32_t>(sizes.size());
  for (size_t d = 0; d < sizes.size(); ++d) s.sizes[d] = sizes[d];
  return s;
}

TEST(VariantSetReader, ValidSetRoundTrips) {
  const Bytes bytes = linear_relu_set({1, 2, 16});
  ASSERT_TRUE(is_variant_set(bytes.data(), bytes.size()));
  std::string why;
  auto set = read_variant_set(bytes.data(), bytes.size(), &why);
  ASSERT_TRUE(set.ok()) << why;
  ASSERT_EQ(set->variants.size(), 3u);
  EXPECT_EQ(set->weights.size, linear_relu(1).weights.size());
  EXPECT_EQ(std::memcmp(set->weights.data, linear_relu(1).weights.data(), set->weights.size), 0);
  EXPECT_EQ(set->variants[2].inputs[0].rank, 2u);
  EXPECT_EQ(set->variants[2].inputs[0].sizes[0], 16);
  EXPECT_EQ(find_variant(*set, {shape({2, 4})}), 1);
  EXPECT_EQ(find_variant(*set, {shape({3, 4})}), -1);
  EXPECT_EQ(find_variant(*set, {shape({2, 4, 1})}), -1);
  EXPECT_NE(describe_shapes(*set).find("input 0 [1..16,4] (3 variants)"), std::string::npos)
      << describe_shapes(*set);
  // Each variant is an ordinary blob read with the shared weights.
  auto g = read_blob(set->variants[1].blob, set->variants[1].blob_size, &why, &set->weights);
  ASSERT_TRUE(g.ok()) << why;
  EXPECT_EQ(g->weights, set->weights.data);
  EXPECT_EQ(g->weights_size, set->weights.size);
}

TEST(VariantSetReader, VariantsMayCarryTheirOwnWeights) {
  const Bytes bytes = testing::build_variant_set(
      {{linear_relu(1).build(), {{1, 4}}}, {linear_relu(5).build(), {{5, 4}}}}, {});
  std::string why;
  auto set = read_variant_set(bytes.data(), bytes.size(), &why);
  ASSERT_TRUE(set.ok()) << why;
  EXPECT_EQ(set->weights.size, 0u);
  EXPECT_EQ(find_variant(*set, {shape({5, 4})}), 1);
}

TEST(VariantSetReader, ExternalWeightsBlobNeedsItsSet) {
  const Bytes stripped = testing::without_weights(linear_relu(2).build());
  std::string why;
  auto g = read_blob(stripped.data(), stripped.size(), &why);
  ASSERT_FALSE(g.ok());
  EXPECT_EQ(g.error(), Error::InvalidProgram);
  EXPECT_NE(why.find("weights are external"), std::string::npos) << why;
  // Given weights too short for its weight tensors.
  const Bytes weights = linear_relu(2).weights;
  WeightsView shorter{weights.data(), 64};
  auto g2 = read_blob(stripped.data(), stripped.size(), &why, &shorter);
  ASSERT_FALSE(g2.ok());
  EXPECT_NE(why.find("past the external weights section (64 bytes)"), std::string::npos) << why;
  // The flag with a non-empty own section.
  Bytes both = linear_relu(2).build();
  patch<uint32_t>(both, offsetof(blob::Header, flags), blob::kFlagExternalWeights);
  WeightsView all{weights.data(), weights.size()};
  auto g3 = read_blob(both.data(), both.size(), &why, &all);
  ASSERT_FALSE(g3.ok());
  EXPECT_NE(why.find("external-weights flag is set but weights_size"), std::string::npos) << why;
  // Undefined flag bits stay errors.
  Bytes other = linear_relu(2).build();
  patch<uint32_t>(other, offsetof(blob::Header, flags), 2);
  EXPECT_FALSE(read_blob(other.data(), other.size(), &why).ok());
  EXPECT_NE(why.find("flags is 0x2"), std::string::npos) << why;
}

TEST(VariantSetReader, SharedWeightsTooShortForAVariantFail) {
  Bytes weights = linear_relu(1).weights;
  weights.resize(64);
  const Bytes bytes = testing::build_variant_set(
      {{testing::without_weights(linear_relu(1).build()), {{1, 4}}}}, weights);
  EXPECT_TRUE(fails_with(bytes, Error::InvalidProgram, "variant 0: Kiln blob: tensor 2 extent"));
}

TEST(VariantSetReader, WrongMagicOrVersion) {
  Bytes bytes = linear_relu_set({1, 2});
  bytes[4] = 'X';
  EXPECT_FALSE(is_variant_set(bytes.data(), bytes.size()));
  EXPECT_TRUE(fails_with(bytes, Error::InvalidProgram, "does not start with 'KILNVSET'"));
  EXPECT_TRUE(fails_with(bytes, Error::InvalidProgram, "not a Kiln variant set", 3));
  bytes = linear_relu_set({1, 2});
  patch<uint32_t>(bytes, FIELD(format_version), 2);
  EXPECT_TRUE(fails_with(bytes, Error::DelegateInvalidCompatibility, "format_version is 2"));
  bytes = linear_relu_set({1, 2});
  patch<uint32_t>(bytes, FIELD(header_size), 72);
  EXPECT_TRUE(fails_with(bytes, Error::InvalidProgram, "header_size is 72"));
}

TEST(VariantSetReader, TruncatedOrPaddedFails) {
  const Bytes bytes = linear_relu_set({1, 2});
  EXPECT_TRUE(fails_with(bytes, Error::InvalidProgram, "smaller than the 64-byte header", 40));
  for (size_t n = 0; n < bytes.size(); ++n) {
    std::string why;
    EXPECT_FALSE(read_variant_set(bytes.data(), n, &why).ok()) << n;
  }
  EXPECT_TRUE(fails_with(bytes, Error::InvalidProgram, "container_size", bytes.size() - 1));
  Bytes padded = bytes;
  padded.push_back(0);
  EXPECT_TRUE(fails_with(padded, Error::InvalidProgram, "container_size"));
}

TEST(VariantSetReader, CountsOutOfRangeFail) {
  Bytes bytes = linear_relu_set({1, 2});
  patch<uint32_t>(bytes, FIELD(num_variants), 0);
  EXPECT_TRUE(fails_with(bytes, Error::InvalidProgram, "num_variants is 0"));
  patch<uint32_t>(bytes, FIELD(num_variants), vset::kMaxVariants + 1);
  EXPECT_TRUE(fails_with(bytes, Error::InvalidProgram, "num_variants is 65"));
  patch<uint32_t>(bytes, FIELD(num_variants), 40);  // the tables no longer fit
  EXPECT_TRUE(fails_with(bytes, Error::InvalidProgram, "shapes_offset (96) with 2880 bytes is "
                                                       "outside"));
  bytes = linear_relu_set({1, 2});
  patch<uint32_t>(bytes, FIELD(num_inputs), 0xFFFFFFFFu);
  EXPECT_TRUE(fails_with(bytes, Error::InvalidProgram, "num_inputs is 4294967295"));
  patch<uint32_t>(bytes, FIELD(num_inputs), 2);
  EXPECT_TRUE(fails_with(bytes, Error::InvalidProgram, "variant 0's blob has 1 inputs"));
}

TEST(VariantSetReader, OffsetsOutOfRangeNameTheField) {
  const Bytes good = linear_relu_set({1, 2});
  Bytes bytes = good;
  patch<uint64_t>(bytes, FIELD(variants_offset), ~uint64_t{0} - 8);
  EXPECT_TRUE(fails_with(bytes, Error::InvalidProgram, "variants_offset"));
  bytes = good;
  patch<uint64_t>(bytes, FIELD(shapes_offset), 8);
  EXPECT_TRUE(fails_with(bytes, Error::InvalidProgram, "shapes_offset (8)"));
  bytes = good;
  patch<uint64_t>(bytes, FIELD(weights_offset), good.size());
  EXPECT_TRUE(fails_with(bytes, Error::InvalidProgram, "weights_offset"));
  bytes = good;
  patch<uint64_t>(bytes, FIELD(weights_size), ~uint64_t{0});
  EXPECT_TRUE(fails_with(bytes, Error::InvalidProgram, "weights_offset"));
  bytes = good;
  const size_t rec = header_of(good).variants_offset + sizeof(vset::VariantRecord);
  patch<uint64_t>(bytes, rec, good.size() - 8);
  EXPECT_TRUE(fails_with(bytes, Error::InvalidProgram, "variant 1 blob"));
  bytes = good;
  patch<uint64_t>(bytes, rec + 8, ~uint64_t{0});
  EXPECT_TRUE(fails_with(bytes, Error::InvalidProgram, "variant 1 blob"));
  bytes = good;
  patch<uint64_t>(bytes, rec, record_of(good, 1).blob_offset + 4);
  EXPECT_TRUE(fails_with(bytes, Error::InvalidProgram, "misaligned"));
  bytes = good;
  patch<uint64_t>(bytes, rec + 8, record_of(good, 1).blob_size - 8);
  EXPECT_TRUE(fails_with(bytes, Error::InvalidProgram, "variant 1: Kiln blob"));
}

TEST(VariantSetReader, ShapesMustAgreeWithTheVariantBlob) {
  const Bytes weights = linear_relu(1).weights;
  Bytes bytes = testing::build_variant_set(
      {{testing::without_weights(linear_relu(2).build()), {{3, 4}}}}, weights);
  EXPECT_TRUE(fails_with(bytes, Error::InvalidProgram,
                         "variant 0 input 0 is declared [3,4] but its blob's input is [2,4]"));
  bytes = testing::build_variant_set(
      {{testing::without_weights(linear_relu(2).build()), {{2, 4, 1}}}}, weights);
  EXPECT_TRUE(fails_with(bytes, Error::InvalidProgram, "is declared [2,4,1]"));
  bytes = linear_relu_set({1, 2});
  const size_t shapes = header_of(bytes).shapes_offset;
  patch<uint32_t>(bytes, shapes, 9);
  EXPECT_TRUE(fails_with(bytes, Error::InvalidProgram, "variant 0 input 0: rank 9"));
  bytes = linear_relu_set({1, 2});
  patch<uint32_t>(bytes, shapes + 4, 1);
  EXPECT_TRUE(fails_with(bytes, Error::InvalidProgram, "reserved 1"));
  bytes = linear_relu_set({1, 2});
  patch<int64_t>(bytes, shapes + 8 + 5 * 8, 7);
  EXPECT_TRUE(fails_with(bytes, Error::InvalidProgram, "variant 0 input 0: sizes[5] is 7"));
}

TEST(VariantSetReader, VariantsMustBeDistinctAndAlike) {
  Bytes bytes = linear_relu_set({2, 2});
  EXPECT_TRUE(fails_with(bytes, Error::InvalidProgram, "variants 0 and 1 serve the same"));
  testing::BlobBuilder other;
  const int64_t x = other.input(blob::DType::kFloat32, {3, 4});
  const int64_t y = other.output(blob::DType::kInt32, {3, 4});
  other.unary(blob::UnaryKind::kIdentity, x, y);
  bytes = testing::build_variant_set(
      {{linear_relu(1).build(), {{1, 4}}}, {other.build(), {{3, 4}}}}, {});
  EXPECT_TRUE(fails_with(bytes, Error::InvalidProgram, "variant 1's inputs/outputs"));
}

TEST(VariantSetReader, SurvivesEveryByteFlipped) {
  const Bytes good = linear_relu_set({1, 3});
  for (size_t i = 0; i < good.size(); ++i) {
    Bytes bytes = good;
    bytes[i] ^= 0xA5;
    std::string why;
    auto set = read_variant_set(bytes.data(), bytes.size(), &why);
    if (!set.ok()) {
      EXPECT_FALSE(why.empty()) << i;
    }
  }
}

}  // namespace
}  // namespace kiln::engine
