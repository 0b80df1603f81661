// fold_attention_transposes: the copy that transposes an attention result back to [B, S, H, D]
// becomes the attention's out strides; a copy that is not a permutation of whole dimensions, that
// casts, or that shares the result with another reader stays.
#include <gtest/gtest.h>

#include "builder/src/passes.h"
#include "ir_writer.h"

namespace kiln::builder {
namespace {

using namespace kiln::builder::testing;

constexpr int64_t B = 1, H = 4, S = 6, D = 8;

struct Variant {
  bool cast = false;          // the copy converts to Float16
  bool second_reader = false;  // the attention result is a graph output as well
  bool slice = false;          // the copy reads only half the positions
};

Graph attention_then_copy(const Variant& c) {
  Graph g;
  const int64_t q = input(g, {B, H, S, D}, 0), k = input(g, {B, H, S, D}, 1),
                v = input(g, {B, H, S, D}, 2);
  const int64_t att = g.add_tensor(blob::DType::kFloat32, {B, H, S, D}, "att");
  const int64_t s = c.slice ? S / 2 : S;
  const int64_t out = g.add_tensor(c.cast ? blob::DType::kFloat16 : blob::DType::kFloat32,
                                   {B, s, H, D}, "out");
  g.ops.push_back(make_op(blob::Opcode::kAttention,
                          {{q}, {k}, {v}, {kNoTensor}, {att}, {B}, {H}, {H}, {S}, {S}, {D}, {D},
                           {0}, {0}, {0}, {H * S * D}, {S * D}, {D}, {H * S * D}, {S * D}, {D},
                           {H * S * D}, {S * D}, {D}, {0}, {0}, {0}, {0}, {0},
                           {double_bits(0.25)}, {H * S * D}, {S * D}, {D}}));
  // out[b, s, h, d] = att[b, h, s, d]
  g.ops.push_back(make_op(blob::Opcode::kCopy,
                          {{att}, {out}, {4}, {B, s, H, D}, {0}, {H * S * D, D, S * D, 1}, {0},
                           {s * H * D, H * D, D, 1}}));
  g.outputs = {out};
  if (c.second_reader) g.outputs.push_back(att);
  return g;
}

TEST(FoldAttentionTransposes, TransposeBackBecomesOutStrides) {
  Graph g = attention_then_copy({});
  const int64_t out = g.ops[1].out();
  fold_attention_transposes(g);
  ASSERT_EQ(g.ops.size(), 1u);
  const Op& att = g.ops[0];
  EXPECT_EQ(att.out(), out);
  EXPECT_EQ(att.at("out_stride_b"), S * H * D);
  EXPECT_EQ(att.at("out_stride_h"), D);
  EXPECT_EQ(att.at("out_stride_s"), H * D);
  finish_and_read_back(g);  // the blob reader accepts the result
}

TEST(FoldAttentionTransposes, OtherCopiesStay) {
  for (const Variant& c : {Variant{true, false, false}, Variant{false, true, false},
                         Variant{false, false, true}}) {
    Graph g = attention_then_copy(c);
    fold_attention_transposes(g);
    EXPECT_EQ(g.ops.size(), 2u) << c.cast << c.second_reader << c.slice;
    EXPECT_EQ(g.ops[0].at("out_stride_s"), D);
  }
}

}  // namespace
}  // namespace kiln::builder
