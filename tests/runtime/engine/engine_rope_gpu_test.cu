// kRope on a GPU against a host reference (engine_gpu_fixture.h says how): x read through a head
// transpose of its projection output with cos/sin broadcast over the heads, in every floating
// dtype; an odd half (head dim 10) with offsets into larger tensors; and a blob whose rotated
// size is odd, refused at engine creation.
#include "tests/runtime/engine/engine_gpu_fixture.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

namespace kiln::engine::gpu_test {
namespace {

// out[idx] = x*cos + rotate_half(x)*sin in float64, reading each operand at offset + idx.strides.
std::vector<double> rope_ref(const Sizes& sizes, const HostTensor& x, int64_t xo,
                             const Sizes& xs, const HostTensor& c, int64_t co, const Sizes& cs,
                             const HostTensor& s, int64_t so, const Sizes& ss) {
  const int64_t d = sizes.back(), h = d / 2, last = int64_t(sizes.size()) - 1;
  std::vector<double> want(size_t(numel(sizes)));
  for_each_index(sizes, [&](int64_t i, const Sizes& id) {
    const int64_t k = id.back();
    const int64_t partner = k < h ? h : -h;
    const double xv = x.v[size_t(xo + dot(id, xs))];
    const double other = x.v[size_t(xo + dot(id, xs) + partner * xs[size_t(last)])];
    const double rot = k < h ? -other : other;
    want[size_t(i)] = xv * c.v[size_t(co + dot(id, cs))] + rot * s.v[size_t(so + dot(id, ss))];
  });
  return want;
}

TEST_F(EngineGpu, RopeReadsTheProjectionThroughTheHeadTransposeEveryDtype) {
  for (DType dtype : {DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
    // x: a [1, S=6, H=3, D=8] projection output read as [1, H, S, D]; cos/sin [S, D] for every head.
    OneOp c;
    const HostTensor x = random(dtype, {1, 6, 3, 8});
    const HostTensor cs = random(dtype, {6, 8}, -1, 1), sn = random(dtype, {6, 8}, -1, 1);
    const int64_t xi = c.add_input(x), ci = c.add_input(cs), si = c.add_input(sn);
    const Sizes sizes = {1, 3, 6, 8}, xs = {144, 8, 24, 1}, ts = {0, 0, 8, 1};
    const int64_t out = c.b.output(dtype, sizes);
    c.b.rope(xi, ci, si, out, sizes, 0, xs, 0, ts, 0, ts);
    const auto runs = run_three_ways(c.b, c.inputs);
    expect_output(runs, 0, rope_ref(sizes, x, 0, xs, cs, 0, ts, sn, 0, ts), tol_for(dtype, 4.0),
                  std::string("rope ") + dtype_name(dtype));
  }
}

TEST_F(EngineGpu, RopeOddHalfWithOffsets) {
  // Head dim 10 (halves of 5: no vector path), x at offset 7 of a larger buffer with a gap
  // between rows, cos/sin slices of longer tables.
  OneOp c;
  const Sizes sizes = {2, 4, 10}, xs = {60, 12, 1}, ts = {0, 10, 1};
  const HostTensor x = random(DType::kFloat32, {7 + 120});
  const HostTensor cs = random(DType::kFloat32, {3 + 40}), sn = random(DType::kFloat32, {5 + 40});
  const int64_t xi = c.add_input(x), ci = c.add_input(cs), si = c.add_input(sn);
  const int64_t out = c.b.output(DType::kFloat32, sizes);
  c.b.rope(xi, ci, si, out, sizes, 7, xs, 3, ts, 5, ts);
  const auto runs = run_three_ways(c.b, c.inputs);
  expect_output(runs, 0, rope_ref(sizes, x, 7, xs, cs, 3, ts, sn, 5, ts),
                tol_for(DType::kFloat32, 4.0), "rope odd half with offsets");
}

TEST_F(EngineGpu, RopeWithAnOddRotatedSizeIsRefused) {
  BlobBuilder b;
  const int64_t x = b.input(DType::kFloat32, {2, 5});
  const int64_t cs = b.input(DType::kFloat32, {2, 5});
  const int64_t out = b.output(DType::kFloat32, {2, 5});
  b.rope(x, cs, cs, out, {2, 5}, 0, {5, 1}, 0, {5, 1}, 0, {5, 1});
  const std::vector<uint8_t> blob = b.build();
  g_log.clear();
  auto engine = Engine::create(blob.data(), blob.size());
  EXPECT_FALSE(engine.ok());
  EXPECT_NE(g_log.find("the rotated (last) size 5 must be even"), std::string::npos) << g_log;
}

}  // namespace
}  // namespace kiln::engine::gpu_test
