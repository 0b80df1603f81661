// The convolution passes called directly: epilogue fusion into kConv2d and the channels-last
// layout pass (which ops follow NHWC, where the layout copies go, the KRSC weight bytes).
#include <gtest/gtest.h>

#include <cstring>

#include "builder/src/passes.h"
#include "ir_writer.h"

namespace kiln::builder {
namespace {

using namespace kiln::builder::testing;
using K = blob::BinaryKind;
using U = blob::UnaryKind;
using O = blob::Opcode;

int64_t arena(Graph& g, std::vector<int64_t> shape, const char* name) {
  return g.add_tensor(blob::DType::kFloat32, shape, name);
}

// A 3x3 (pad 1) or 1x1 convolution of [N, C_in, H, W] into [N, C_out, H, W].
Op conv(int64_t x, int64_t w, int64_t bias, int64_t out, std::vector<int64_t> s, int64_t c_out,
        int64_t k) {
  const int64_t pad = k / 2;
  return make_op(O::kConv2d, {{x},     {w},    {bias}, {out},   {s[0]}, {s[1]}, {s[2]}, {s[3]},
                              {c_out}, {k},    {k},    {1},     {1},    {pad},  {pad},  {1},
                              {1},     {1},    {s[2]}, {s[3]},  {0},    {kNoTensor}, {0}});
}

// A 1x1 convolution of delegate input 0 ([N, C, H, W] = s) into C channels, every weight 0.5;
// returns its result.
int64_t pointwise_conv(Graph& g, std::vector<int64_t> s) {
  const int64_t x = input(g, s, 0);
  const int64_t w = weight(g, std::vector<float>(size_t(s[1] * s[1]), 0.5f), {s[1], s[1], 1, 1});
  const int64_t y = arena(g, s, "y");
  g.ops.push_back(conv(x, w, kNoTensor, y, s, s[1], 1));
  return y;
}

Op clamp(int64_t x, int64_t out, double lo, double hi) {
  Op op = unary(U::kClamp, x, out);
  op.at("p0") = double_bits(lo);
  op.at("p1") = double_bits(hi);
  return op;
}

std::vector<float> floats(const Tensor& t) {
  std::vector<float> v(t.data.size() / sizeof(float));
  std::memcpy(v.data(), t.data.data(), t.data.size());
  return v;
}

TEST(ConvPasses, ResidualAddThenRelu6FuseIntoTheConvolution) {
  Graph g;
  const int64_t y = pointwise_conv(g, {1, 2, 3, 3});
  const int64_t r = input(g, {1, 2, 3, 3}, 1);
  const int64_t sum = arena(g, {1, 2, 3, 3}, "sum");
  const int64_t act = arena(g, {1, 2, 3, 3}, "act");
  g.ops.push_back(binary(K::kAdd, r, y, sum, 18));
  g.ops.push_back(clamp(sum, act, 0.0, 6.0));
  g.outputs = {act};
  fuse_conv_epilogues(g);
  ASSERT_EQ(g.ops.size(), 1u);
  EXPECT_EQ(g.ops[0].at("residual"), r);
  EXPECT_EQ(g.ops[0].at("epilogue"), int64_t(blob::Epilogue::kRelu6));
  EXPECT_EQ(g.root(g.outputs[0]), y);
  finish_and_read_back(g);
}

TEST(ConvPasses, TheExportsSiluDecompositionFoldsIntoTheConvolution) {
  // y * sigmoid(y) and sigmoid(y) * y both become silu(y), then the conv's epilogue.
  for (bool sigmoid_first : {false, true}) {
    Graph g;
    const int64_t y = pointwise_conv(g, {1, 2, 3, 3});
    const int64_t sig = arena(g, {1, 2, 3, 3}, "sig");
    const int64_t act = arena(g, {1, 2, 3, 3}, "act");
    g.ops.push_back(unary(U::kSigmoid, y, sig));
    g.ops.push_back(sigmoid_first ? binary(K::kMul, sig, y, act, 18)
                                  : binary(K::kMul, y, sig, act, 18));
    g.outputs = {act};
    fuse_silu(g);
    ASSERT_EQ(g.ops.size(), 2u);
    EXPECT_EQ(g.ops[1].opcode, O::kUnary);
    EXPECT_EQ(g.ops[1].at("kind"), int64_t(U::kSilu));
    EXPECT_EQ(g.ops[1].at("x"), y);
    fuse_conv_epilogues(g);
    ASSERT_EQ(g.ops.size(), 1u);
    EXPECT_EQ(g.ops[0].at("epilogue"), int64_t(blob::Epilogue::kSilu));
    finish_and_read_back(g);
  }
  // sigmoid(y) * z, or a sigmoid another op also reads, stays.
  Graph g;
  const int64_t y = pointwise_conv(g, {1, 2, 3, 3});
  const int64_t z = input(g, {1, 2, 3, 3}, 1);
  const int64_t sig = arena(g, {1, 2, 3, 3}, "sig");
  const int64_t act = arena(g, {1, 2, 3, 3}, "act");
  g.ops.push_back(unary(U::kSigmoid, y, sig));
  g.ops.push_back(binary(K::kMul, z, sig, act, 18));
  g.outputs = {act};
  fuse_silu(g);
  EXPECT_EQ(g.ops.size(), 3u);
  g.ops[2] = binary(K::kMul, y, sig, act, 18);
  g.outputs = {act, sig};
  fuse_silu(g);
  EXPECT_EQ(g.ops.size(), 3u);
}

TEST(ConvPasses, OtherClampsAndSharedResultsStayOps) {
  Graph g;
  const int64_t y = pointwise_conv(g, {1, 2, 3, 3});
  const int64_t act = arena(g, {1, 2, 3, 3}, "act");
  g.ops.push_back(clamp(y, act, 0.0, 5.0));
  g.outputs = {act};
  fuse_conv_epilogues(g);
  EXPECT_EQ(g.ops.size(), 2u);   // clamp(0, 5) is no epilogue
  g.ops[1] = unary(U::kSilu, y, act);
  g.outputs = {act, y};          // the conv result is an output too
  fuse_conv_epilogues(g);
  EXPECT_EQ(g.ops.size(), 2u);
  EXPECT_EQ(g.ops[0].at("epilogue"), int64_t(blob::Epilogue::kNone));
}

TEST(ChannelsLast, ConvNetStaysNhwcAndConvertsAtItsEdges) {
  Graph g;
  const int64_t x = input(g, {1, 2, 2, 3}, 0);
  std::vector<float> wv(3 * 2 * 3 * 3);
  for (size_t i = 0; i < wv.size(); ++i) wv[i] = float(i);
  const int64_t w1 = weight(g, wv, {3, 2, 3, 3});
  const int64_t w2 = weight(g, std::vector<float>(6, 1.0f), {2, 3, 1, 1});
  const int64_t bias = weight(g, {1.0f, 2.0f, 3.0f}, {1, 3, 1, 1});
  const int64_t y1 = arena(g, {1, 3, 2, 3}, "y1");
  const int64_t b = arena(g, {1, 3, 2, 3}, "b");
  const int64_t a = arena(g, {1, 3, 2, 3}, "a");
  const int64_t y2 = arena(g, {1, 2, 2, 3}, "y2");
  const int64_t m = arena(g, {1, 3}, "mean");
  g.ops.push_back(conv(x, w1, kNoTensor, y1, {1, 2, 2, 3}, 3, 3));
  // y1 + bias[c] (broadcast over N, H, W) as the lowering writes it, coalesced to [3, 6].
  g.ops.push_back(make_op(O::kBinary, {{int64_t(K::kAdd)}, {y1}, {bias}, {b}, {double_bits(1.0)},
                                       {double_bits(0.0)}, {2}, {3, 6}, {6, 1}, {1, 0}}));
  g.ops.push_back(unary(U::kTanh, b, a));
  g.ops.push_back(conv(a, w2, kNoTensor, y2, {1, 3, 2, 3}, 2, 1));
  g.ops.push_back(make_op(O::kReduce, {{int64_t(blob::ReduceKind::kMean)}, {a}, {m}, {3}, {6},
                                       {1}}));
  g.outputs = {y2, m};
  convert_to_channels_last(g);

  ASSERT_EQ(g.ops.size(), 7u);
  EXPECT_EQ(g.ops[0].opcode, O::kCopy);                          // the input made NHWC
  EXPECT_EQ(g.ops[0].list("in_strides"), (std::vector<int64_t>{12, 6, 3, 1}));
  EXPECT_EQ(g.ops[0].list("out_strides"), (std::vector<int64_t>{12, 1, 6, 2}));
  ASSERT_EQ(g.ops[1].opcode, O::kConv2d);
  EXPECT_EQ(g.ops[1].at("channels_last"), 1);
  EXPECT_EQ(g.ops[1].at("x"), g.ops[0].out());
  // KRSC: element [k, c, r, s] of the OIHW weight sits at ((k * 3 + r) * 3 + s) * 2 + c.
  const std::vector<float> krsc = floats(g.tensors[size_t(g.ops[1].at("weight"))]);
  EXPECT_EQ(krsc[((1 * 3 + 2) * 3 + 0) * 2 + 1], wv[((1 * 2 + 1) * 3 + 2) * 3 + 0]);
  // The bias add iterates N, H, W, C: its result is NHWC.
  EXPECT_EQ(g.ops[2].list("sizes"), (std::vector<int64_t>{1, 2, 3, 3}));
  EXPECT_EQ(g.ops[2].list("a_strides"), (std::vector<int64_t>{18, 9, 3, 1}));
  EXPECT_EQ(g.ops[2].list("b_strides"), (std::vector<int64_t>{0, 0, 0, 1}));
  EXPECT_EQ(g.ops[3].opcode, O::kUnary);
  EXPECT_EQ(g.ops[4].at("channels_last"), 1);
  EXPECT_EQ(g.ops[5].opcode, O::kCopy);                          // y2 back to NCHW for the output
  EXPECT_EQ(g.root(g.outputs[0]), g.ops[5].out());
  EXPECT_EQ(g.ops[6].opcode, O::kReduce);                        // mean over H, W of NHWC
  EXPECT_EQ(g.ops[6].at("outer"), 1);
  EXPECT_EQ(g.ops[6].at("inner"), 3);
  finish_and_read_back(g);
}

// Global pooling of a large image (17 x 17) reduces NHWC too ([N, H * W, C]): the reduce kernel
// splits the long axis into chunks, so no NCHW copy is needed.
TEST(ChannelsLast, GlobalPoolOfALargeImageReducesNhwc) {
  Graph g;
  const int64_t y = pointwise_conv(g, {1, 4, 17, 17});
  const int64_t m = arena(g, {1, 4}, "mean");
  g.ops.push_back(make_op(O::kReduce, {{int64_t(blob::ReduceKind::kMean)}, {y}, {m}, {4}, {289},
                                       {1}}));
  g.outputs = {m};
  convert_to_channels_last(g);
  std::vector<O> opcodes;
  for (const Op& op : g.ops) opcodes.push_back(op.opcode);
  ASSERT_EQ(opcodes, (std::vector<O>{O::kCopy, O::kConv2d, O::kReduce}));
  const Op& mean = g.ops[2];
  EXPECT_EQ((std::vector<int64_t>{mean.at("x"), mean.at("outer"), mean.at("reduce"),
                                  mean.at("inner")}),
            (std::vector<int64_t>{g.ops[1].out(), 1, 289, 4}));
  finish_and_read_back(g);
}

TEST(ChannelsLast, ViewsAndOtherReadersGetOneNchwCopy) {
  Graph g;
  const int64_t y = pointwise_conv(g, {1, 2, 2, 2});
  const int64_t flat = arena(g, {1, 8}, "flat");
  g.tensors[size_t(flat)].alias_of = y;
  const int64_t s = arena(g, {1, 8}, "s");
  const int64_t e = arena(g, {1, 8}, "e");
  g.ops.push_back(make_op(O::kSoftmax, {{flat}, {s}, {1}, {8}, {1}, {0}}));
  g.ops.push_back(unary(U::kExp, flat, e));
  g.outputs = {s, e};
  convert_to_channels_last(g);
  ASSERT_EQ(g.ops.size(), 5u);
  EXPECT_EQ(g.ops[2].opcode, O::kCopy);                          // one NCHW copy after the conv
  EXPECT_EQ(g.tensors[size_t(flat)].alias_of, g.ops[2].out());   // the view now reads it
  finish_and_read_back(g);
}

// A net with a depthwise convolution keeps NCHW (cuDNN's NHWC depthwise kernels are slow at
// batch 1): no layout copies, every conv reads and writes the graph's layout.
TEST(ChannelsLast, NetsWithDepthwiseConvolutionsGoChannelsLastToo) {
  Graph g;
  const int64_t y = pointwise_conv(g, {1, 4, 5, 5});
  const int64_t w = weight(g, std::vector<float>(36, 0.25f), {4, 1, 3, 3});
  const int64_t z = arena(g, {1, 4, 5, 5}, "z");
  Op dw = conv(y, w, kNoTensor, z, {1, 4, 5, 5}, 4, 3);
  dw.at("groups") = 4;
  g.ops.push_back(dw);
  g.outputs = {z};
  convert_to_channels_last(g);
  std::vector<O> opcodes;
  for (const Op& op : g.ops) opcodes.push_back(op.opcode);
  // The input made NHWC, both convolutions NHWC, the result back to NCHW for the output.
  ASSERT_EQ(opcodes, (std::vector<O>{O::kCopy, O::kConv2d, O::kConv2d, O::kCopy}));
  EXPECT_EQ(g.ops[1].at("channels_last"), 1);
  EXPECT_EQ(g.ops[2].at("channels_last"), 1);
  EXPECT_EQ(g.ops[2].at("groups"), 4);
  finish_and_read_back(g);
}

TEST(ChannelsLast, GraphsWithoutConvolutionsAreUntouched) {
  Graph g;
  const int64_t x = input(g, {1, 2, 2, 2}, 0);
  const int64_t y = arena(g, {1, 2, 2, 2}, "y");
  g.ops.push_back(make_op(O::kPool2d, {{0}, {x}, {y}, {1}, {2}, {2}, {2}, {1}, {1}, {1}, {1},
                                       {0}, {0}, {1}, {1}, {2}, {2}, {1}, {0}}));
  g.outputs = {y};
  convert_to_channels_last(g);
  ASSERT_EQ(g.ops.size(), 1u);
  EXPECT_EQ(g.ops[0].at("channels_last"), 0);
}

}  // namespace
}  // namespace kiln::builder
