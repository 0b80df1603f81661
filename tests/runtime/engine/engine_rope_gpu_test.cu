// kRope on a GPU against a host reference (engine_gpu_fixture.h says how): x read through a head
// transpose of its projection output with cos/sin broadcast over the heads, in every floating
// dtype; an odd half (head dim 10) with offsets into larger tensors; a blob whose rotated size is
// odd, refused at engine creation; and a decoder layer's ropes and KV-cache writes, run as one
// rope-and-append step and apart (KILN_ROPE_APPEND=off), with a bad position that writes nothing.
#include "tests/runtime/engine/engine_gpu_fixture.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
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

// A decoder layer's rope and cache writes: qkv [1, S, (H + 2 * KV) * D] with q and k heads rotated
// (q's rows an output), k's rotated rows and v [1, KV, S, D] written at positions [S] into caches
// [1, KV, L, D] that start as `k0` / `v0`; both caches copied out after.
struct Layer {
  static constexpr int64_t H = 4, KV = 2, D = 16, L = 12;
  DType dtype, pos_dtype;
  int64_t s;
  HostTensor qkv, cs, sn, v, k0, v0;
  Layer(DType dt, DType pdt, int64_t seq)
      : dtype(dt), pos_dtype(pdt), s(seq), qkv(random(dt, {1, seq, (H + 2 * KV) * D})),
        cs(random(dt, {seq, D}, -1, 1)), sn(random(dt, {seq, D}, -1, 1)),
        v(random(dt, {1, KV, seq, D})), k0(random(dt, {1, KV, L, D})),
        v0(random(dt, {1, KV, L, D})) {}

  Sizes x_strides() const { return {s * (H + 2 * KV) * D, D, (H + 2 * KV) * D, 1}; }

  std::vector<uint8_t> blob() const {
    BlobBuilder b;
    const int64_t x = b.input(dtype, qkv.sizes), c = b.input(dtype, cs.sizes);
    const int64_t si = b.input(dtype, sn.sizes), pos = b.input(pos_dtype, {s});
    const int64_t vi = b.input(dtype, v.sizes);
    const std::vector<uint8_t> kb = k0.bytes(), vb = v0.bytes();
    const int64_t kc = b.state(dtype, k0.sizes, kb.data()), vc = b.state(dtype, v0.sizes, vb.data());
    const int64_t q_rot = b.output(dtype, {1, H, s, D});
    const int64_t k_rot = b.arena(dtype, {1, KV, s, D});
    const Sizes ts = {0, 0, D, 1};
    b.rope(x, c, si, q_rot, {1, H, s, D}, 0, x_strides(), 0, ts, 0, ts);
    b.rope(x, c, si, k_rot, {1, KV, s, D}, H * D, x_strides(), 0, ts, 0, ts);
    b.index_put(k_rot, pos, kc, KV, L, D, s);
    b.index_put(vi, pos, vc, KV, L, D, s);
    const int64_t k_out = b.output(dtype, k0.sizes), v_out = b.output(dtype, v0.sizes);
    b.copy(kc, k_out, {KV * L * D}, 0, {1}, 0, {1});
    b.copy(vc, v_out, {KV * L * D}, 0, {1}, 0, {1});
    return b.build();
  }

  std::vector<HostTensor> inputs(const std::vector<int64_t>& positions) const {
    HostTensor p{pos_dtype, {s}, {}};
    for (int64_t q : positions) p.v.push_back(double(q));
    return {qkv, cs, sn, p, v};
  }

  // q's rotated rows, and the caches with k's rotated rows (rounded to the dtype, as the rope's
  // output is) and v's rows at the positions.
  std::vector<std::vector<double>> want(const std::vector<int64_t>& positions) const {
    const Sizes ts = {0, 0, D, 1};
    const std::vector<double> q = rope_ref({1, H, s, D}, qkv, 0, x_strides(), cs, 0, ts, sn, 0, ts);
    const std::vector<double> k =
        rope_ref({1, KV, s, D}, qkv, H * D, x_strides(), cs, 0, ts, sn, 0, ts);
    std::vector<double> kc = k0.v, vc = v0.v;
    for (int64_t o = 0; o < KV; ++o) {
      for (int64_t i = 0; i < s; ++i) {
        for (int64_t d = 0; d < D; ++d) {
          const size_t at = size_t((o * L + positions[size_t(i)]) * D + d);
          kc[at] = round_to(dtype, k[size_t((o * s + i) * D + d)]);
          vc[at] = v.v[size_t((o * s + i) * D + d)];
        }
      }
    }
    return {q, kc, vc};
  }
};

TEST_F(EngineGpu, DecoderRopesAndCacheWritesAsOneStepAndApart) {
  for (const char* mode : {"on", "off"}) {
    setenv("KILN_ROPE_APPEND", mode, 1);
    for (DType dtype : {DType::kBFloat16, DType::kFloat32}) {
      for (DType pos_dtype : {DType::kInt64, DType::kInt32}) {
        for (int64_t s : {int64_t{1}, int64_t{3}}) {
          const Layer layer(dtype, pos_dtype, s);
          const std::vector<int64_t> positions =
              s == 1 ? std::vector<int64_t>{7} : std::vector<int64_t>{5, 0, Layer::L - 1};
          const std::vector<uint8_t> blob = layer.blob();
          auto engine = Engine::create(blob.data(), blob.size());
          ASSERT_TRUE(engine.ok()) << g_log;
          EXPECT_EQ((*engine)->folded_ops(), std::string(mode) == "on" ? 3u : 0u);
          const std::string what = std::string("rope+append ") + mode + " " + dtype_name(dtype) +
                                   " " + dtype_name(pos_dtype) + " S=" + std::to_string(s);
          const Outputs out = run_host(**engine, layer.inputs(positions));
          const auto want = layer.want(positions);
          ASSERT_EQ(out.size(), 3u);
          for (size_t o = 0; o < 3; ++o) {
            expect_output({out}, o, want[o], tol_for(dtype, 4.0), what + " output " + std::to_string(o));
          }
          // Again (a CUDA-graph replay): the same rows written over themselves.
          const Outputs again = run_host(**engine, layer.inputs(positions));
          for (size_t o = 0; o < 3; ++o) {
            expect_output({again}, o, want[o], tol_for(dtype, 4.0), what + " replay " + std::to_string(o));
          }
        }
      }
    }
  }
  unsetenv("KILN_ROPE_APPEND");
}

TEST_F(EngineGpu, RopeAndAppendWithABadPositionWritesNoRow) {
  const Layer layer(DType::kBFloat16, DType::kInt64, 3);
  const std::vector<uint8_t> blob = layer.blob();
  auto engine = Engine::create(blob.data(), blob.size());
  ASSERT_TRUE(engine.ok()) << g_log;
  ASSERT_EQ((*engine)->folded_ops(), 3u);
  const Outputs before = run_host(**engine, layer.inputs({2, 3, 4}));
  for (int round = 0; round < 2; ++round) {   // eager, then replayed
    const std::vector<HostTensor> in = layer.inputs({6, Layer::L, 1});
    std::vector<std::vector<uint8_t>> bytes;
    std::vector<Binding> ins, outs;
    for (const HostTensor& t : in) {
      bytes.push_back(t.bytes());
      ins.push_back({bytes.back().data(), bytes.back().size(), false});
    }
    std::vector<std::vector<uint8_t>> out_bytes;
    for (size_t o = 0; o < 3; ++o) out_bytes.emplace_back((*engine)->output(o).nbytes, uint8_t{0xFF});
    for (auto& ob : out_bytes) outs.push_back({ob.data(), ob.size(), false});
    g_log.clear();
    EXPECT_EQ((*engine)->execute(Span<const Binding>(ins.data(), ins.size()),
                                 Span<const Binding>(outs.data(), outs.size())),
              Error::InvalidArgument);
    EXPECT_NE(g_log.find("op 2 (index_put): position 12 (element 1"), std::string::npos) << g_log;
    // Neither cache changed: both are still exactly those the good run left.
    for (size_t o = 1; o < 3; ++o) {
      const IoSpec spec = (*engine)->output(o);
      const HostTensor got = HostTensor::decode(spec.dtype, Sizes(spec.sizes, spec.sizes + spec.rank),
                                                out_bytes[o].data());
      EXPECT_EQ(got.v, before[o].v) << "cache " << o << " round " << round;
    }
  }
}

}  // namespace
}  // namespace kiln::engine::gpu_test
