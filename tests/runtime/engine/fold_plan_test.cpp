// Which ops the engine runs inside another op's kernel, decided on the host from the graph alone.
// The GEMV folds (kernels/gemv.cuh): a layer norm or gated activation whose only reader is the
// next op's few-row matmul (a gated activation also before a quantized one) is folded; one whose
// output something else reads, or a delegate output, or a matmul the GEMV does not take, is not. The rope-and-append step
// (kernels/rope_append.cuh): a decoder layer's ropes and KV-cache writes in a row run as one, a
// rotated key going straight into the cache unless something else reads it. No GPU: the plan is
// made before any kernel runs.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

#include "format/blob_reader.h"
#include "format/quant_layout.h"
#include "runtime/engine/kernels/gemv.cuh"
#include "runtime/engine/kernels/rope_append.cuh"
#include "tests/format/blob_builder.h"

namespace kiln::engine {
namespace {

using blob::DType;
using testing::BlobBuilder;

// Why op `op` cannot fold into op op + 1's GEMV ("" when it can), every tensor 256-byte aligned.
std::string why_not(BlobBuilder& b, size_t op) {
  const std::vector<uint8_t> bytes = b.build();
  std::string why;
  auto graph = read_blob(bytes.data(), bytes.size(), &why);
  EXPECT_TRUE(graph.ok()) << why;
  if (!graph.ok()) return "unreadable";
  const std::vector<uint32_t> alignment(graph->tensors.size(), 256);
  AlgoCache algos;
  const InitContext ctx{*graph, op + 1, nullptr, nullptr, alignment, false, algos, nullptr};
  const char* reason = kernels::folded_gemv_unsupported(op, ctx);
  return reason == nullptr ? "" : reason;
}

// a [m, k] -> a matmul against a [16, k] bf16 weight, the graph's output.
void add_projection(BlobBuilder& b, int64_t a, int64_t m, int64_t k) {
  const int64_t n = 16;
  const std::vector<uint16_t> w(size_t(n * k), 0x3c00);
  BlobBuilder::Matmul mm;
  mm.a = a;
  mm.b = b.weight(DType::kBFloat16, {n, k}, w.data());
  mm.out = b.output(DType::kBFloat16, {m, n});
  mm.m = m, mm.n = n, mm.k = k, mm.trans_b = true;
  b.matmul(mm);
}

// x -> norm -> matmul against an [n, k] weight; `keep` also makes the norm's output an output.
struct NormThenMatmul {
  BlobBuilder b;
  int64_t normed;
  NormThenMatmul(int64_t m, int64_t k, bool keep, bool rms = true) {
    const std::vector<uint16_t> g(size_t(k), 0x3c00);
    const int64_t x = b.input(DType::kBFloat16, {m, k});
    const int64_t gamma = b.weight(DType::kBFloat16, {k}, g.data());
    normed = keep ? b.output(DType::kBFloat16, {m, k}) : b.arena(DType::kBFloat16, {m, k});
    b.layer_norm(x, gamma, -1, normed, m, k, 1e-5, rms);
    add_projection(b, normed, m, k);
  }
};

TEST(FoldPlan, NormBeforeAFewRowMatmulFoldsWhenAskedTo) {
  NormThenMatmul off(1, 2048, false);
  EXPECT_EQ(why_not(off.b, 0), "KILN_GEMV_NORM is not on");   // the default
  setenv("KILN_GEMV_NORM", "on", 1);
  NormThenMatmul one(1, 2048, false);
  EXPECT_EQ(why_not(one.b, 0), "");
  NormThenMatmul layer(3, 64, false, false);
  EXPECT_EQ(why_not(layer.b, 0), "");
  unsetenv("KILN_GEMV_NORM");
}

TEST(FoldPlan, NormWhoseOutputIsKeptOrTooManyRowsStaysApart) {
  setenv("KILN_GEMV_NORM", "on", 1);
  NormThenMatmul kept(1, 2048, true);
  EXPECT_NE(why_not(kept.b, 0), "");
  NormThenMatmul rows(32, 64, false);   // 32 rows: cuBLASLt's matmul, not the GEMV
  EXPECT_NE(why_not(rows.b, 0), "");
  NormThenMatmul narrow(1, 20, false);  // 40-byte rows: the GEMV's element-wise loop
  EXPECT_EQ(why_not(narrow.b, 0), "the norm's rows are not whole 16-byte vectors");
  unsetenv("KILN_GEMV_NORM");
}

TEST(FoldPlan, NormReadByALaterOpStaysApart) {
  setenv("KILN_GEMV_NORM", "on", 1);
  NormThenMatmul c(1, 256, false);
  const int64_t again = c.b.output(DType::kBFloat16, {1, 256});
  c.b.unary(blob::UnaryKind::kRelu, c.normed, again);
  EXPECT_EQ(why_not(c.b, 0), "the op's output is read by another op");
  unsetenv("KILN_GEMV_NORM");
}

// act(g) * u over [m, k] bf16 inputs into an arena tensor (returned), the product's activation
// result first; `gate_first`: g is input 0.
int64_t add_gate(BlobBuilder& b, int64_t m, int64_t k, bool gate_first) {
  using Instr = BlobBuilder::Instr;
  const int64_t first = b.input(DType::kBFloat16, {m, k}), second = b.input(DType::kBFloat16, {m, k});
  const int64_t gated = b.arena(DType::kBFloat16, {m, k});
  const int64_t act_src = gate_first ? 0 : 1;
  b.fused(gated, {m, k}, {first, second}, {{k, 1}, {k, 1}},
          {Instr{blob::FusedForm::kUnary, int64_t(blob::UnaryKind::kSilu), act_src, -1, -1, 0.0,
                 0.0, DType::kBFloat16},
           Instr{blob::FusedForm::kBinary, int64_t(blob::BinaryKind::kMul), 2, 1 - act_src, -1,
                 1.0, 0.0, DType::kBFloat16}});
  return gated;
}

// The gate, then the down projection.
std::string glu_why_not(int64_t m, int64_t k, bool gate_first) {
  BlobBuilder b;
  const int64_t gated = add_gate(b, m, k, gate_first);
  add_projection(b, gated, m, k);
  return why_not(b, 0);
}

// The same gate before a quantized down projection ([16, k] int8 per channel or int4 in groups
// of 32) with m rows.
std::string quant_glu_why_not(int64_t m, int64_t k, int64_t bits, bool gate_first = true) {
  BlobBuilder b;
  const int64_t gated = add_gate(b, m, k, gate_first);
  const int64_t n = 16, group = bits == 8 ? k : 32;
  const std::vector<int32_t> words(size_t(n * blob::quant_row_words(k, bits)), 0);
  const std::vector<float> scales(size_t(n * (k / group)), 1.0f);
  BlobBuilder::QuantMatmul q;
  q.x = gated;
  q.weight = b.weight(DType::kInt32, {n, blob::quant_row_words(k, bits)}, words.data());
  q.scales = b.weight(DType::kFloat32, {n, k / group}, scales.data());
  q.out = b.output(DType::kBFloat16, {m, n});
  q.m = m, q.n = n, q.k = k, q.bits = bits, q.group_size = group;
  b.quant_matmul(q);
  return why_not(b, 0);
}

TEST(FoldPlan, GatedActivationBeforeAQuantizedDownProjectionFolds) {
  EXPECT_EQ(quant_glu_why_not(1, 8192, 8), "");
  EXPECT_EQ(quant_glu_why_not(1, 8192, 4, false), "");
  EXPECT_EQ(quant_glu_why_not(16, 64, 4), "");
  // 17 rows: the dequantized chunks through cuBLASLt, which stage nothing.
  EXPECT_EQ(quant_glu_why_not(17, 64, 8), "not the decode kernel's M <= 16 rows");
  setenv("KILN_GEMV_GLU", "off", 1);
  EXPECT_EQ(quant_glu_why_not(1, 8192, 8), "KILN_GEMV_GLU=off");
  unsetenv("KILN_GEMV_GLU");
}

TEST(FoldPlan, GatedActivationBeforeTheDownProjectionFolds) {
  EXPECT_EQ(glu_why_not(1, 8192, true), "");
  EXPECT_EQ(glu_why_not(2, 64, false), "");
  EXPECT_EQ(glu_why_not(1, 12, false), "");   // the element-wise loop stages it too
  EXPECT_EQ(glu_why_not(2, 8192, true), "the activations exceed the staging space");
  setenv("KILN_GEMV_GLU", "off", 1);
  EXPECT_EQ(glu_why_not(1, 8192, true), "KILN_GEMV_GLU=off");
  unsetenv("KILN_GEMV_GLU");
}

// A decode step's rotary embedding and cache writes: qkv [1, S, (H + 2 * KV) * D] read as q and k
// heads, both rotated, k's rows and v's written at S positions into caches [1, KV, 16, D]; q's
// rotated rows are copied out. keep_k: k's rotated rows are an output too. one_cache: v goes into
// k's cache.
struct RopeAppendLayer {
  static constexpr int64_t kHeads = 4, kKv = 2, kDim = 8, kLen = 16;
  BlobBuilder b;
  explicit RopeAppendLayer(int64_t s = 1, bool keep_k = false, bool one_cache = false) {
    const DType bf16 = DType::kBFloat16;
    const int64_t w = (kHeads + 2 * kKv) * kDim;
    const int64_t qkv = b.input(bf16, {1, s, w});
    const int64_t cs = b.input(bf16, {s, kDim}), sn = b.input(bf16, {s, kDim});
    const int64_t pos = b.input(DType::kInt64, {s});
    const int64_t v = b.input(bf16, {1, kKv, s, kDim});
    const std::vector<uint16_t> zeros(size_t(kKv * kLen * kDim), 0);
    const int64_t kc = b.state(bf16, {1, kKv, kLen, kDim}, zeros.data());
    const int64_t vc = one_cache ? kc : b.state(bf16, {1, kKv, kLen, kDim}, zeros.data());
    const int64_t q_rot = b.arena(bf16, {1, kHeads, s, kDim});
    const int64_t k_rot = keep_k ? b.output(bf16, {1, kKv, s, kDim}) : b.arena(bf16, {1, kKv, s, kDim});
    const Sizes xs = {s * w, kDim, w, 1}, ts = {0, 0, kDim, 1};
    b.rope(qkv, cs, sn, q_rot, {1, kHeads, s, kDim}, 0, xs, 0, ts, 0, ts);
    b.rope(qkv, cs, sn, k_rot, {1, kKv, s, kDim}, kHeads * kDim, xs, 0, ts, 0, ts);
    b.index_put(k_rot, pos, kc, kKv, kLen, kDim, s);
    b.index_put(v, pos, vc, kKv, kLen, kDim, s);
    const int64_t q_out = b.output(bf16, {kHeads * s * kDim});
    b.copy(q_rot, q_out, {kHeads * s * kDim}, 0, {1}, 0, {1});
  }
  using Sizes = std::vector<int64_t>;

  // rope_append_length at op 0, and why all four ops cannot run as one ("" when they can).
  std::pair<size_t, std::string> plan() {
    const std::vector<uint8_t> bytes = b.build();
    std::string why;
    auto graph = read_blob(bytes.data(), bytes.size(), &why);
    EXPECT_TRUE(graph.ok()) << why;
    if (!graph.ok()) return {0, "unreadable"};
    const std::vector<uint32_t> alignment(graph->tensors.size(), 256);
    AlgoCache algos;
    const InitContext ctx{*graph, 0, nullptr, nullptr, alignment, false, algos, nullptr};
    const char* reason = kernels::rope_append_unsupported(4, ctx);
    return {kernels::rope_append_length(ctx), reason == nullptr ? "" : reason};
  }
};

TEST(RopeAppendPlan, DecoderLayerRopesAndCacheWritesRunAsOneStep) {
  EXPECT_EQ(RopeAppendLayer(1).plan(), std::make_pair(size_t(4), std::string()));
  EXPECT_EQ(RopeAppendLayer(128).plan(), std::make_pair(size_t(4), std::string()));  // a prefill
}

TEST(RopeAppendPlan, KeyReadElsewhereIsNotRoutedSoItsWriteStaysApart) {
  // k's rotated rows are an output: the rope writes them and the cache write reads them.
  EXPECT_EQ(RopeAppendLayer(1, true).plan(),
            std::make_pair(size_t(2), std::string("an op reads or writes what another op of the group writes")));
}

TEST(RopeAppendPlan, TwoWritesIntoOneStateStayApart) {
  EXPECT_EQ(RopeAppendLayer(1, false, true).plan(),
            std::make_pair(size_t(3), std::string("an op reads or writes what another op of the group writes")));
}

TEST(RopeAppendPlan, ManyPositionsOrTurnedOff) {
  EXPECT_EQ(RopeAppendLayer(1025).plan(),
            std::make_pair(size_t(2), std::string("an index_put of over 1024 positions")));
  setenv("KILN_ROPE_APPEND", "off", 1);
  EXPECT_EQ(RopeAppendLayer(1).plan(), std::make_pair(size_t(0), std::string("KILN_ROPE_APPEND=off")));
  unsetenv("KILN_ROPE_APPEND");
}

}  // namespace
}  // namespace kiln::engine
