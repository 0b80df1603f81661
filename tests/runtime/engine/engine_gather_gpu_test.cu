// kGather and kScatter on a GPU against a host reference (engine_gpu_fixture.h says how): gather
// along an axis with Int64 and Int32 indices (negative ones counting from the end) in several
// element sizes, an index_select-shaped read (one index broadcast over the other axes); index_put
// as a copy then a kScatter with two broadcast index tensors in every dtype, accumulation over
// duplicate positions in every dtype (Bool as logical or); and an out-of-range index of either op
// reported as an execution error after which the engine keeps working.
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

// x [4, 5, 3] copied to out, then out[i[a, 0], j[b], c] = values[c] for i [2, 1], j [3]
// (torch.index_put(x, (i, j), values): the broadcast index shape [2, 3] stays in place).
TEST_F(EngineGpu, ScatterTwoBroadcastIndicesEveryDtype) {
  for (DType index_dtype : {DType::kInt64, DType::kInt32}) {
    for (DType dtype : {DType::kFloat32, DType::kBFloat16, DType::kInt64, DType::kBool}) {
      OneOp c;
      const bool integral = dtype == DType::kInt64 || dtype == DType::kBool;
      const int64_t hi = dtype == DType::kBool ? 1 : 1000;
      const HostTensor x =
          integral ? random_int(dtype, {4, 5, 3}, 0, hi) : random(dtype, {4, 5, 3});
      const HostTensor values = integral ? random_int(dtype, {3}, 0, hi) : random(dtype, {3});
      HostTensor i = random_int(index_dtype, {2, 1}, 0, 0);
      HostTensor j = random_int(index_dtype, {3}, 0, 0);
      i.v = {0, -1};       // rows 0 and 3
      j.v = {1, 3, -5};    // columns 1, 3 and 0
      const int64_t xi = c.add_input(x), vi = c.add_input(values);
      const int64_t ii = c.add_input(i), ji = c.add_input(j);
      const int64_t out = c.b.output(dtype, {4, 5, 3});
      c.b.copy(xi, out, {60}, 0, {1}, 0, {1});
      c.b.scatter(vi, out, {2, 3, 3}, {0, 0, 1}, {0, 0, 1}, {ii, ji}, {1, 0, 0, 0, 1, 0}, {15, 3},
                  {4, 5}, false);
      const auto runs = run_three_ways(c.b, c.inputs);
      std::vector<double> want = x.v;
      for (int64_t a = 0; a < 2; ++a) {
        for (int64_t b = 0; b < 3; ++b) {
          const int64_t row = static_cast<int64_t>(i.v[a]) < 0 ? 3 : static_cast<int64_t>(i.v[a]);
          const int64_t col = static_cast<int64_t>(j.v[b]) + (j.v[b] < 0 ? 5 : 0);
          for (int64_t e = 0; e < 3; ++e) want[row * 15 + col * 3 + e] = values.v[e];
        }
      }
      expect_output(runs, 0, want, {0, 0},
                    std::string("index_put ") + dtype_name(dtype) + " by " +
                        dtype_name(index_dtype));
    }
  }
}

// out = x [5, 2], then out[index[k], :] += values[k, :] for index {1, 1, 3, 1}: duplicates add
// (torch.index_put(x, (index,), values, accumulate=True)); Bool adds as logical or.
TEST_F(EngineGpu, ScatterAccumulatesDuplicatePositionsEveryDtype) {
  for (DType index_dtype : {DType::kInt64, DType::kInt32}) {
    for (DType dtype : {DType::kFloat32, DType::kFloat16, DType::kBFloat16, DType::kInt32,
                        DType::kInt64, DType::kBool}) {
      OneOp c;
      const bool integral = !(dtype == DType::kFloat32 || dtype == DType::kFloat16 ||
                              dtype == DType::kBFloat16);
      const int64_t hi = dtype == DType::kBool ? 1 : 1000;
      const HostTensor x = integral ? random_int(dtype, {5, 2}, 0, hi) : random(dtype, {5, 2});
      const HostTensor values =
          integral ? random_int(dtype, {4, 2}, 0, hi) : random(dtype, {4, 2});
      HostTensor index = random_int(index_dtype, {4}, 0, 0);
      index.v = {1, 1, 3, -4};  // -4 is row 1 too
      const int64_t xi = c.add_input(x), vi = c.add_input(values), ii = c.add_input(index);
      const int64_t out = c.b.output(dtype, {5, 2});
      c.b.copy(xi, out, {10}, 0, {1}, 0, {1});
      c.b.scatter(vi, out, {4, 2}, {0, 1}, {2, 1}, {ii}, {1, 0}, {2}, {5}, true);
      const auto runs = run_three_ways(c.b, c.inputs);
      std::vector<double> want = x.v;
      for (int64_t k = 0; k < 4; ++k) {
        const int64_t row = static_cast<int64_t>(index.v[k]) + (index.v[k] < 0 ? 5 : 0);
        for (int64_t e = 0; e < 2; ++e) {
          double& w = want[row * 2 + e];
          w = dtype == DType::kBool ? double(w != 0 || values.v[k * 2 + e] != 0)
                                    : w + values.v[k * 2 + e];
        }
      }
      expect_output(runs, 0, want, integral ? Tol{0, 0} : tol_for(dtype, 4.0),
                    std::string("index_put accumulate ") + dtype_name(dtype) + " by " +
                        dtype_name(index_dtype));
    }
  }
}

// Replacing writes to one position: the value latest in iteration order wins (torch's CPU),
// here rows 1 (written by k = 0, 1, 3) and 3, over 4096 repeats of the pattern so that many
// threads race for each position.
TEST_F(EngineGpu, ScatterDuplicatePositionsTheLastValueWins) {
  for (DType dtype : {DType::kFloat32, DType::kBFloat16, DType::kInt64}) {
    OneOp c;
    const int64_t n = 4 * 4096;
    const bool integral = dtype == DType::kInt64;
    const HostTensor x = integral ? random_int(dtype, {5, 2}, 0, 1000) : random(dtype, {5, 2});
    const HostTensor values = integral ? random_int(dtype, {n, 2}, 0, 1000) : random(dtype, {n, 2});
    HostTensor index = random_int(DType::kInt64, {n}, 0, 0);
    for (int64_t k = 0; k < n; ++k) index.v[k] = (k % 4 == 2) ? 3 : 1;
    const int64_t xi = c.add_input(x), vi = c.add_input(values), ii = c.add_input(index);
    const int64_t out = c.b.output(dtype, {5, 2});
    c.b.copy(xi, out, {10}, 0, {1}, 0, {1});
    c.b.scatter(vi, out, {n, 2}, {0, 1}, {2, 1}, {ii}, {1, 0}, {2}, {5}, false);
    const auto runs = run_three_ways(c.b, c.inputs);
    std::vector<double> want = x.v;
    for (int64_t e = 0; e < 2; ++e) {
      want[1 * 2 + e] = values.v[(n - 1) * 2 + e];  // k = n - 1 is the last row-1 write
      want[3 * 2 + e] = values.v[(n - 2) * 2 + e];  // k = n - 2 the last row-3 one
    }
    expect_output(runs, 0, want, {0, 0}, std::string("index_put duplicates ") + dtype_name(dtype));
  }
}

TEST_F(EngineGpu, ScatterIndexOutOfRangeIsReportedAndTheEngineRecovers) {
  BlobBuilder b;
  const HostTensor values = random(DType::kFloat32, {3});
  const std::vector<uint8_t> vb = values.bytes();
  const int64_t vi = b.weight(DType::kFloat32, {3}, vb.data());
  const int64_t xi = b.input(DType::kFloat32, {6});
  const int64_t ii = b.input(DType::kInt64, {3});
  const int64_t out = b.output(DType::kFloat32, {6});
  b.copy(xi, out, {6}, 0, {1}, 0, {1});
  b.scatter(vi, out, {3}, {0}, {1}, {ii}, {1}, {1}, {6}, false);
  const std::vector<uint8_t> blob = b.build();
  auto engine = Engine::create(blob.data(), blob.size());
  ASSERT_TRUE(engine.ok()) << g_log;
  const float x[6] = {0, 1, 2, 3, 4, 5};
  for (int round = 0; round < 3; ++round) {  // eager, then graph replays: the flag resets
    for (int64_t bad : {int64_t{6}, int64_t{-7}}) {
      const int64_t indices[3] = {1, 2, bad};
      std::vector<float> result(6, -7.0f);
      const Binding in[2] = {{const_cast<float*>(x), sizeof(x), false},
                             {const_cast<int64_t*>(indices), sizeof(indices), false}};
      const Binding o{result.data(), result.size() * sizeof(float), false};
      g_log.clear();
      EXPECT_EQ((*engine)->execute(Span<const Binding>(in, 2), Span<const Binding>(&o, 1)),
                Error::InvalidArgument);
      EXPECT_NE(g_log.find("(index_put): index out of range: index " + std::to_string(bad) +
                           " (element 2 of index tensor 0) is outside [-6, 6)"),
                std::string::npos)
          << g_log;
      const int64_t good[3] = {5, -6, 3};
      const Binding gin[2] = {in[0], {const_cast<int64_t*>(good), sizeof(good), false}};
      ASSERT_EQ((*engine)->execute(Span<const Binding>(gin, 2), Span<const Binding>(&o, 1)),
                Error::Ok)
          << g_log;
      const std::vector<float> want = {static_cast<float>(values.v[1]), 1, 2,
                                       static_cast<float>(values.v[2]), 4,
                                       static_cast<float>(values.v[0])};
      EXPECT_EQ(result, want);
    }
  }
}

}  // namespace
}  // namespace kiln::engine::gpu_test
