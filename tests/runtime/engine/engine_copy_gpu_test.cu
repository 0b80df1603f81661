// The ops that move or produce values without arithmetic, on a GPU against a host reference
// (engine_gpu_fixture.h says how): copy (transpose, permute, slice, expand, casts), embedding
// (gathering rows, and an out-of-range index reported on the device), embedding bags and fill.
#include "tests/runtime/engine/engine_gpu_fixture.h"

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

namespace kiln::engine::gpu_test {
namespace {

// ---------------------------------------------------------------------------------------------
// Copy.

TEST_F(EngineGpu, CopyTransposePermuteSliceExpand) {
  OneOp c;
  const HostTensor x = random(DType::kFloat32, {37, 19});
  const HostTensor p = random(DType::kFloat32, {4, 6, 8});
  const HostTensor s = random(DType::kFloat32, {10, 12});
  const HostTensor e = random(DType::kFloat32, {1, 5});
  const int64_t xi = c.add_input(x), pi = c.add_input(p), si = c.add_input(s), ei = c.add_input(e);
  const int64_t t_out = c.b.output(DType::kFloat32, {19, 37});
  const int64_t p_out = c.b.output(DType::kFloat32, {6, 4, 8});
  const int64_t s_out = c.b.output(DType::kFloat32, {4, 5});
  const int64_t e_out = c.b.output(DType::kFloat32, {3, 5});
  const int64_t cat_out = c.b.output(DType::kFloat32, {4, 10});
  c.b.copy(xi, t_out, {19, 37}, 0, {1, 19}, 0, {37, 1});         // transpose
  c.b.copy(pi, p_out, {6, 4, 8}, 0, {8, 48, 1}, 0, {32, 8, 1});  // permute, 16B words
  c.b.copy(si, s_out, {4, 5}, 3 * 12 + 2, {12, 1}, 0, {5, 1});   // s[3:7, 2:7]
  c.b.copy(ei, e_out, {3, 5}, 0, {0, 1}, 0, {5, 1});             // expand
  c.b.copy(si, cat_out, {4, 5}, 0, {12, 1}, 0, {10, 1});         // cat piece 1
  c.b.copy(si, cat_out, {4, 5}, 5 * 12, {12, 1}, 5, {10, 1});    // cat piece 2
  const auto runs = run_three_ways(c.b, c.inputs);
  std::vector<double> want_t(19 * 37), want_p(6 * 4 * 8), want_s(20), want_e(15), want_cat(40);
  for_each_index({19, 37},
                 [&](int64_t i, const Sizes& id) { want_t[i] = x.v[id[1] * 19 + id[0]]; });
  for_each_index({6, 4, 8}, [&](int64_t i, const Sizes& id) {
    want_p[i] = p.v[id[1] * 48 + id[0] * 8 + id[2]];
  });
  for_each_index({4, 5}, [&](int64_t i, const Sizes& id) {
    want_s[i] = s.v[(3 + id[0]) * 12 + 2 + id[1]];
    want_cat[id[0] * 10 + id[1]] = s.v[id[0] * 12 + id[1]];
    want_cat[id[0] * 10 + 5 + id[1]] = s.v[(5 + id[0]) * 12 + id[1]];
  });
  for_each_index({3, 5}, [&](int64_t i, const Sizes& id) { want_e[i] = e.v[id[1]]; });
  const Tol exact{0, 0};
  expect_output(runs, 0, want_t, exact, "transpose");
  expect_output(runs, 1, want_p, exact, "permute");
  expect_output(runs, 2, want_s, exact, "slice");
  expect_output(runs, 3, want_e, exact, "expand");
  expect_output(runs, 4, want_cat, exact, "cat");
}

TEST_F(EngineGpu, CopyCastsBetweenEveryDtypeFamily) {
  struct Pair {
    DType from, to;
  };
  const Pair pairs[] = {{DType::kFloat32, DType::kFloat16}, {DType::kFloat32, DType::kBFloat16},
                        {DType::kFloat16, DType::kFloat32}, {DType::kBFloat16, DType::kFloat32},
                        {DType::kFloat32, DType::kInt32},   {DType::kFloat32, DType::kInt64},
                        {DType::kInt64, DType::kFloat32},   {DType::kInt32, DType::kInt64},
                        {DType::kInt64, DType::kInt32},     {DType::kBool, DType::kFloat32},
                        {DType::kFloat32, DType::kBool},    {DType::kInt64, DType::kBool},
                        {DType::kFloat16, DType::kBFloat16}};
  for (const Pair& pair : pairs) {
    OneOp c;
    const HostTensor x = pair.from == DType::kBool ? random_int(pair.from, {33}, 0, 1)
                         : is_floating(pair.from)  ? random(pair.from, {33}, -50.0, 50.0)
                                                   : random_int(pair.from, {33}, -1000, 1000);
    const int64_t xi = c.add_input(x);
    const int64_t out = c.b.output(pair.to, {33});
    c.b.copy(xi, out, {33}, 0, {1}, 0, {1});
    const auto runs = run_three_ways(c.b, c.inputs);
    std::vector<double> want(33);
    for (size_t i = 0; i < want.size(); ++i) {
      want[i] = is_floating(pair.to)      ? round_to(pair.to, x.v[i])
                : pair.to == DType::kBool ? (x.v[i] != 0.0 ? 1.0 : 0.0)
                                          : std::trunc(x.v[i]);
    }
    expect_output(runs, 0, want, {0, 0},
                  std::string("cast ") + dtype_name(pair.from) + " -> " + dtype_name(pair.to));
  }
}

TEST_F(EngineGpu, CopyScalarEmptyAndRankEight) {
  OneOp c;
  const HostTensor scalar = random(DType::kFloat32, {});
  const HostTensor empty = random(DType::kFloat32, {0, 3});
  const Sizes big = {2, 1, 2, 1, 2, 1, 2, 3};
  const HostTensor r8 = random(DType::kFloat16, big);
  const int64_t a = c.add_input(scalar), e = c.add_input(empty), r = c.add_input(r8);
  const int64_t a_out = c.b.output(DType::kFloat32, {});
  const int64_t e_out = c.b.output(DType::kFloat32, {0, 3});
  const Sizes reversed(big.rbegin(), big.rend());
  const int64_t r_out = c.b.output(DType::kFloat16, reversed);
  c.b.copy(a, a_out, {}, 0, {}, 0, {});
  c.b.copy(e, e_out, {0, 3}, 0, {3, 1}, 0, {3, 1});
  const Sizes in_strides = strides_of(big);
  c.b.copy(r, r_out, reversed, 0, Sizes(in_strides.rbegin(), in_strides.rend()), 0,
           strides_of(reversed));
  const auto runs = run_three_ways(c.b, c.inputs);
  expect_output(runs, 0, scalar.v, {0, 0}, "rank-0 copy");
  expect_output(runs, 1, {}, {0, 0}, "empty copy");
  std::vector<double> want(static_cast<size_t>(numel(big)));
  for_each_index(reversed, [&](int64_t i, const Sizes& id) {
    want[i] = r8.v[dot(Sizes(id.rbegin(), id.rend()), in_strides)];
  });
  expect_output(runs, 2, want, {0, 0}, "rank-8 permute");
}

// ---------------------------------------------------------------------------------------------
// Embedding and fill.

TEST_F(EngineGpu, EmbeddingGathersRows) {
  for (DType index_dtype : {DType::kInt64, DType::kInt32}) {
    for (DType dtype : {DType::kFloat32, DType::kFloat16}) {
      for (int64_t dim : {8, 3}) {  // 8 fp32 = 32-byte rows (16-byte words); 3 = element moves
        OneOp c;
        const int64_t vocab = 10;
        const HostTensor table = random(dtype, {vocab, dim});
        const std::vector<uint8_t> tb = table.bytes();
        const int64_t wi = c.b.weight(dtype, {vocab, dim}, tb.data());
        const HostTensor idx = random_int(index_dtype, {6}, 0, vocab - 1);
        const int64_t ii = c.add_input(idx);
        const int64_t out = c.b.output(dtype, {6, dim});
        c.b.embedding(wi, ii, out, 6, dim, vocab);
        const auto runs = run_three_ways(c.b, c.inputs);
        std::vector<double> want(static_cast<size_t>(6 * dim));
        for (int64_t r = 0; r < 6; ++r)
          for (int64_t k = 0; k < dim; ++k)
            want[r * dim + k] = table.v[static_cast<int64_t>(idx.v[r]) * dim + k];
        expect_output(runs, 0, want, {0, 0}, "embedding");
      }
    }
  }
}

// A random fp32 [10, 4] embedding table, as a weight of `b`.
int64_t random_table(BlobBuilder& b, HostTensor& table) {
  table = random(DType::kFloat32, {10, 4});
  const std::vector<uint8_t> bytes = table.bytes();
  return b.weight(DType::kFloat32, {10, 4}, bytes.data());
}

TEST_F(EngineGpu, EmbeddingIndexOutOfRangeIsReportedAndTheEngineRecovers) {
  BlobBuilder b;
  HostTensor table;
  const int64_t wi = random_table(b, table);
  const int64_t ii = b.input(DType::kInt64, {3});
  const int64_t out = b.output(DType::kFloat32, {3, 4});
  b.embedding(wi, ii, out, 3, 4, 10);
  const std::vector<uint8_t> blob = b.build();
  auto engine = Engine::create(blob.data(), blob.size());
  ASSERT_TRUE(engine.ok()) << g_log;
  for (int round = 0; round < 3;
       ++round) {  // eager, then graph replays: the flag is reset each run
    for (int64_t bad : {int64_t{10}, int64_t{-1}}) {
      const int64_t indices[3] = {1, bad, 2};
      std::vector<float> result(12, -7.0f);
      const Binding in{const_cast<int64_t*>(indices), sizeof(indices), false};
      const Binding o{result.data(), result.size() * sizeof(float), false};
      g_log.clear();
      EXPECT_EQ((*engine)->execute(Span<const Binding>(&in, 1), Span<const Binding>(&o, 1)),
                Error::InvalidArgument);
      EXPECT_NE(g_log.find("embedding index out of range"), std::string::npos) << g_log;
      EXPECT_NE(g_log.find("index " + std::to_string(bad) + " at position 1"), std::string::npos)
          << g_log;
      const int64_t good[3] = {9, 0, 4};
      const Binding gin{const_cast<int64_t*>(good), sizeof(good), false};
      ASSERT_EQ((*engine)->execute(Span<const Binding>(&gin, 1), Span<const Binding>(&o, 1)),
                Error::Ok)
          << g_log;
      for (int r = 0; r < 3; ++r)
        for (int k = 0; k < 4; ++k)
          EXPECT_EQ(result[r * 4 + k], static_cast<float>(table.v[good[r] * 4 + k]));
    }
  }
}

// Embedding bags: every mode, Int64 and Int32 indices and offsets, a wide row (several words a
// thread), an empty bag, and the last offset closing the last bag or not (include_last_offset).
TEST_F(EngineGpu, EmbeddingBagSumMeanMaxEmptyBagsAndLastOffset) {
  const blob::BagMode modes[] = {blob::BagMode::kSum, blob::BagMode::kMean, blob::BagMode::kMax};
  for (DType index_dtype : {DType::kInt64, DType::kInt32}) {
    for (DType dtype : {DType::kFloat32, DType::kFloat16}) {
      for (int64_t dim : {5, 300}) {
        for (bool last_offset : {false, true}) {
          OneOp c;
          const int64_t vocab = 10, num_indices = 9;
          const HostTensor table = random(dtype, {vocab, dim});
          const std::vector<uint8_t> tb = table.bytes();
          const int64_t wi = c.b.weight(dtype, {vocab, dim}, tb.data());
          const HostTensor idx = random_int(index_dtype, {num_indices}, 0, vocab - 1);
          // Bags [0, 3), [3, 3) (empty), [3, 8), then [8, 9) closed by the last offset or by the
          // end of the indices.
          HostTensor off{index_dtype, {last_offset ? 5 : 4}, {0, 3, 3, 8}};
          if (last_offset) off.v.push_back(num_indices);
          const int64_t num_offsets = static_cast<int64_t>(off.v.size()), num_bags = 4;
          const int64_t ii = c.add_input(idx), oi = c.add_input(off);
          for (blob::BagMode mode : modes) {
            c.b.embedding_bag(wi, ii, oi, c.b.output(dtype, {num_bags, dim}), mode, num_indices,
                              num_offsets, num_bags, dim, vocab);
          }
          const auto runs = run_three_ways(c.b, c.inputs);
          const int64_t bounds[5] = {0, 3, 3, 8, num_indices};
          for (size_t m = 0; m < std::size(modes); ++m) {
            std::vector<double> want(static_cast<size_t>(num_bags * dim), 0.0);
            for (int64_t b = 0; b < num_bags; ++b) {
              for (int64_t k = 0; k < dim; ++k) {
                double acc = 0;
                for (int64_t j = bounds[b]; j < bounds[b + 1]; ++j) {
                  const double v = table.v[static_cast<int64_t>(idx.v[j]) * dim + k];
                  acc = modes[m] == blob::BagMode::kMax ? (j == bounds[b] ? v : std::max(acc, v))
                                                        : acc + v;
                }
                const int64_t count = bounds[b + 1] - bounds[b];
                if (modes[m] == blob::BagMode::kMean && count > 0) acc /= double(count);
                want[b * dim + k] = round_to(dtype, acc);
              }
            }
            expect_output(runs, m, want, tol_for(dtype, 8),
                          std::string(dtype_name(dtype)) + " embedding_bag mode " +
                              std::to_string(m) + " dim " + std::to_string(dim) +
                              (last_offset ? " last offset" : ""));
          }
        }
      }
    }
  }
}

TEST_F(EngineGpu, EmbeddingBagBadIndexOrOffsetIsReported) {
  BlobBuilder b;
  HostTensor table;
  const int64_t wi = random_table(b, table);
  const int64_t ii = b.input(DType::kInt64, {4});
  const int64_t oi = b.input(DType::kInt64, {2});
  const int64_t out = b.output(DType::kFloat32, {2, 4});
  b.embedding_bag(wi, ii, oi, out, blob::BagMode::kSum, 4, 2, 2, 4, 10);
  const std::vector<uint8_t> blob = b.build();
  auto engine = Engine::create(blob.data(), blob.size());
  ASSERT_TRUE(engine.ok()) << g_log;
  struct Bad {
    int64_t indices[4], offsets[2];
    const char* message;
  };
  const Bad cases[] = {{{1, 12, 2, 3}, {0, 2}, "index 12 at position 1 is outside [0, 10)"},
                       {{1, 2, 2, 3}, {0, 5}, "reaches offset 5, outside [0, 4]"},
                       {{1, 2, 2, 3}, {3, 1}, "bag 0 reaches offset 1"}};
  std::vector<float> result(8, -7.0f);
  const Binding o{result.data(), result.size() * sizeof(float), false};
  for (const Bad& bad : cases) {
    const Binding in[2] = {{const_cast<int64_t*>(bad.indices), sizeof(bad.indices), false},
                           {const_cast<int64_t*>(bad.offsets), sizeof(bad.offsets), false}};
    g_log.clear();
    EXPECT_EQ((*engine)->execute(Span<const Binding>(in, 2), Span<const Binding>(&o, 1)),
              Error::InvalidArgument);
    EXPECT_NE(g_log.find(bad.message), std::string::npos) << g_log;
  }
  const int64_t good_indices[4] = {9, 0, 4, 4}, good_offsets[2] = {0, 1};
  const Binding gin[2] = {{const_cast<int64_t*>(good_indices), sizeof(good_indices), false},
                          {const_cast<int64_t*>(good_offsets), sizeof(good_offsets), false}};
  ASSERT_EQ((*engine)->execute(Span<const Binding>(gin, 2), Span<const Binding>(&o, 1)),
            Error::Ok)
      << g_log;
  for (int k = 0; k < 4; ++k) {
    EXPECT_EQ(result[k], static_cast<float>(table.v[9 * 4 + k]));
    EXPECT_FLOAT_EQ(result[4 + k], static_cast<float>(table.v[k] + 2 * table.v[4 * 4 + k]));
  }
}

TEST_F(EngineGpu, FillEveryDtype) {
  struct Case {
    DType dtype;
    int64_t n;
    double value;
  };
  const Case cases[] = {{DType::kFloat32, 1000, 1.5}, {DType::kFloat32, 13, 0.0},
                        {DType::kInt64, 7, -3.0},     {DType::kInt32, 9, 123456.0},
                        {DType::kBool, 5, 1.0},       {DType::kFloat16, 33, 0.1},
                        {DType::kBFloat16, 64, -2.5}};
  OneOp c;
  for (const Case& fc : cases) c.b.fill(c.b.output(fc.dtype, {fc.n}), fc.value);
  const auto runs = run_three_ways(c.b, c.inputs);
  for (size_t k = 0; k < std::size(cases); ++k) {
    expect_output(runs, k,
                  std::vector<double>(static_cast<size_t>(cases[k].n),
                                      round_to(cases[k].dtype, cases[k].value)),
                  {0, 0}, std::string("fill ") + dtype_name(cases[k].dtype));
  }
}

}  // namespace
}  // namespace kiln::engine::gpu_test
