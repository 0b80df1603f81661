// kGather on a GPU against a host reference (engine_gpu_fixture.h says how): gather along an
// axis with Int64 and Int32 indices (negative ones counting from the end) in several element
// sizes, an index_select-shaped read (one index broadcast over the other axes), and an
// out-of-range index reported as an execution error after which the engine keeps working.
#include "tests/runtime/engine/engine_gpu_fixture.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

namespace kiln::engine::gpu_test {
namespace {

TEST_F(EngineGpu, GatherAlongAnAxisEveryElementSize) {
  for (DType index_dtype : {DType::kInt64, DType::kInt32}) {
    for (DType dtype : {DType::kFloat32, DType::kFloat16, DType::kInt64, DType::kBool}) {
      // out[i, j] = x[i, index[i, j]] for x [3, 5], index [3, 4] (torch.gather(x, 1, index)).
      OneOp c;
      const HostTensor x = dtype == DType::kBool ? random_int(dtype, {3, 5}, 0, 1)
                           : dtype == DType::kInt64 ? random_int(dtype, {3, 5}, -1000, 1000)
                                                    : random(dtype, {3, 5});
      const HostTensor index = random_int(index_dtype, {3, 4}, -5, 4);
      const int64_t xi = c.add_input(x), ii = c.add_input(index);
      const int64_t out = c.b.output(dtype, {3, 4});
      c.b.gather(xi, ii, out, {3, 4}, {5, 0}, {4, 1}, 1, 5);
      const auto runs = run_three_ways(c.b, c.inputs);
      std::vector<double> want(12);
      for (int64_t i = 0; i < 3; ++i) {
        for (int64_t j = 0; j < 4; ++j) {
          int64_t at = static_cast<int64_t>(index.v[i * 4 + j]);
          at += at < 0 ? 5 : 0;
          want[i * 4 + j] = x.v[i * 5 + at];
        }
      }
      expect_output(runs, 0, want, {0, 0},
                    std::string("gather ") + dtype_name(dtype) + " by " + dtype_name(index_dtype));
    }
  }
}

TEST_F(EngineGpu, GatherIndexSelectBroadcastsOneIndex) {
  // out[a, k, b] = x[a, index[k], b] for x [2, 6, 3], index [4] (x.index_select(1, index)).
  OneOp c;
  const HostTensor x = random(DType::kFloat32, {2, 6, 3});
  const HostTensor index = random_int(DType::kInt64, {4}, 0, 5);
  const int64_t xi = c.add_input(x), ii = c.add_input(index);
  const int64_t out = c.b.output(DType::kFloat32, {2, 4, 3});
  c.b.gather(xi, ii, out, {2, 4, 3}, {18, 0, 1}, {0, 1, 0}, 3, 6);
  const auto runs = run_three_ways(c.b, c.inputs);
  std::vector<double> want(24);
  for_each_index({2, 4, 3}, [&](int64_t i, const Sizes& id) {
    want[i] = x.v[id[0] * 18 + static_cast<int64_t>(index.v[id[1]]) * 3 + id[2]];
  });
  expect_output(runs, 0, want, {0, 0}, "index_select");
}

TEST_F(EngineGpu, GatherIndexOutOfRangeIsReportedAndTheEngineRecovers) {
  BlobBuilder b;
  const HostTensor table = random(DType::kFloat32, {10});
  const std::vector<uint8_t> tb = table.bytes();
  const int64_t wi = b.weight(DType::kFloat32, {10}, tb.data());
  const int64_t ii = b.input(DType::kInt64, {3});
  const int64_t out = b.output(DType::kFloat32, {3});
  b.gather(wi, ii, out, {3}, {0}, {1}, 1, 10);
  const std::vector<uint8_t> blob = b.build();
  auto engine = Engine::create(blob.data(), blob.size());
  ASSERT_TRUE(engine.ok()) << g_log;
  for (int round = 0; round < 3; ++round) {  // eager, then graph replays: the flag resets
    for (int64_t bad : {int64_t{10}, int64_t{-11}}) {
      const int64_t indices[3] = {1, 2, bad};
      std::vector<float> result(3, -7.0f);
      const Binding in{const_cast<int64_t*>(indices), sizeof(indices), false};
      const Binding o{result.data(), result.size() * sizeof(float), false};
      g_log.clear();
      EXPECT_EQ((*engine)->execute(Span<const Binding>(&in, 1), Span<const Binding>(&o, 1)),
                Error::InvalidArgument);
      EXPECT_NE(g_log.find("(gather): index out of range: index " + std::to_string(bad) +
                           " (element 2 of the index tensor) is outside [-10, 10)"),
                std::string::npos)
          << g_log;
      const int64_t good[3] = {9, -10, 4};
      const Binding gin{const_cast<int64_t*>(good), sizeof(good), false};
      ASSERT_EQ((*engine)->execute(Span<const Binding>(&gin, 1), Span<const Binding>(&o, 1)),
                Error::Ok)
          << g_log;
      EXPECT_EQ(result[0], static_cast<float>(table.v[9]));
      EXPECT_EQ(result[1], static_cast<float>(table.v[0]));
      EXPECT_EQ(result[2], static_cast<float>(table.v[4]));
    }
  }
}

}  // namespace
}  // namespace kiln::engine::gpu_test
