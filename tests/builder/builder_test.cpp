// The builder's passes called directly: memory planning, fusion decisions, precision conversion
// of edge values, epilogue fusion and dead ops.
#include <gtest/gtest.h>

#include <cstring>
#include <random>
#include <unordered_map>

#include "builder/src/blob_writer.h"
#include "builder/src/passes.h"
#include "ir_writer.h"
#include "format/blob_reader.h"

namespace kiln::builder {
namespace {

using namespace kiln::builder::testing;
using K = blob::BinaryKind;
using U = blob::UnaryKind;

// Each arena root's [first writer, last reader] in op order, recomputed here independently.
std::unordered_map<int64_t, std::pair<size_t, size_t>> lifetimes(const Graph& g) {
  std::unordered_map<int64_t, std::pair<size_t, size_t>> life;
  for (size_t i = 0; i < g.ops.size(); ++i) {
    int64_t r = g.root(g.ops[i].out());
    if (!life.count(r)) life[r] = {i, i};
    life[r].second = i;
    for (int64_t t : g.ops[i].reads()) {
      int64_t rr = g.root(t);
      if (life.count(rr)) life[rr].second = i;
    }
  }
  return life;
}

TEST(PlanMemory, LiveTensorsNeverOverlapAndOffsetsAreAligned) {
  std::mt19937 rng(1234);
  for (int trial = 0; trial < 20; ++trial) {
    Graph g;
    std::vector<int64_t> values{input(g, {64}, 0)};
    for (int i = 0; i < 40; ++i) {
      int64_t n = 64;
      int64_t out = g.add_tensor(blob::DType::kFloat32, {n}, "t" + std::to_string(i));
      // Vary the byte size through views of other shapes: each op writes 64 floats, but some
      // tensors are declared larger by a second unary reading a wider input is not possible,
      // so sizes vary by dtype instead.
      if (rng() % 3 == 0) g.tensors[size_t(out)].dtype = blob::DType::kFloat16;
      int64_t a = values[rng() % values.size()];
      if (rng() % 2) {
        g.ops.push_back(unary(U::kRelu, a, out));
      } else {
        int64_t b = values[rng() % values.size()];
        g.ops.push_back(binary(K::kAdd, a, b, out, n));
      }
      values.push_back(out);
    }
    g.outputs = {values.back()};
    plan_memory(g);
    auto life = lifetimes(g);
    uint64_t end = 0;
    for (const Tensor& t : g.tensors) {
      if (t.storage != blob::Storage::kArena || t.alias_of != kNoTensor) continue;
      EXPECT_EQ(t.offset % kArenaAlignment, 0u) << "tensor " << t.id;
      end = std::max(end, t.offset + t.nbytes());
      for (const Tensor& o : g.tensors) {
        if (o.id <= t.id || o.storage != blob::Storage::kArena || o.alias_of != kNoTensor) continue;
        auto [f1, l1] = life.at(t.id);
        auto [f2, l2] = life.at(o.id);
        bool live_together = f1 <= l2 && f2 <= l1;
        bool disjoint = t.offset + t.nbytes() <= o.offset || o.offset + o.nbytes() <= t.offset;
        EXPECT_TRUE(!live_together || disjoint) << "tensors " << t.id << " and " << o.id;
      }
    }
    EXPECT_GE(g.arena_size, end);
    EXPECT_EQ(g.arena_size % kArenaAlignment, 0u);
  }
}

TEST(PlanMemory, ReusesTheBytesOfDeadTensors) {
  Graph g;
  int64_t x = input(g, {256}, 0);
  int64_t prev = x;
  for (int i = 0; i < 6; ++i) {   // a chain: only two tensors are ever live at once
    int64_t t = g.add_tensor(blob::DType::kFloat32, {256}, "t");
    g.ops.push_back(unary(U::kExp, prev, t));
    prev = t;
  }
  g.outputs = {prev};
  plan_memory(g);
  EXPECT_EQ(g.arena_size, 2 * 1024u);
}

TEST(PlanMemory, ArenaTensorNeverWrittenIsAnError) {
  Graph g;
  int64_t x = input(g, {4}, 0);
  int64_t orphan = g.add_tensor(blob::DType::kFloat32, {4}, "orphan");
  int64_t out = g.add_tensor(blob::DType::kFloat32, {4}, "out");
  g.ops.push_back(binary(K::kAdd, x, orphan, out, 4));
  g.outputs = {out};
  try {
    plan_memory(g);
    FAIL() << "expected an error";
  } catch (const BuildError& e) {
    EXPECT_NE(std::string(e.what()).find("arena tensor 1 (orphan) is never written"),
              std::string::npos) << e.what();
  }
}

TEST(FuseElementwise, ChainBecomesOneProgram) {
  Graph g;
  int64_t x = input(g, {2, 8}, 0);
  int64_t a = g.add_tensor(blob::DType::kFloat32, {2, 8}, "a");
  int64_t b = g.add_tensor(blob::DType::kFloat32, {2, 8}, "b");
  int64_t out = g.add_tensor(blob::DType::kFloat32, {2, 8}, "out");
  g.ops.push_back(binary(K::kAdd, x, kNoTensor, a, 16));
  g.ops.push_back(unary(U::kClamp, a, b));
  g.ops.push_back(binary(K::kMul, x, b, out, 16));
  g.outputs = {out};
  fuse_elementwise(g);
  ASSERT_EQ(g.ops.size(), 1u);
  const Op& op = g.ops[0];
  EXPECT_EQ(op.opcode, blob::Opcode::kFusedElementwise);
  EXPECT_EQ(op.at("num_inputs"), 1);
  EXPECT_EQ(op.list("inputs"), std::vector<int64_t>{x});
  EXPECT_EQ(op.at("num_instrs"), 3);
  EXPECT_EQ(op.at("rank"), 1);   // [2, 8] contiguous coalesces to one dim
  // Instruction 2 (mul) reads input 0 (x) and register 1 + 1 (the clamp).
  const auto& p = op.list("program");
  EXPECT_EQ(p[16 + 2], 0);
  EXPECT_EQ(p[16 + 3], 2);
  EXPECT_EQ(op.out(), out);
}

TEST(FuseElementwise, ResultReadTwiceStaysItsOwnOp) {
  Graph g;
  int64_t x = input(g, {32}, 0);
  int64_t t = g.add_tensor(blob::DType::kFloat32, {32}, "t");
  int64_t a = g.add_tensor(blob::DType::kFloat32, {32}, "a");
  int64_t b = g.add_tensor(blob::DType::kFloat32, {32}, "b");
  int64_t out = g.add_tensor(blob::DType::kFloat32, {32}, "out");
  g.ops.push_back(unary(U::kRelu, x, t));
  g.ops.push_back(unary(U::kNeg, t, a));
  g.ops.push_back(unary(U::kExp, t, b));
  g.ops.push_back(binary(K::kAdd, a, b, out, 32));
  g.outputs = {out};
  fuse_elementwise(g);
  ASSERT_EQ(g.ops.size(), 2u);
  EXPECT_EQ(g.ops[0].opcode, blob::Opcode::kUnary);
  EXPECT_EQ(g.ops[1].opcode, blob::Opcode::kFusedElementwise);
  EXPECT_EQ(g.ops[1].list("inputs"), std::vector<int64_t>{t});
  EXPECT_EQ(g.ops[1].at("num_instrs"), 3);
}

TEST(FuseElementwise, OutputsAndNonFloatingKindsAreNotFused) {
  Graph g;
  int64_t x = input(g, {8}, 0);
  int64_t t = g.add_tensor(blob::DType::kFloat32, {8}, "t");
  int64_t out = g.add_tensor(blob::DType::kFloat32, {8}, "out");
  int64_t mask = g.add_tensor(blob::DType::kBool, {8}, "mask");
  int64_t inv = g.add_tensor(blob::DType::kBool, {8}, "inv");
  g.ops.push_back(unary(U::kRelu, x, t));           // t is an output: not folded into its reader
  g.ops.push_back(unary(U::kExp, t, out));
  g.ops.push_back(binary(K::kGt, x, kNoTensor, mask, 8));   // a compare writes Bool
  g.ops.push_back(unary(U::kLogicalNot, mask, inv));
  g.outputs = {t, out, inv};
  fuse_elementwise(g);
  ASSERT_EQ(g.ops.size(), 4u);
  for (const Op& op : g.ops) EXPECT_NE(op.opcode, blob::Opcode::kFusedElementwise);
}

TEST(FuseElementwise, ProgramLimitSplitsLongChains) {
  Graph g;
  int64_t prev = input(g, {8}, 0);
  for (int i = 0; i < 20; ++i) {
    int64_t t = g.add_tensor(blob::DType::kFloat32, {8}, "t");
    g.ops.push_back(unary(U::kSin, prev, t));
    prev = t;
  }
  g.outputs = {prev};
  fuse_elementwise(g);
  ASSERT_EQ(g.ops.size(), 2u);
  int64_t total = 0;
  for (const Op& op : g.ops) {
    int64_t n = op.opcode == blob::Opcode::kFusedElementwise ? op.at("num_instrs") : 1;
    EXPECT_LE(n, int64_t(blob::kMaxFusedInstrs));
    total += n;
  }
  EXPECT_EQ(total, 20);
}

float from_bits(uint32_t b) {
  float f;
  std::memcpy(&f, &b, 4);
  return f;
}

TEST(Precision, BFloat16EdgeValues) {
  EXPECT_EQ(float_to_bfloat16(1.0f), 0x3f80);
  EXPECT_EQ(float_to_bfloat16(-0.0f), 0x8000);
  EXPECT_EQ(float_to_bfloat16(from_bits(0x3f808000)), 0x3f80);   // tie, even stays
  EXPECT_EQ(float_to_bfloat16(from_bits(0x3f818000)), 0x3f82);   // tie, odd rounds up
  EXPECT_EQ(float_to_bfloat16(from_bits(0x3f808001)), 0x3f81);
  EXPECT_EQ(float_to_bfloat16(from_bits(0x7f7fffff)), 0x7f80);   // max float rounds to inf
  EXPECT_EQ(float_to_bfloat16(from_bits(0x7f800000)), 0x7f80);
  EXPECT_EQ(float_to_bfloat16(from_bits(0xff800000)), 0xff80);
  EXPECT_EQ(float_to_bfloat16(from_bits(0x00000001)), 0x0000);   // subnormals round too
  EXPECT_EQ(float_to_bfloat16(from_bits(0x00018000)), 0x0002);
  EXPECT_EQ(float_to_bfloat16(from_bits(0x00010001)), 0x0001);
  EXPECT_EQ(float_to_bfloat16(from_bits(0x7fc00000)), 0xffff);   // torch's NaN
  EXPECT_EQ(float_to_bfloat16(from_bits(0xff812345)), 0xffff);
}

TEST(Precision, HalfEdgeValues) {
  EXPECT_EQ(float_to_half(1.0f), 0x3c00);
  EXPECT_EQ(float_to_half(-2.0f), 0xc000);
  EXPECT_EQ(float_to_half(-0.0f), 0x8000);
  EXPECT_EQ(float_to_half(65504.0f), 0x7bff);
  EXPECT_EQ(float_to_half(65519.0f), 0x7bff);
  EXPECT_EQ(float_to_half(65520.0f), 0x7c00);                    // tie with an odd max: inf
  EXPECT_EQ(float_to_half(from_bits(0x7f800000)), 0x7c00);
  EXPECT_EQ(float_to_half(from_bits(0x3f801000)), 0x3c00);       // 1 + 2^-11: tie to even
  EXPECT_EQ(float_to_half(from_bits(0x3f803000)), 0x3c02);
  EXPECT_EQ(float_to_half(from_bits(0x38800000)), 0x0400);       // 2^-14, smallest normal
  EXPECT_EQ(float_to_half(from_bits(0x387fc000)), 0x03ff);       // largest subnormal
  EXPECT_EQ(float_to_half(from_bits(0x387ff000)), 0x0400);       // rounds up into the normals
  EXPECT_EQ(float_to_half(from_bits(0x33800000)), 0x0001);       // 2^-24
  EXPECT_EQ(float_to_half(from_bits(0x33000000)), 0x0000);       // 2^-25: tie to even (0)
  EXPECT_EQ(float_to_half(from_bits(0x33000001)), 0x0001);
  EXPECT_EQ(float_to_half(from_bits(0x33c00000)), 0x0002);       // 1.5 * 2^-24: tie to 2
  EXPECT_EQ(float_to_half(from_bits(0x00000001)), 0x0000);
  EXPECT_EQ(float_to_half(from_bits(0x7fc00000)), 0x7e00);       // NaN: quiet, payload kept
  EXPECT_EQ(float_to_half(from_bits(0xffc12345)), 0xfe09);
  EXPECT_EQ(float_to_half(from_bits(0x7f800001)), 0x7e00);
  EXPECT_EQ(float_to_half(from_bits(0x7fffffff)), 0x7fff);
}

TEST(Precision, Bf16GraphCastsAtTheEdgesAndConvertsWeights) {
  Graph g;
  g.precision = blob::Precision::kBf16;
  int64_t x = input(g, {3}, 0);
  int64_t w = weight(g, {1.0f, from_bits(0x3f818000), -0.0f}, {3});
  int64_t t = g.add_tensor(blob::DType::kFloat32, {3}, "t");
  int64_t out = g.add_tensor(blob::DType::kFloat32, {3}, "out");
  g.ops.push_back(binary(K::kMul, x, w, t, 3));
  g.ops.push_back(make_op(blob::Opcode::kSoftmax, {{t}, {out}, {1}, {3}, {1}, {0}}));
  g.outputs = {out};
  convert_precision(g);
  EXPECT_EQ(g.tensors[size_t(x)].dtype, blob::DType::kFloat32);   // inputs keep their dtype
  EXPECT_EQ(g.tensors[size_t(w)].dtype, blob::DType::kBFloat16);
  std::vector<uint8_t> want = {0x80, 0x3f, 0x82, 0x3f, 0x00, 0x80};
  EXPECT_EQ(g.tensors[size_t(w)].data, want);
  ASSERT_EQ(g.ops.size(), 4u);                                     // cast in, mul, softmax, cast out
  EXPECT_EQ(g.ops.front().opcode, blob::Opcode::kCopy);
  EXPECT_EQ(g.ops.back().opcode, blob::Opcode::kCopy);
  EXPECT_EQ(g.tensors[size_t(g.outputs[0])].dtype, blob::DType::kFloat32);
  EXPECT_EQ(g.ops[1].at("a"), g.ops[0].out());                    // mul reads the cast input
}

// x [2,3] @ w [3,2] + r, then relu: the add becomes the matmul's residual and the relu its
// epilogue. r is made after the matmul, so the fused op moves to where the add was.
Graph residual_graph(Op (*make_add)(int64_t mm, int64_t r, int64_t sum)) {
  Graph g;
  int64_t x = input(g, {2, 3}, 0);
  int64_t y = input(g, {2, 2}, 1);
  int64_t w = weight(g, {1, 2, 3, 4, 5, 6}, {3, 2});
  int64_t mm = g.add_tensor(blob::DType::kFloat32, {2, 2}, "mm");
  int64_t r = g.add_tensor(blob::DType::kFloat32, {2, 2}, "r");
  int64_t sum = g.add_tensor(blob::DType::kFloat32, {1, 2, 2}, "sum");
  int64_t act = g.add_tensor(blob::DType::kFloat32, {1, 2, 2}, "act");
  g.ops.push_back(make_op(blob::Opcode::kMatmul,
                          {{x}, {w}, {kNoTensor}, {mm}, {1}, {2}, {2}, {3}, {0}, {0}, {0}, {0},
                           {0}, {0}, {double_bits(1.0)}, {double_bits(0.0)}, {0}, {kNoTensor}}));
  g.ops.push_back(unary(U::kExp, y, r));
  g.ops.push_back(make_add(mm, r, sum));
  g.ops.push_back(unary(U::kRelu, sum, act));
  g.outputs = {act};
  return g;
}

TEST(Passes, MatmulResidualThenActivation) {
  for (bool mm_first : {true, false}) {
    Graph g = residual_graph(mm_first ? +[](int64_t mm, int64_t r, int64_t sum) {
      return binary(K::kAdd, mm, r, sum, 4);
    } : +[](int64_t mm, int64_t r, int64_t sum) { return binary(K::kAdd, r, mm, sum, 4); });
    fuse_matmul_epilogues(g);
    ASSERT_EQ(g.ops.size(), 2u) << mm_first;
    EXPECT_EQ(g.ops[0].opcode, blob::Opcode::kUnary);            // r first
    ASSERT_EQ(g.ops[1].opcode, blob::Opcode::kMatmul);
    EXPECT_EQ(g.ops[1].at("residual"), g.ops[0].out());
    EXPECT_EQ(g.ops[1].at("epilogue"), int64_t(blob::Epilogue::kRelu));
    EXPECT_EQ(g.root(g.outputs[0]), g.ops[1].out());
    finish_and_read_back(g);
  }
}

TEST(Passes, MatmulResidualNeedsAPlainAddOfTheSameShape) {
  const std::pair<const char*, Op (*)(int64_t, int64_t, int64_t)> cases[] = {
      {"alpha 2", [](int64_t mm, int64_t r, int64_t sum) {
         Op op = binary(K::kAdd, mm, r, sum, 4);
         op.at("alpha") = double_bits(2.0);
         return op;
       }},
      {"a broadcast row", [](int64_t mm, int64_t r, int64_t sum) {
         Op op = make_op(blob::Opcode::kBinary,
                         {{int64_t(K::kAdd)}, {mm}, {r}, {sum}, {double_bits(1.0)},
                          {double_bits(0.0)}, {2}, {2, 2}, {2, 1}, {0, 1}});
         return op;
       }},
      {"a subtraction", [](int64_t mm, int64_t r, int64_t sum) {
         return binary(K::kSub, mm, r, sum, 4);
       }},
      {"mm + mm", [](int64_t mm, int64_t, int64_t sum) {
         return binary(K::kAdd, mm, mm, sum, 4);
       }},
  };
  for (const auto& [what, make_add] : cases) {
    Graph g = residual_graph(make_add);
    fuse_matmul_epilogues(g);
    ASSERT_EQ(g.ops.size(), 4u) << what;
    EXPECT_EQ(g.ops[0].at("residual"), kNoTensor) << what;
    EXPECT_EQ(g.ops[0].at("epilogue"), int64_t(blob::Epilogue::kNone)) << what;
  }
}

// tanh -> erfinv -> cos in bf16: erfinv's operand and result stay float32 (torch.autocast's rule),
// so tanh is never rounded to 1; fusion then runs the chain with no rounding between the steps.
TEST(Precision, Float32OnlyOpKeepsItsOperandAndResultInFloat32) {
  Graph g;
  g.precision = blob::Precision::kBf16;
  int64_t x = input(g, {4}, 0);
  int64_t t = g.add_tensor(blob::DType::kFloat32, {4}, "t");
  int64_t e = g.add_tensor(blob::DType::kFloat32, {4}, "e");
  int64_t out = g.add_tensor(blob::DType::kFloat32, {4}, "out");
  g.ops.push_back(unary(U::kTanh, x, t));
  g.ops.push_back(unary(U::kErfinv, t, e));
  g.ops.push_back(unary(U::kCos, e, out));
  g.outputs = {out};
  convert_precision(g);
  EXPECT_EQ(g.tensors[size_t(t)].dtype, blob::DType::kFloat32);
  EXPECT_EQ(g.tensors[size_t(e)].dtype, blob::DType::kFloat32);
  ASSERT_EQ(g.ops.size(), 4u);                                     // cast in, tanh, erfinv, cos
  EXPECT_EQ(g.ops[0].opcode, blob::Opcode::kCopy);
  EXPECT_EQ(g.tensors[size_t(g.ops[0].out())].dtype, blob::DType::kBFloat16);
  EXPECT_EQ(g.ops[1].at("x"), g.ops[0].out());                    // tanh reads the cast input
  EXPECT_EQ(g.outputs, std::vector<int64_t>{out});                 // no cast out: already float32
  fuse_elementwise(g);
  ASSERT_EQ(g.ops.size(), 2u);
  ASSERT_EQ(g.ops[1].opcode, blob::Opcode::kFusedElementwise);
  ASSERT_EQ(g.ops[1].at("num_instrs"), 3);
  const auto& program = g.ops[1].list("program");
  for (size_t j = 0; j < 3; ++j) {
    EXPECT_EQ(program[j * blob::kFusedInstrWidth + 7], int64_t(blob::DType::kFloat32)) << j;
  }
}

// Around a float32-only op, ops that take one dtype: the operand a softmax writes stays bf16
// (erfinv reads it rounded), and the softmax reading erfinv's float32 result reads a bf16 copy.
TEST(Precision, OneDtypeOpsNextToAFloat32OnlyOpKeepTheLowDtype) {
  Graph g;
  g.precision = blob::Precision::kBf16;
  int64_t x = input(g, {3}, 0);
  int64_t s = g.add_tensor(blob::DType::kFloat32, {3}, "s");
  int64_t e = g.add_tensor(blob::DType::kFloat32, {3}, "e");
  int64_t out = g.add_tensor(blob::DType::kFloat32, {3}, "out");
  g.ops.push_back(make_op(blob::Opcode::kSoftmax, {{x}, {s}, {1}, {3}, {1}, {0}}));
  g.ops.push_back(unary(U::kErfinv, s, e));
  g.ops.push_back(make_op(blob::Opcode::kSoftmax, {{e}, {out}, {1}, {3}, {1}, {0}}));
  g.outputs = {out};
  convert_precision(g);
  EXPECT_EQ(g.tensors[size_t(s)].dtype, blob::DType::kBFloat16);
  EXPECT_EQ(g.tensors[size_t(e)].dtype, blob::DType::kFloat32);
  // cast in, softmax, erfinv, bf16 copy of e, softmax, cast out
  ASSERT_EQ(g.ops.size(), 6u);
  EXPECT_EQ(g.ops[3].opcode, blob::Opcode::kCopy);
  EXPECT_EQ(g.ops[3].at("x"), e);
  int64_t e_low = g.ops[3].out();
  EXPECT_EQ(g.tensors[size_t(e_low)].dtype, blob::DType::kBFloat16);
  EXPECT_EQ(g.ops[4].at("x"), e_low);
  EXPECT_EQ(g.ops[5].opcode, blob::Opcode::kCopy);
  EXPECT_EQ(g.tensors[size_t(g.outputs[0])].dtype, blob::DType::kFloat32);
  finish_and_read_back(g);
}

// A float32-only op reading a delegate input reads it as given: no cast is made for it.
TEST(Precision, Float32OnlyOpReadsAFloat32InputUncast) {
  Graph g;
  g.precision = blob::Precision::kFp16;
  int64_t x = input(g, {5}, 0);
  int64_t out = g.add_tensor(blob::DType::kFloat32, {5}, "out");
  g.ops.push_back(unary(U::kErfinv, x, out));
  g.outputs = {out};
  convert_precision(g);
  ASSERT_EQ(g.ops.size(), 1u);
  EXPECT_EQ(g.ops[0].at("x"), x);
  EXPECT_EQ(g.tensors[size_t(out)].dtype, blob::DType::kFloat32);
}

// silu folds into a matmul of at most 8 rows in a bf16 / fp16 program (the engine's GEMV applies
// it), and stays an elementwise op for larger matmuls or fp32 programs (cuBLASLt has no silu).
// Matmuls of at most 8 rows (the engine's GEMV) take the conv nets' activations, in every
// precision; wider ones keep those that cuBLASLt has no epilogue for as separate ops.
TEST(Passes, SiluAndSigmoidFoldIntoFewRowMatmuls) {
  struct Case {
    int64_t m;
    blob::Precision precision;
    U act;
    bool folds;
  };
  for (const Case& c : {Case{2, blob::Precision::kBf16, U::kSilu, true},
                        Case{2, blob::Precision::kFp16, U::kSigmoid, true},
                        Case{16, blob::Precision::kBf16, U::kSilu, false},
                        Case{16, blob::Precision::kFp32, U::kSigmoid, false},
                        Case{2, blob::Precision::kFp32, U::kSilu, true},
                        Case{8, blob::Precision::kTf32, U::kSigmoid, true}}) {
    Graph g;
    g.precision = c.precision;
    int64_t x = input(g, {c.m, 3}, 0);
    int64_t w = weight(g, {1, 2, 3, 4, 5, 6}, {3, 2});
    int64_t mm = g.add_tensor(blob::DType::kFloat32, {c.m, 2}, "mm");
    int64_t act = g.add_tensor(blob::DType::kFloat32, {c.m, 2}, "act");
    g.ops.push_back(make_op(blob::Opcode::kMatmul,
                            {{x}, {w}, {kNoTensor}, {mm}, {1}, {c.m}, {2}, {3}, {0}, {0}, {0}, {0},
                             {0}, {0}, {double_bits(1.0)}, {double_bits(0.0)}, {0}, {kNoTensor}}));
    g.ops.push_back(unary(c.act, mm, act));
    g.outputs = {act};
    fuse_matmul_epilogues(g);
    ASSERT_EQ(g.ops.size(), c.folds ? 1u : 2u) << c.m << " " << int(c.precision);
    const blob::Epilogue want = c.act == U::kSilu ? blob::Epilogue::kSilu : blob::Epilogue::kSigmoid;
    EXPECT_EQ(g.ops[0].at("epilogue"), int64_t(c.folds ? want : blob::Epilogue::kNone));
  }
}

TEST(Passes, MatmulEpilogueAndDeadOps) {
  Graph g;
  int64_t x = input(g, {2, 3}, 0);
  int64_t w = weight(g, {1, 2, 3, 4, 5, 6}, {3, 2});
  int64_t mm = g.add_tensor(blob::DType::kFloat32, {2, 2}, "mm");
  int64_t act = g.add_tensor(blob::DType::kFloat32, {2, 2}, "act");
  int64_t dead = g.add_tensor(blob::DType::kFloat32, {2, 3}, "dead");
  g.ops.push_back(unary(U::kExp, x, dead));
  g.ops.push_back(make_op(blob::Opcode::kMatmul,
                          {{x}, {w}, {kNoTensor}, {mm}, {1}, {2}, {2}, {3}, {0}, {0}, {0}, {0},
                           {0}, {0}, {double_bits(1.0)}, {double_bits(0.0)}, {0}, {kNoTensor}}));
  g.ops.push_back(unary(U::kGeluTanh, mm, act));
  g.outputs = {act};
  eliminate_dead_ops(g);
  ASSERT_EQ(g.ops.size(), 2u);
  fuse_matmul_epilogues(g);
  ASSERT_EQ(g.ops.size(), 1u);
  EXPECT_EQ(g.ops[0].at("epilogue"), int64_t(blob::Epilogue::kGeluTanh));
  EXPECT_EQ(g.tensors[size_t(act)].alias_of, mm);
  finish_and_read_back(g);
  EXPECT_EQ(g.tensors.size(), 4u);   // x, w, mm (now the output), act; `dead` is gone
  EXPECT_EQ(g.arena_size, 0u);
}

}  // namespace
}  // namespace kiln::builder
