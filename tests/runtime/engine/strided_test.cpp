#include "runtime/engine/strided.h"

#include <gtest/gtest.h>

namespace kiln::engine {
namespace {

TEST(Strided, ContiguousCollapsesToOneDimension) {
  const int64_t sizes[] = {2, 3, 4};
  int64_t out[3];
  contiguous_strides(3, sizes, out);
  EXPECT_EQ(out[0], 12);
  EXPECT_EQ(out[1], 4);
  EXPECT_EQ(out[2], 1);
  const int64_t* strides[2] = {out, out};
  const StridedLoop<2> loop = collapse<2>(3, sizes, strides);
  EXPECT_EQ(loop.rank, 1);
  EXPECT_EQ(loop.numel, 24);
  EXPECT_EQ(loop.sizes[0], 24);
  EXPECT_TRUE(is_dense(loop, 0));
  EXPECT_TRUE(is_dense(loop, 1));
}

TEST(Strided, TransposeKeepsBothDimensions) {
  const int64_t sizes[] = {4, 2};
  const int64_t in[] = {1, 4};
  const int64_t out[] = {2, 1};
  const int64_t* strides[2] = {out, in};
  const StridedLoop<2> loop = collapse<2>(2, sizes, strides);
  EXPECT_EQ(loop.rank, 2);
  EXPECT_FALSE(is_dense(loop, 1));
}

TEST(Strided, BroadcastRowMergesOuterDimensions) {
  // [2, 3, 4] + [4] broadcast: the two outer dims merge for every operand.
  const int64_t sizes[] = {2, 3, 4};
  const int64_t a[] = {12, 4, 1};
  const int64_t b[] = {0, 0, 1};
  const int64_t* strides[2] = {a, b};
  const StridedLoop<2> loop = collapse<2>(3, sizes, strides);
  ASSERT_EQ(loop.rank, 2);
  EXPECT_EQ(loop.sizes[0], 6);
  EXPECT_EQ(loop.sizes[1], 4);
  EXPECT_EQ(loop.strides[0][0], 4);
  EXPECT_EQ(loop.strides[1][0], 0);
}

TEST(Strided, SizeOneDimensionsDropAndEmptyHasNoRank) {
  const int64_t sizes[] = {1, 5, 1};
  const int64_t a[] = {99, 3, 77};
  const int64_t* strides[1] = {a};
  const StridedLoop<1> loop = collapse<1>(3, sizes, strides);
  ASSERT_EQ(loop.rank, 1);
  EXPECT_EQ(loop.strides[0][0], 3);
  const int64_t empty[] = {4, 0};
  const int64_t* e_strides[1] = {a};
  EXPECT_EQ(collapse<1>(2, empty, e_strides).numel, 0);
  const StridedLoop<1> scalar = collapse<1>(0, sizes, strides);
  EXPECT_EQ(scalar.rank, 0);
  EXPECT_EQ(scalar.numel, 1);
}

TEST(Strided, WidenNeedsUnitInnerStrideAndDivisibleEverything) {
  const int64_t sizes[] = {3, 8};
  const int64_t a[] = {16, 1};
  const int64_t b[] = {8, 1};
  const int64_t* strides[2] = {a, b};
  StridedLoop<2> loop = collapse<2>(2, sizes, strides);
  const int64_t offsets[2] = {4, 0};
  ASSERT_TRUE(widen(loop, offsets, 4));
  EXPECT_EQ(loop.sizes[1], 2);
  EXPECT_EQ(loop.strides[0][0], 4);
  EXPECT_EQ(loop.strides[1][0], 2);
  EXPECT_EQ(loop.numel, 6);
  StridedLoop<2> odd = collapse<2>(2, sizes, strides);
  const int64_t bad_offsets[2] = {2, 0};
  EXPECT_FALSE(widen(odd, bad_offsets, 4));
  EXPECT_EQ(odd.numel, 24);
}

}  // namespace
}  // namespace kiln::engine
