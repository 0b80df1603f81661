// The RMSNorm fusion pass: the chain HF's LlamaRMSNorm exports as becomes one kLayerNorm with rms
// set, and a chain that differs anywhere (another reader, a different power, a broadcast that is
// not per row) is left as it was.
#include <gtest/gtest.h>

#include "builder/src/passes.h"
#include "ir_writer.h"

namespace kiln::builder {
namespace {

using namespace kiln::builder::testing;
using K = blob::BinaryKind;
using U = blob::UnaryKind;

struct Chain {
  double power = 2.0;
  bool weight = true;
  bool rstd_per_row = true;  // false: the rsqrt is read per column (not a norm)
  bool extra_reader = false;  // the mean is also a graph output
};

Op op_binary(K kind, int64_t a, int64_t b, int64_t out, double scalar,
             std::vector<int64_t> sizes, std::vector<int64_t> a_strides,
             std::vector<int64_t> b_strides) {
  const int64_t rank = int64_t(sizes.size());
  return make_op(blob::Opcode::kBinary, {{int64_t(kind)}, {a}, {b}, {out}, {double_bits(1.0)},
                                         {double_bits(scalar)}, {rank}, sizes, a_strides,
                                         b_strides});
}

// x [2, 3, 4] -> pow 2 -> mean over the last dim -> + 1e-6 -> rsqrt -> x * rstd (-> * w).
Graph rms_graph(const Chain& c) {
  Graph g;
  const int64_t x = input(g, {2, 3, 4}, 0);
  const int64_t w = weight(g, {1, 2, 3, 4}, {4});
  auto t = [&](std::vector<int64_t> shape, const char* name) {
    return g.add_tensor(blob::DType::kFloat32, shape, name);
  };
  const int64_t sq = t({2, 3, 4}, "sq"), mean = t({2, 3, 1}, "mean"), var = t({2, 3, 1}, "var");
  const int64_t rstd = t({2, 3, 1}, "rstd"), y = t({2, 3, 4}, "y"), out = t({2, 3, 4}, "out");
  g.ops.push_back(make_op(blob::Opcode::kUnary,
                          {{int64_t(U::kPowScalar)}, {x}, {sq}, {double_bits(c.power)}, {0}}));
  g.ops.push_back(make_op(blob::Opcode::kReduce,
                          {{int64_t(blob::ReduceKind::kMean)}, {sq}, {mean}, {6}, {4}, {1}}));
  g.ops.push_back(op_binary(K::kAdd, mean, kNoTensor, var, 1e-6, {6}, {1}, {0}));
  g.ops.push_back(unary(U::kRsqrt, var, rstd));
  g.ops.push_back(op_binary(K::kMul, x, rstd, y, 0.0, {2, 3, 4}, {12, 4, 1},
                            c.rstd_per_row ? std::vector<int64_t>{3, 1, 0}
                                           : std::vector<int64_t>{0, 0, 1}));
  if (c.weight) {
    g.ops.push_back(op_binary(K::kMul, w, y, out, 0.0, {2, 3, 4}, {0, 0, 1}, {12, 4, 1}));
  }
  g.outputs = {c.weight ? out : y};
  if (c.extra_reader) g.outputs.push_back(mean);
  return g;
}

TEST(FuseRmsNorms, LlamaChainBecomesOneRmsLayerNorm) {
  for (bool with_weight : {true, false}) {
    Chain c;
    c.weight = with_weight;
    Graph g = rms_graph(c);
    const int64_t out = g.outputs[0];
    fuse_rms_norms(g);
    ASSERT_EQ(g.ops.size(), 1u) << with_weight;
    const Op& op = g.ops[0];
    EXPECT_EQ(op.opcode, blob::Opcode::kLayerNorm);
    EXPECT_EQ(op.at("x"), g.inputs[0]);
    EXPECT_EQ(op.at("weight"), with_weight ? 1 : kNoTensor);
    EXPECT_EQ(op.at("bias"), kNoTensor);
    EXPECT_EQ(op.out(), out);
    EXPECT_EQ(op.at("rows"), 6);
    EXPECT_EQ(op.at("cols"), 4);
    EXPECT_DOUBLE_EQ(op.real("eps"), 1e-6);
    EXPECT_EQ(op.at("rms"), 1);
  }
}

TEST(FuseRmsNorms, OtherChainsAreLeftAsTheyAre) {
  Chain cube;
  cube.power = 3.0;
  Chain per_column;
  per_column.rstd_per_row = false;
  Chain shared_mean;
  shared_mean.extra_reader = true;
  for (const Chain& c : {cube, per_column, shared_mean}) {
    Graph g = rms_graph(c);
    const size_t before = g.ops.size();
    fuse_rms_norms(g);
    EXPECT_EQ(g.ops.size(), before);
    for (const Op& op : g.ops) EXPECT_NE(op.opcode, blob::Opcode::kLayerNorm);
  }
}

}  // namespace
}  // namespace kiln::builder
