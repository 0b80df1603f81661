// Identity ops and norm weight folding: the bf16 RMSNorm shape after precision conversion
// (copy bf16->bf16, kLayerNorm, copy bf16->bf16, multiply by the weight) becomes one kLayerNorm
// carrying the weight; copies that change anything, or whose operand is written later, stay.
#include <gtest/gtest.h>

#include "builder/src/passes.h"
#include "ir_writer.h"

namespace kiln::builder {
namespace {

using namespace kiln::builder::testing;

Op copy(int64_t x, int64_t out, int64_t n, int64_t in_offset = 0) {
  return make_op(blob::Opcode::kCopy, {{x}, {out}, {1}, {n}, {in_offset}, {1}, {0}, {1}});
}

Op norm(int64_t x, int64_t out, int64_t rows, int64_t cols) {
  return make_op(blob::Opcode::kLayerNorm, {{x}, {kNoTensor}, {kNoTensor}, {out}, {rows}, {cols},
                                            {double_bits(1e-6)}, {1}});
}

Op scale(int64_t a, int64_t b, int64_t out, double scalar, std::vector<int64_t> sizes,
         std::vector<int64_t> b_strides) {
  const int64_t rank = int64_t(sizes.size());
  std::vector<int64_t> a_strides(sizes.size(), 1);
  for (size_t d = sizes.size() - 1; d-- > 0;) a_strides[d] = a_strides[d + 1] * sizes[d + 1];
  return make_op(blob::Opcode::kBinary, {{int64_t(blob::BinaryKind::kMul)}, {a}, {b}, {out},
                                         {double_bits(1.0)}, {double_bits(scalar)}, {rank}, sizes,
                                         a_strides, b_strides});
}

// x [2, 4] -> copy -> rms norm -> copy -> * w (per column) -> out.
struct NormGraph {
  Graph g;
  int64_t x, w, out;
};

NormGraph bf16_rms_norm() {
  NormGraph n;
  Graph& g = n.g;
  n.x = input(g, {2, 4}, 0);
  n.w = weight(g, {1, 2, 3, 4}, {4});
  auto t = [&](const char* name) { return g.add_tensor(blob::DType::kFloat32, {2, 4}, name); };
  const int64_t up = t("up"), normed = t("normed"), down = t("down");
  n.out = t("out");
  g.ops = {copy(n.x, up, 8), norm(up, normed, 2, 4), copy(normed, down, 8),
           scale(down, n.w, n.out, 0.0, {2, 4}, {0, 1})};
  g.outputs = {n.out};
  return n;
}

TEST(DropIdentityOps, CastsVanishAndTheNormTakesTheWeight) {
  NormGraph n = bf16_rms_norm();
  drop_identity_ops(n.g);
  ASSERT_EQ(n.g.ops.size(), 2u);
  EXPECT_EQ(n.g.ops[0].opcode, blob::Opcode::kLayerNorm);
  EXPECT_EQ(n.g.root(n.g.ops[0].at("x")), n.x);
  fold_norm_weights(n.g);
  ASSERT_EQ(n.g.ops.size(), 1u);
  const Op& op = n.g.ops[0];
  EXPECT_EQ(op.opcode, blob::Opcode::kLayerNorm);
  EXPECT_EQ(op.at("weight"), n.w);
  EXPECT_EQ(op.out(), n.out);
  finish_and_read_back(n.g);
}

TEST(DropIdentityOps, MultiplyByOneIsAView) {
  Graph g;
  const int64_t x = input(g, {8}, 0);
  const int64_t y = g.add_tensor(blob::DType::kFloat32, {8}, "y");
  const int64_t z = g.add_tensor(blob::DType::kFloat32, {8}, "z");
  g.ops = {scale(x, kNoTensor, y, 1.0, {8}, {0}), make_op(blob::Opcode::kUnary,
           {{int64_t(blob::UnaryKind::kNeg)}, {y}, {z}, {0}, {0}})};
  g.outputs = {z};
  drop_identity_ops(g);
  ASSERT_EQ(g.ops.size(), 1u);
  EXPECT_EQ(g.root(g.ops[0].at("x")), x);
  // By 2 it is arithmetic.
  g.ops.insert(g.ops.begin(), scale(x, kNoTensor, y, 2.0, {8}, {0}));
  g.tensors[size_t(y)].alias_of = kNoTensor;
  drop_identity_ops(g);
  EXPECT_EQ(g.ops.size(), 2u);
}

TEST(DropIdentityOps, CopiesThatChangeSomethingStay) {
  // A dtype change, an offset read, a partial write (half of a concat), a graph output.
  Graph g;
  const int64_t x = input(g, {8}, 0);
  const int64_t half = g.add_tensor(blob::DType::kBFloat16, {8}, "half");
  const int64_t shifted = g.add_tensor(blob::DType::kFloat32, {4}, "shifted");
  const int64_t cat = g.add_tensor(blob::DType::kFloat32, {16}, "cat");
  const int64_t out = g.add_tensor(blob::DType::kFloat32, {8}, "out");
  g.ops = {copy(x, half, 8), copy(x, shifted, 4, 4), copy(x, cat, 8),
           make_op(blob::Opcode::kCopy, {{x}, {cat}, {1}, {8}, {0}, {1}, {8}, {1}}), copy(x, out, 8)};
  g.outputs = {half, shifted, cat, out};
  drop_identity_ops(g);
  EXPECT_EQ(g.ops.size(), 5u);
}

TEST(DropIdentityOps, ASourceWrittenAfterTheCopyKeepsTheCopy) {
  // y = copy(state); state updated in place; out = y + 0: y must hold the old values.
  Graph g;
  const int64_t state = g.add_tensor(blob::DType::kFloat32, {8}, "state");
  g.tensors[size_t(state)].storage = blob::Storage::kState;
  g.tensors[size_t(state)].has_data = true;
  g.tensors[size_t(state)].data.assign(32, 0);
  const int64_t x = input(g, {8}, 0);
  const int64_t y = g.add_tensor(blob::DType::kFloat32, {8}, "y");
  const int64_t out = g.add_tensor(blob::DType::kFloat32, {8}, "out");
  g.ops = {copy(state, y, 8), copy(x, state, 8),
           make_op(blob::Opcode::kUnary, {{int64_t(blob::UnaryKind::kNeg)}, {y}, {out}, {0}, {0}})};
  g.outputs = {out};
  drop_identity_ops(g);
  EXPECT_EQ(g.ops.size(), 3u);
}

// A decoder token's merged gate/up projection: mm -> [1, 16], copies of columns 0..7 and 8..15,
// neg of each. Both copies become views: the first at the merged result's start, the second 8
// elements (32 bytes) into it.
Op neg(int64_t x, int64_t out) {
  return make_op(blob::Opcode::kUnary, {{int64_t(blob::UnaryKind::kNeg)}, {x}, {out}, {0}, {0}});
}

TEST(ViewContiguousCopies, ABlockOfAMergedProjectionIsAViewInsideIt) {
  Graph g;
  const int64_t x = input(g, {16}, 0);
  const int64_t merged = g.add_tensor(blob::DType::kFloat32, {1, 16}, "merged");
  const int64_t gate = g.add_tensor(blob::DType::kFloat32, {1, 8}, "gate");
  const int64_t up = g.add_tensor(blob::DType::kFloat32, {1, 8}, "up");
  const int64_t a = g.add_tensor(blob::DType::kFloat32, {1, 8}, "a");
  const int64_t b = g.add_tensor(blob::DType::kFloat32, {1, 8}, "b");
  g.ops = {neg(x, merged), copy(merged, gate, 8, 0), copy(merged, up, 8, 8), neg(gate, a),
           neg(up, b)};
  g.outputs = {a, b};
  view_contiguous_copies(g);
  ASSERT_EQ(g.ops.size(), 3u);
  EXPECT_EQ(g.tensors[size_t(gate)].alias_of, merged);
  EXPECT_EQ(g.view_offset(gate), 0u);
  EXPECT_EQ(g.tensors[size_t(up)].alias_of, merged);
  EXPECT_EQ(g.view_offset(up), 32u);
  EXPECT_EQ(g.root(g.ops[2].at("x")), merged);
  bind_outputs(g);
  compact(g);
  plan_memory(g);
  // The view's record starts 32 bytes into the merged tensor's arena bytes.
  std::vector<uint8_t> bytes = write_blob(g);
  std::string why;
  auto blob = kiln::engine::read_blob(bytes.data(), bytes.size(), &why);
  ASSERT_TRUE(blob.ok()) << why;
  const auto& tensors = blob.get().tensors;
  const int64_t m = g.root(g.ops[1].at("x")), u = g.ops[2].at("x");
  EXPECT_EQ(tensors[size_t(u)].offset, tensors[size_t(m)].offset + 32);
  EXPECT_EQ(tensors[size_t(u)].nbytes, 32u);
  EXPECT_EQ(tensors[size_t(g.ops[1].at("x"))].offset, tensors[size_t(m)].offset);
}

TEST(ViewContiguousCopies, CopiesThatAreNoContiguousBlockStay) {
  // A strided read, a dtype change, a source written after the copy, a graph output, an input
  // as the source.
  Graph g;
  const int64_t x = input(g, {16}, 0);
  const int64_t m = g.add_tensor(blob::DType::kFloat32, {16}, "m");
  const int64_t strided = g.add_tensor(blob::DType::kFloat32, {4}, "strided");
  const int64_t half = g.add_tensor(blob::DType::kBFloat16, {4}, "half");
  const int64_t late = g.add_tensor(blob::DType::kFloat32, {4}, "late");
  const int64_t out = g.add_tensor(blob::DType::kFloat32, {4}, "out");
  const int64_t from_input = g.add_tensor(blob::DType::kFloat32, {4}, "from_input");
  const int64_t r1 = g.add_tensor(blob::DType::kFloat32, {4}, "r1");
  const int64_t r2 = g.add_tensor(blob::DType::kFloat32, {4}, "r2");
  const int64_t r3 = g.add_tensor(blob::DType::kFloat32, {4}, "r3");
  const int64_t r4 = g.add_tensor(blob::DType::kFloat32, {4}, "r4");
  g.ops = {neg(x, m),
           make_op(blob::Opcode::kCopy, {{m}, {strided}, {1}, {4}, {1}, {2}, {0}, {1}}),
           copy(m, half, 4, 4), copy(m, late, 4, 8), copy(m, out, 4, 12), copy(x, from_input, 4, 4),
           neg(x, m), neg(strided, r1), neg(half, r2), neg(late, r3), neg(from_input, r4)};
  g.outputs = {out, r1, r2, r3, r4};
  const size_t before = g.ops.size();
  view_contiguous_copies(g);
  EXPECT_EQ(g.ops.size(), before);
}

TEST(FoldNormWeights, ANormWithAnotherReaderKeepsItsMultiply) {
  NormGraph n = bf16_rms_norm();
  drop_identity_ops(n.g);
  n.g.outputs.push_back(n.g.ops[0].out());   // the unweighted norm is also an output
  fold_norm_weights(n.g);
  EXPECT_EQ(n.g.ops.size(), 2u);
}

}  // namespace
}  // namespace kiln::builder

namespace kiln::builder {
namespace {

using namespace kiln::builder::testing;

Op strided_copy(int64_t x, int64_t out, std::vector<int64_t> sizes, int64_t in_offset,
                std::vector<int64_t> in_strides) {
  std::vector<int64_t> out_strides(sizes.size(), 1);
  for (size_t d = sizes.size(); d-- > 1;) out_strides[d - 1] = out_strides[d] * sizes[d];
  const int64_t rank = int64_t(sizes.size());
  return make_op(blob::Opcode::kCopy,
                 {{x}, {out}, {rank}, sizes, {in_offset}, in_strides, {0}, out_strides});
}

TEST(ComposeCopies, PatchEmbeddingReadsTheConvolutionsNhwcResultDirectly) {
  // conv result [1, 4, 2, 2] stored NHWC -> NCHW copy -> viewed [1, 4, 4] and transposed to
  // [1, 4 (h*w), 4 (c)]: that is the NHWC memory itself.
  Graph g;
  const int64_t x = input(g, {1, 4, 2, 2}, 0);
  const int64_t nchw = g.add_tensor(blob::DType::kFloat32, {1, 4, 2, 2}, "nchw");
  const int64_t tokens = g.add_tensor(blob::DType::kFloat32, {1, 4, 4}, "tokens");
  g.ops = {strided_copy(x, nchw, {1, 4, 2, 2}, 0, {16, 1, 8, 4}),
           strided_copy(nchw, tokens, {1, 4, 4}, 0, {16, 1, 4})};
  g.outputs = {tokens};
  compose_copies(g);
  ASSERT_EQ(g.ops.size(), 1u);
  EXPECT_EQ(g.ops[0].at("x"), x);
  EXPECT_EQ(g.ops[0].at("in_offset"), 0);
  EXPECT_EQ(g.ops[0].list("in_strides"), (std::vector<int64_t>{0, 4, 1}));
  finish_and_read_back(g);
}

TEST(ComposeCopies, AnOffsetReadMapsToTheSourcesOffset) {
  // mid = x^T ([3, 2] of a [2, 3] input); c2 reads mid's rows 1..2 ([2, 2] at offset 2).
  Graph g;
  const int64_t x = input(g, {2, 3}, 0);
  const int64_t mid = g.add_tensor(blob::DType::kFloat32, {3, 2}, "mid");
  const int64_t rows = g.add_tensor(blob::DType::kFloat32, {2, 2}, "rows");
  const int64_t other = g.add_tensor(blob::DType::kFloat32, {3, 2}, "other");
  g.ops = {strided_copy(x, mid, {3, 2}, 0, {1, 3}), strided_copy(mid, rows, {2, 2}, 2, {2, 1}),
           make_op(blob::Opcode::kUnary, {{int64_t(blob::UnaryKind::kNeg)}, {mid}, {other},
                                          {0}, {0}})};
  g.outputs = {rows, other};
  compose_copies(g);
  ASSERT_EQ(g.ops.size(), 3u);   // mid has another reader: its copy stays
  EXPECT_EQ(g.ops[1].at("x"), x);
  EXPECT_EQ(g.ops[1].at("in_offset"), 1);   // mid[1][0] = x[0][1]
  EXPECT_EQ(g.ops[1].list("in_strides"), (std::vector<int64_t>{1, 3}));
}

TEST(ComposeCopies, ReadsThatAreNoStridedViewOfTheSourceStay) {
  // Flattening a transpose is not strided in the source; two casts would round once.
  Graph g;
  const int64_t x = input(g, {2, 3}, 0);
  const int64_t mid = g.add_tensor(blob::DType::kFloat32, {3, 2}, "mid");
  const int64_t flat = g.add_tensor(blob::DType::kFloat32, {6}, "flat");
  g.ops = {strided_copy(x, mid, {3, 2}, 0, {1, 3}), strided_copy(mid, flat, {6}, 0, {1})};
  g.outputs = {flat};
  compose_copies(g);
  EXPECT_EQ(g.ops.size(), 2u);

  Graph h;
  const int64_t y = input(h, {4}, 0);
  const int64_t half = h.add_tensor(blob::DType::kBFloat16, {4}, "half");
  const int64_t back = h.add_tensor(blob::DType::kFloat32, {4}, "back");
  h.ops = {strided_copy(y, half, {4}, 0, {1}), strided_copy(half, back, {4}, 0, {1})};
  h.outputs = {back};
  compose_copies(h);
  EXPECT_EQ(h.ops.size(), 2u);
}

}  // namespace
}  // namespace kiln::builder
