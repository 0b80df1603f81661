// The blob reader on kAttention: its fields, GQA heads, mask dtypes and strided extents.
#include "tests/format/reader_test_support.h"  // the standard headers the tests use, too

namespace kiln::engine {
namespace {

using namespace reader_test;

struct AttentionBlob {
  BlobBuilder b;
  BlobBuilder::Attention a;
};

// q [2, 4, 3, 8] read from a [2, 3, 4, 8] projection (strided), k/v [2, 2, 5, 8] (GQA), a
// [1, 1, 3, 5] additive mask broadcast, out [2, 4, 3, 8].
AttentionBlob attention_blob(DType mask_dtype = DType::kFloat32) {
  AttentionBlob s;
  BlobBuilder::Attention& a = s.a;
  a.q = s.b.input(DType::kFloat32, {2, 3, 4, 8});
  a.k = s.b.input(DType::kFloat32, {2, 2, 5, 8});
  a.v = s.b.input(DType::kFloat32, {2, 2, 5, 8});
  a.mask = s.b.input(mask_dtype, {1, 1, 3, 5});
  a.out = s.b.output(DType::kFloat32, {2, 4, 3, 8});
  a.batch = 2, a.heads_q = 4, a.heads_kv = 2, a.seq_q = 3, a.seq_kv = 5, a.head_dim = 8,
  a.head_dim_v = 8;
  a.q_strides[0] = 3 * 4 * 8, a.q_strides[1] = 8, a.q_strides[2] = 4 * 8;
  a.mask_strides[0] = 0, a.mask_strides[1] = 0, a.mask_strides[2] = 5, a.mask_strides[3] = 1;
  a.scale = 0.125;
  return s;
}

TEST(BlobReader, AttentionRoundTrip) {
  AttentionBlob s = attention_blob();
  s.a.causal = true;
  s.b.attention(s.a);
  std::string why;
  const Bytes bytes = s.b.build();
  const auto g = read_blob(bytes.data(), bytes.size(), &why);
  ASSERT_TRUE(g.ok()) << why;
  const Op& op = g->ops[0];
  ASSERT_EQ(op.opcode, blob::Opcode::kAttention);
  const auto& a = std::get<AttentionArgs>(op.args);
  EXPECT_EQ(a.q, s.a.q);
  EXPECT_EQ(a.mask, s.a.mask);
  EXPECT_EQ(a.heads_kv, 2);
  EXPECT_EQ(a.q_stride_h, 8);
  EXPECT_EQ(a.q_stride_s, 32);
  EXPECT_EQ(a.mask_stride_b, 0);
  EXPECT_TRUE(a.causal);
  EXPECT_EQ(a.scale, 0.125);
  EXPECT_STREQ(opcode_name(blob::Opcode::kAttention), "attention");
}

TEST(BlobReader, AttentionTakesABoolMaskAndNoMask) {
  AttentionBlob s = attention_blob(DType::kBool);
  s.b.attention(s.a);
  std::string why;
  EXPECT_TRUE(read_blob(s.b.build().data(), s.b.build().size(), &why).ok()) << why;
  s = attention_blob();
  s.a.mask = -1;
  s.b.attention(s.a);
  EXPECT_TRUE(read_blob(s.b.build().data(), s.b.build().size(), &why).ok()) << why;
}

TEST(BlobReader, AttentionChecksHeadsDtypesAndExtents) {
  struct Case {
    void (*mutate)(AttentionBlob&);
    const char* needle;
  };
  const Case cases[] = {
      // 4 query heads cannot share 3.
      {[](AttentionBlob& s) { s.a.heads_kv = 3; }, "multiple of heads_kv"},
      // k of another dtype than q.
      {[](AttentionBlob& s) { s.a.k = s.b.input(DType::kFloat16, {2, 2, 5, 8}); }, "k (tensor"},
      // The last query row would lie past q.
      {[](AttentionBlob& s) { s.a.q_strides[2] = 64; }, "addressed at element offsets"},
      // The mask has one batch, not two.
      {[](AttentionBlob& s) { s.a.mask_strides[0] = 15; }, "mask (tensor"},
      {[](AttentionBlob& s) { s.a.out = s.b.output(DType::kFloat32, {2, 4, 3, 7}); },
       "batch * heads_q * seq_q"},
      {[](AttentionBlob& s) { s.a.heads_kv = 0; }, "heads_kv"},
      // v read one element past its end.
      {[](AttentionBlob& s) { s.a.v_offset = 1; }, "v (tensor"},
  };
  for (const Case& c : cases) {
    AttentionBlob s = attention_blob();
    c.mutate(s);
    s.b.attention(s.a);
    EXPECT_TRUE(fails_with(s.b.build(), Error::InvalidProgram, c.needle)) << c.needle;
  }
  // An additive mask of another dtype than q.
  AttentionBlob s = attention_blob(DType::kFloat16);
  s.b.attention(s.a);
  EXPECT_TRUE(fails_with(s.b.build(), Error::InvalidProgram, "mask (tensor"));
}

}  // namespace
}  // namespace kiln::engine
