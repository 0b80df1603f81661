// The blob reader on program state (kState, kIndexPut) and on kFusedElementwise programs.
#include "tests/format/reader_test_support.h"  // the standard headers the tests use, too

namespace kiln::engine {
namespace {

using namespace reader_test;

// --- Program state (kState) and kIndexPut. ---

struct StateBlob {
  BlobBuilder b;
  int64_t cache, values, pos, view, out;
};

// cache [2, 8, 4] state <- values [2, 1, 4] at pos; out = a copy of the cache (through a view).
StateBlob state_blob() {
  StateBlob s;
  const std::vector<float> zeros(2 * 8 * 4, 0.0f);
  s.cache = s.b.state(DType::kFloat32, {2, 8, 4}, zeros.data());
  s.values = s.b.input(DType::kFloat32, {2, 1, 4});
  s.pos = s.b.input(DType::kInt64, {1});
  s.view = s.b.view(s.cache, {16, 4});
  s.out = s.b.output(DType::kFloat32, {16, 4});
  s.b.index_put(s.values, s.pos, s.cache, 2, 8, 4, 1);
  s.b.copy(s.view, s.out, {64}, 0, {1}, 0, {1});
  return s;
}

TEST(BlobReader, StateAndIndexPutRoundTrip) {
  StateBlob s = state_blob();
  const Bytes bytes = s.b.build();
  std::string why;
  auto g = read_blob(bytes.data(), bytes.size(), &why);
  ASSERT_TRUE(g.ok()) << why;
  EXPECT_EQ(g->tensors[s.cache].storage, blob::Storage::kState);
  EXPECT_EQ(g->tensors[s.view].storage, blob::Storage::kState);
  ASSERT_EQ(g->ops[0].opcode, blob::Opcode::kIndexPut);
  const auto& a = std::get<IndexPutArgs>(g->ops[0].args);
  EXPECT_EQ(a.values, s.values);
  EXPECT_EQ(a.positions, s.pos);
  EXPECT_EQ(a.out, s.cache);
  EXPECT_EQ(a.outer, 2);
  EXPECT_EQ(a.dim_size, 8);
  EXPECT_EQ(a.inner, 4);
  EXPECT_EQ(a.num_positions, 1);
  EXPECT_STREQ(storage_name(blob::Storage::kState), "State");
  EXPECT_STREQ(opcode_name(blob::Opcode::kIndexPut), "index_put");
}

TEST(BlobReader, IndexPutWritesOnlyState) {
  StateBlob s = state_blob();
  const int64_t arena = s.b.arena(DType::kFloat32, {2, 8, 4});
  s.b.operands[operand_at(s.b, 0, 2)] = arena;
  EXPECT_TRUE(fails_with(s.b.build(), Error::InvalidProgram, "index_put writes only State"));
}

TEST(BlobReader, OnlyIndexPutWritesState) {
  StateBlob s = state_blob();
  s.b.fill(s.cache, 1.0);
  EXPECT_TRUE(fails_with(s.b.build(), Error::InvalidProgram, "whose storage is State"));
}

TEST(BlobReader, IndexPutChecksShapesAndDtypes) {
  StateBlob s = state_blob();
  s.b.operands[operand_at(s.b, 0, 4)] = 7;  // dim_size disagrees with the cache
  EXPECT_TRUE(fails_with(s.b.build(), Error::InvalidProgram, "outer * dim_size * inner"));
  s = state_blob();
  s.b.operands[operand_at(s.b, 0, 6)] = 2;  // two positions, one-element positions tensor
  EXPECT_TRUE(fails_with(s.b.build(), Error::InvalidProgram, "values (tensor"));
  s = state_blob();
  s.b.tensors[s.pos].dtype = static_cast<uint32_t>(DType::kFloat32);
  s.b.tensors[s.pos].nbytes = 4;
  EXPECT_TRUE(fails_with(s.b.build(), Error::InvalidProgram, "Int64 or Int32"));
}

TEST(BlobReader, StateInitialValuesMustFitAndNotOverlap) {
  StateBlob s = state_blob();
  s.b.tensors[s.cache].offset = 64;  // past the weights section
  s.b.tensors[s.view].offset = 64;
  EXPECT_TRUE(fails_with(s.b.build(), Error::InvalidProgram, "past the weights section"));
  s = state_blob();
  const std::vector<float> more(64, 1.0f);
  const int64_t second = s.b.state(DType::kFloat32, {64}, more.data());
  s.b.tensors[second].offset = 128;  // inside the first state's bytes
  EXPECT_TRUE(fails_with(s.b.build(), Error::InvalidProgram, "overlap without being the same state"));
  s = state_blob();
  s.b.tensors[s.view].sizes[0] = 8;  // same offset, another size
  s.b.tensors[s.view].nbytes = 8 * 4 * 4;
  EXPECT_TRUE(fails_with(s.b.build(), Error::InvalidProgram, "overlap without being the same state"));
}

// --- kFusedElementwise. ---

// out[2, 4] = hardswish-style x * clamp(x + 3, 0, 6) / 6 + bias (bias [4] broadcast over rows),
// with a Bool cond selecting between that and x.
struct FusedBlob {
  BlobBuilder b;
  int64_t x, bias, cond, out;
};

using Instr = BlobBuilder::Instr;
using Form = blob::FusedForm;

FusedBlob fused_blob() {
  FusedBlob s;
  s.x = s.b.input(DType::kFloat32, {2, 4});
  s.bias = s.b.input(DType::kBFloat16, {4});
  s.cond = s.b.input(DType::kBool, {2, 4});
  s.out = s.b.output(DType::kFloat32, {2, 4});
  const auto k = [](auto kind) { return static_cast<int64_t>(kind); };
  s.b.fused(s.out, {2, 4}, {s.x, s.bias, s.cond}, {{4, 1}, {0, 1}, {4, 1}},
            {Instr{Form::kBinary, k(blob::BinaryKind::kAdd), 0, -1, -1, 1.0, 3.0},      // r3
             Instr{Form::kUnary, k(blob::UnaryKind::kClamp), 3, -1, -1, 0.0, 6.0},      // r4
             Instr{Form::kBinary, k(blob::BinaryKind::kMul), 0, 4},                      // r5
             Instr{Form::kBinary, k(blob::BinaryKind::kDiv), 5, -1, -1, 1.0, 6.0,
                   DType::kBFloat16},                                                    // r6
             Instr{Form::kBinary, k(blob::BinaryKind::kAdd), 6, 1, -1, 1.0},             // r7
             Instr{Form::kWhere, 0, 2, 7, 0}});                                          // r8
  return s;
}

// Index of operand `i` of the fused op's instruction `j` (rank 2, 3 inputs).
size_t instr_operand(const BlobBuilder& b, size_t j, size_t i) {
  return operand_at(b, 0, 2 + 2 + 1 + 3 + 3 * 2 + 1 + j * blob::kFusedInstrWidth + i);
}

TEST(BlobReader, FusedElementwiseRoundTrips) {
  FusedBlob s = fused_blob();
  const Bytes bytes = s.b.build();
  std::string why;
  auto g = read_blob(bytes.data(), bytes.size(), &why);
  ASSERT_TRUE(g.ok()) << why;
  ASSERT_EQ(g->ops[0].opcode, blob::Opcode::kFusedElementwise);
  const auto& a = std::get<FusedElementwiseArgs>(g->ops[0].args);
  EXPECT_EQ(a.out, s.out);
  EXPECT_EQ(a.rank, 2u);
  EXPECT_EQ(a.num_inputs, 3u);
  EXPECT_EQ(a.inputs[1], s.bias);
  EXPECT_EQ(a.strides[1][0], 0);
  EXPECT_EQ(a.strides[1][1], 1);
  ASSERT_EQ(a.num_instrs, 6u);
  EXPECT_EQ(a.instrs[1].form, Form::kUnary);
  EXPECT_EQ(a.instrs[1].kind, static_cast<int64_t>(blob::UnaryKind::kClamp));
  EXPECT_EQ(a.instrs[1].p1, 6.0);
  EXPECT_EQ(a.instrs[0].src[1], -1);
  EXPECT_EQ(a.instrs[3].round, DType::kBFloat16);
  EXPECT_EQ(a.instrs[5].src[2], 0);
  EXPECT_STREQ(opcode_name(blob::Opcode::kFusedElementwise), "fused_elementwise");
}

TEST(BlobReader, FusedElementwiseRejectsMalformedPrograms) {
  struct Case {
    size_t instr, operand;
    int64_t value;
    const char* needle;
  };
  const Case cases[] = {
      {0, 0, 3, "not a known FusedForm"},
      {0, 0, -1, "not a known FusedForm"},
      {1, 1, 32, "not a known UnaryKind"},
      {1, 1, 17, "logical_not is not a fused kind"},
      {2, 1, 18, "not a known BinaryKind"},
      {2, 1, 7, "compare and logical kinds are not fused kinds"},
      {5, 1, 1, "program kind"},
      {2, 2, 5, "source 0 is register 5"},   // reads its own result
      {2, 2, 9, "source 0 is register 9"},   // a later instruction's
      {2, 2, -1, "source 0 is register -1"},
      {2, 3, -2, "source 1 is register -2"},
      {1, 3, 0, "source 1 is register 0"},   // a unary has one source
      {5, 4, -1, "source 2 is register -1"}, // where needs three
      {5, 4, 1 << 20, "source 2 is register"},
      {3, 7, static_cast<int64_t>(DType::kInt32), "round dtype 3"},
      {3, 7, static_cast<int64_t>(DType::kBool), "round dtype 11"},
      {3, 7, 1 << 30, "round dtype"},
  };
  for (const Case& c : cases) {
    FusedBlob s = fused_blob();
    s.b.operands[instr_operand(s.b, c.instr, c.operand)] = c.value;
    EXPECT_TRUE(fails_with(s.b.build(), Error::InvalidProgram, c.needle)) << c.needle;
  }
}

TEST(BlobReader, FusedElementwiseChecksCountsShapesAndDtypes) {
  FusedBlob s = fused_blob();
  s.b.operands[operand_at(s.b, 0, 4)] = 9;  // num_inputs past kMaxFusedInputs
  EXPECT_TRUE(fails_with(s.b.build(), Error::InvalidProgram, "(num_inputs) is 9"));
  s = fused_blob();
  s.b.operands[operand_at(s.b, 0, 4)] = 2;  // fewer inputs: the operand count no longer fits
  EXPECT_TRUE(fails_with(s.b.build(), Error::InvalidProgram, "its layout needs"));
  s = fused_blob();
  s.b.operands[operand_at(s.b, 0, 14)] = 0;  // num_instrs
  EXPECT_TRUE(fails_with(s.b.build(), Error::InvalidProgram, "(num_instrs) is 0"));
  s = fused_blob();
  s.b.operands[operand_at(s.b, 0, 14)] = 17;
  EXPECT_TRUE(fails_with(s.b.build(), Error::InvalidProgram, "(num_instrs) is 17"));
  s = fused_blob();
  s.b.operands[operand_at(s.b, 0, 14)] = 5;  // claims 5 instructions, carries 6
  EXPECT_TRUE(fails_with(s.b.build(), Error::InvalidProgram, "8 * num_instrs"));
  s = fused_blob();
  s.b.operands[operand_at(s.b, 0, 1)] = 9;  // rank
  EXPECT_TRUE(fails_with(s.b.build(), Error::InvalidProgram, "(rank) is 9"));
  s = fused_blob();
  s.b.operands[operand_at(s.b, 0, 10)] = 1;  // bias read with stride 1 along rows: out of range
  EXPECT_TRUE(fails_with(s.b.build(), Error::InvalidProgram, "an input (tensor 1"));
  s = fused_blob();
  s.b.operands[operand_at(s.b, 0, 5)] = 99;  // inputs[0]
  EXPECT_TRUE(fails_with(s.b.build(), Error::InvalidProgram, "is tensor id 99"));
  s = fused_blob();
  s.b.operands[operand_at(s.b, 0, 5)] = s.out;  // reads what it writes
  EXPECT_TRUE(fails_with(s.b.build(), Error::InvalidProgram, "overlaps input"));
  s = fused_blob();
  s.b.tensors[s.out].dtype = static_cast<uint32_t>(DType::kInt32);
  EXPECT_TRUE(fails_with(s.b.build(), Error::InvalidProgram, "Float32, Float16 or BFloat16"));
  s = fused_blob();
  s.b.tensors[s.x].dtype = static_cast<uint32_t>(DType::kInt32);
  EXPECT_TRUE(fails_with(s.b.build(), Error::InvalidProgram, "Float32, Float16, BFloat16 or Bool"));
  s = fused_blob();
  s.b.operands[operand_at(s.b, 0, 2)] = 3;  // sizes [3, 4] disagree with out's 8 elements
  EXPECT_TRUE(fails_with(s.b.build(), Error::InvalidProgram, "has 8 elements, but sizes gives 12"));
}


}  // namespace
}  // namespace kiln::engine
