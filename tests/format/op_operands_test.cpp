// The blob reader on ops: opcodes, operand counts, tensor ids, kinds, shapes, dtypes and outputs.
#include "tests/format/reader_test_support.h"  // the standard headers the tests use, too

namespace kiln::engine {
namespace {

using namespace reader_test;

TEST(BlobReader, UnknownOpcodeFails) {
  // 0, the first code past the table (opcodes are 1..kMaxOpcode), and the largest.
  for (uint32_t opcode : {0u, blob::kMaxOpcode + 1, 0xFFFFFFFFu}) {
    BlobBuilder b = kitchen_sink();
    b.ops[4].opcode = opcode;
    EXPECT_TRUE(
        fails_with(b.build(), Error::InvalidProgram, "op 4: opcode " + std::to_string(opcode)));
  }
}

TEST(BlobReader, OperandRangeMustBeInThePool) {
  BlobBuilder b = kitchen_sink();
  b.ops[2].first_operand = b.operands.size() - 2;
  EXPECT_TRUE(fails_with(b.build(), Error::InvalidProgram, "past the operand pool"));
  b = kitchen_sink();
  b.ops[2].first_operand = 0xFFFFFFFFFFFFFFF0ull;
  EXPECT_TRUE(fails_with(b.build(), Error::InvalidProgram, "first_operand"));
}

TEST(BlobReader, EveryOpcodeChecksItsOperandCount) {
  const size_t num_ops = kitchen_sink().ops.size();
  for (size_t op = 0; op < num_ops; ++op) {
    for (int delta : {-1, +1}) {
      BlobBuilder b = kitchen_sink();
      if (delta > 0 && op + 1 == num_ops) {
        b.operands.push_back(0);  // room for the extra operand
      }
      b.ops[op].num_operands = static_cast<uint32_t>(int64_t{b.ops[op].num_operands} + delta);
      const std::string needle = "op " + std::to_string(op) + " (";
      EXPECT_TRUE(fails_with(b.build(), Error::InvalidProgram, needle)) << "op " << op;
      EXPECT_TRUE(fails_with(b.build(), Error::InvalidProgram, "operands, its layout needs"))
          << "op " << op << " delta " << delta;
    }
  }
}

TEST(BlobReader, RankDependentCountsUseTheRankOperand) {
  BlobBuilder b = kitchen_sink();
  b.operands[operand_at(b, 11, 2)] = 3;  // copy claims rank 3 but carries rank-2 arrays
  EXPECT_TRUE(fails_with(b.build(), Error::InvalidProgram, "its layout needs 14 (5 + 3 * rank)"));
  b = kitchen_sink();
  b.operands[operand_at(b, 11, 2)] = 9;
  EXPECT_TRUE(fails_with(b.build(), Error::InvalidProgram, "operand 2 (rank) is 9"));
  b = kitchen_sink();
  b.operands[operand_at(b, 1, 6)] = -1;
  EXPECT_TRUE(fails_with(b.build(), Error::InvalidProgram, "operand 6 (rank) is -1"));
}

TEST(BlobReader, TensorOperandsMustBeValidIds) {
  BlobBuilder b = kitchen_sink();
  b.operands[operand_at(b, 2, 1)] = 99;  // unary x
  EXPECT_TRUE(
      fails_with(b.build(), Error::InvalidProgram, "op 2 (unary): operand 1 (x) is tensor id 99"));
  b = kitchen_sink();
  b.operands[operand_at(b, 0, 0)] = -1;  // matmul a is not optional
  EXPECT_TRUE(fails_with(b.build(), Error::InvalidProgram, "operand 0 (a) is tensor id -1"));
  b = kitchen_sink();
  b.operands[operand_at(b, 0, 2)] = -2;  // bias: -1 is none, -2 is nothing
  EXPECT_TRUE(fails_with(b.build(), Error::InvalidProgram, "operand 2 (bias) is tensor id -2"));
  b = kitchen_sink();
  b.operands[operand_at(b, 0, 2)] = -1;  // no bias is fine
  std::string why;
  EXPECT_TRUE(read_blob(b.build().data(), b.build().size(), &why).ok()) << why;
}

TEST(BlobReader, UnknownEnumKindsFail) {
  struct Case {
    size_t op, operand;
    int64_t value;
    const char* needle;
  };
  const Case cases[] = {
      {1, 0, 18, "operand 0 (kind) is 18, not a known BinaryKind"},
      {2, 0, 32, "operand 0 (kind) is 32, not a known UnaryKind"},
      {2, 0, -1, "not a known UnaryKind"},
      {6, 0, 8, "not a known ReduceKind"},
      {10, 0, 2, "not a known PoolKind"},
      {0, 16, 8, "operand 16 (epilogue) is 8, not a known Epilogue"},
      {0, 8, 2, "operand 8 (trans_a) is 2"},
      {4, 5, 3, "operand 5 (is_log) is 3"},
      {10, 17, -1, "count_include_pad"},
  };
  for (const Case& c : cases) {
    BlobBuilder b = kitchen_sink();
    b.operands[operand_at(b, c.op, c.operand)] = c.value;
    EXPECT_TRUE(fails_with(b.build(), Error::InvalidProgram, c.needle)) << c.needle;
  }
}

TEST(BlobReader, OpShapesMustAgreeWithTheirTensors) {
  struct Case {
    size_t op, operand;
    int64_t value;
    const char* needle;
  };
  const Case cases[] = {
      {0, 7, 4, "a (tensor"},                 // matmul K = 4: reads past a
      {0, 5, 3, "a (tensor 0, 6 elements)"},  // M = 3 reads past a
      {0, 10, 2, "a (tensor"},                // a_batch_stride with batch 1 is fine...
      {0, 13, 2, "bias (tensor"},             // bias col stride 2 reads past the bias
      {1, 8, 5, "out (tensor"},               // binary sizes [2, 5]
      {1, 11, 1, "b (tensor"},                // b row stride 1 instead of 0
      {3, 5, 3, "out (tensor"},               // where sizes
      {4, 3, 5, "gives 10"},                  // softmax dim
      {5, 5, 3, "rows * cols gives 6"},       // layer_norm cols
      {6, 4, 3, "x (tensor"},                 // reduce
      {7, 5, 9, "weight (tensor"},            // embedding vocab
      {9, 18, 4, "H_out x W_out is 4 x 5"},   // conv output size
      {9, 17, 2, "groups (2) must divide"},   // conv groups vs C_out = 3
      {10, 15, 4, "H_out x W_out is 4 x 2"},  // pool output size
      {11, 4, 9, "outside"},                  // copy in_offset 9 reads past t0
      {11, 3, -1, "sizes[0]) is -1"},         // copy negative size
      {11, 5, 4, "outside"},                  // copy in_strides[0] = 4
      {11, 5, std::numeric_limits<int64_t>::max(), "overflows"},
      {11, 7, -1, "outside"},  // copy out_offset -1
  };
  for (const Case& c : cases) {
    BlobBuilder b = kitchen_sink();
    b.operands[operand_at(b, c.op, c.operand)] = c.value;
    if (c.op == 0 && c.operand == 10) {
      // batch 2 with stride 2 overlaps rows inside `a`, legal, but reaches past its end.
      b.operands[operand_at(b, 0, 4)] = 2;
    }
    EXPECT_TRUE(fails_with(b.build(), Error::InvalidProgram, c.needle))
        << "op " << c.op << " operand " << c.operand;
  }
}

TEST(BlobReader, MatmulResidualMustMatchOut) {
  Sink s;
  BlobBuilder valid = kitchen_sink(&s);
  const size_t residual = operand_at(valid, 0, 17);
  {
    BlobBuilder b = valid;
    b.operands[residual] = s.t8;  // [2, 4] float32 like out: accepted
    std::string why;
    const Bytes bytes = b.build();
    auto graph = read_blob(bytes.data(), bytes.size(), &why);
    ASSERT_TRUE(graph.ok()) << why;
    EXPECT_EQ(std::get<MatmulArgs>(graph->ops[0].args).residual, s.t8);
  }
  const std::pair<int64_t, const char*> bad[] = {
      {s.t7, "residual (tensor"},           // [4, 4]: 16 elements, out has 8
      {s.idx, "they must match"},           // Int64
      {s.t0, "out"},                        // out itself: an op never writes what it reads
      {int64_t(valid.tensors.size()), "residual"},
  };
  for (const auto& [value, needle] : bad) {
    BlobBuilder b = valid;
    b.operands[residual] = value;
    EXPECT_TRUE(fails_with(b.build(), Error::InvalidProgram, needle)) << needle;
  }
}

TEST(BlobReader, OpDtypesMustBeSupported) {
  Sink s;
  BlobBuilder b = kitchen_sink(&s);
  b.tensors[s.idx].dtype = static_cast<uint32_t>(DType::kFloat32);
  b.tensors[s.idx].nbytes = 16;
  EXPECT_TRUE(fails_with(b.build(), Error::InvalidProgram, "is Float32, expected Int64 or Int32"));

  b = kitchen_sink(&s);
  b.tensors[s.idx].dtype = static_cast<uint32_t>(DType::kInt32);
  b.tensors[s.idx].nbytes = 16;
  std::string why;
  const Bytes int32_indices = b.build();
  EXPECT_TRUE(read_blob(int32_indices.data(), int32_indices.size(), &why).ok()) << why;

  b = kitchen_sink(&s);
  b.tensors[s.cond].dtype = static_cast<uint32_t>(DType::kFloat32);
  b.tensors[s.cond].nbytes = 32;
  EXPECT_TRUE(
      fails_with(b.build(), Error::InvalidProgram, "cond (tensor 2) is Float32, expected Bool"));

  b = kitchen_sink(&s);
  b.operands[operand_at(b, 1, 0)] = static_cast<int64_t>(blob::BinaryKind::kEq);
  EXPECT_TRUE(fails_with(b.build(), Error::InvalidProgram, "expected Bool for a comparison"));

  b = kitchen_sink(&s);
  b.tensors[s.t4].dtype = static_cast<uint32_t>(DType::kFloat16);
  b.tensors[s.t4].nbytes = 16;
  EXPECT_TRUE(fails_with(b.build(), Error::InvalidProgram, "they must match"));

  b = kitchen_sink(&s);
  b.tensors[s.t0].dtype = static_cast<uint32_t>(DType::kInt32);
  EXPECT_TRUE(fails_with(b.build(), Error::InvalidProgram, "out (tensor"));
}

TEST(BlobReader, OpsWriteOnlyArenaOrOutputTensors) {
  Sink s;
  BlobBuilder b = kitchen_sink(&s);
  b.operands[operand_at(b, 8, 0)] = s.w;  // fill into a weight
  EXPECT_TRUE(fails_with(b.build(), Error::InvalidProgram, "whose storage is Weight"));
  b = kitchen_sink(&s);
  b.operands[operand_at(b, 8, 0)] = s.x;  // fill into an input
  EXPECT_TRUE(fails_with(b.build(), Error::InvalidProgram, "whose storage is Input"));
}

TEST(BlobReader, OutputMustNotOverlapAnInput) {
  Sink s;
  BlobBuilder b = kitchen_sink(&s);
  b.tensors[s.t2].offset = b.tensors[s.t1].offset;  // relu in place
  EXPECT_TRUE(fails_with(b.build(), Error::InvalidProgram, "op 2 (unary): output out"));
  EXPECT_TRUE(fails_with(b.build(), Error::InvalidProgram, "overlaps input x"));
  b = kitchen_sink(&s);
  b.operands[operand_at(b, 2, 1)] = s.t2;  // relu reads its own output
  EXPECT_TRUE(fails_with(b.build(), Error::InvalidProgram, "overlaps input x"));
}

TEST(BlobReader, AveragePoolingHasNoDilation) {
  BlobBuilder b = kitchen_sink();
  b.operands[operand_at(b, 10, 0)] = static_cast<int64_t>(blob::PoolKind::kAvg);
  b.operands[operand_at(b, 10, 13)] = 2;
  EXPECT_TRUE(fails_with(b.build(), Error::InvalidProgram, "average pooling has no dilation"));
}

TEST(BlobReader, EveryOutputMustBeWritten) {
  BlobBuilder b;
  const int64_t x = b.input(DType::kFloat32, {4});
  const int64_t y = b.output(DType::kFloat32, {4});
  b.output(DType::kFloat32, {4});  // output 1: nothing writes it
  b.unary(blob::UnaryKind::kRelu, x, y);
  EXPECT_TRUE(fails_with(b.build(), Error::InvalidProgram, "output 1 (tensor 2) is never written"));
}

TEST(BlobReader, EmptyAxisAmaxIsRejected) {
  BlobBuilder b;
  const int64_t x = b.input(DType::kFloat32, {3, 0});
  const int64_t y = b.output(DType::kFloat32, {3});
  b.reduce(blob::ReduceKind::kAmax, x, y, 3, 0, 1);
  EXPECT_TRUE(fails_with(b.build(), Error::InvalidProgram, "empty axis"));
}



// kQuantMatmul's packed weight and scales must agree with N, K, bits and group_size.
TEST(BlobReader, QuantMatmulWeightAndScalesMustMatchTheShape) {
  struct Case {
    DType weight_dtype;
    std::vector<int64_t> weight_sizes;
    DType scales_dtype;
    std::vector<int64_t> scales_sizes;
    int64_t bits, group_size;
    const char* needle;  // nullptr: valid
  };
  // K = 40: an int8 row is 40 bytes, padded to 48 (12 words); int4 with K = 64: 32 bytes (8).
  const Case cases[] = {
      {DType::kInt32, {3, 12}, DType::kFloat32, {3}, 8, 40, nullptr},
      {DType::kInt32, {3, 10}, DType::kFloat32, {3}, 8, 40, "N * row_words"},
      {DType::kFloat32, {3, 12}, DType::kFloat32, {3}, 8, 40, "expected Int32"},
      {DType::kInt32, {3, 12}, DType::kFloat32, {4}, 8, 40, "N * K / group_size gives 3"},
      {DType::kInt32, {3, 12}, DType::kBFloat16, {3}, 8, 40, "is BFloat16, expected Float32"},
      {DType::kInt32, {3, 12}, DType::kFloat32, {3, 5}, 8, 8,
       "group_size 8 must be K (40) or a multiple of 32 dividing K"},
      {DType::kInt32, {3, 12}, DType::kFloat32, {3}, 6, 40, "bits is 6: 8 (int8) or 4 (int4)"},
  };
  for (const Case& c : cases) {
    BlobBuilder b;
    const std::vector<uint8_t> zeros(4096, 0);
    const int64_t x = b.input(DType::kFloat32, {2, 40});
    const int64_t w = b.weight(c.weight_dtype, c.weight_sizes, zeros.data());
    const int64_t s = b.weight(c.scales_dtype, c.scales_sizes, zeros.data());
    const int64_t out = b.output(DType::kFloat32, {2, 3});
    BlobBuilder::QuantMatmul q;
    q.x = x, q.weight = w, q.scales = s, q.out = out, q.m = 2, q.n = 3, q.k = 40;
    q.bits = c.bits, q.group_size = c.group_size;
    b.quant_matmul(q);
    const Bytes bytes = b.build();
    if (c.needle == nullptr) {
      std::string why;
      EXPECT_TRUE(read_blob(bytes.data(), bytes.size(), &why).ok()) << why;
    } else {
      EXPECT_TRUE(fails_with(bytes, Error::InvalidProgram, c.needle)) << c.needle;
    }
  }
  // int4 in groups of 32: K = 64 packs into 8 words a row, two scales a row.
  BlobBuilder b;
  const std::vector<uint8_t> zeros(4096, 0);
  BlobBuilder::QuantMatmul q;
  q.x = b.input(DType::kBFloat16, {1, 64});
  q.weight = b.weight(DType::kInt32, {3, 8}, zeros.data());
  q.scales = b.weight(DType::kFloat32, {3, 2}, zeros.data());
  q.out = b.output(DType::kBFloat16, {1, 3});
  q.m = 1, q.n = 3, q.k = 64, q.bits = 4, q.group_size = 32;
  b.quant_matmul(q);
  const Bytes bytes = b.build();
  std::string why;
  EXPECT_TRUE(read_blob(bytes.data(), bytes.size(), &why).ok()) << why;
}

// kScatter (index_put): the write stays inside out for every in-range index, the indices are
// integers, and there are 1..kMaxScatterIndices of them.
TEST(BlobReader, ScatterChecksItsIndicesAndWhereItWrites) {
  enum class Bad { kNothing, kDimSize, kIndexDtype, kIndexExtent, kIndexCount };
  auto blob = [](Bad bad) {
    BlobBuilder b;
    const int64_t x = b.input(DType::kFloat32, {4, 5});
    const int64_t v = b.input(DType::kFloat32, {3});
    const int64_t i = b.input(bad == Bad::kIndexDtype ? DType::kFloat32 : DType::kInt64, {3});
    const int64_t j = b.input(DType::kInt32, {bad == Bad::kIndexExtent ? int64_t{2} : 3});
    const int64_t out = b.output(DType::kFloat32, {4, 5});
    b.copy(x, out, {20}, 0, {1}, 0, {1});
    const int64_t dim0 = bad == Bad::kDimSize ? 5 : 4;
    if (bad == Bad::kIndexCount) {
      b.scatter(v, out, {3}, {0}, {1}, {}, {}, {}, {}, false);
    } else {
      b.scatter(v, out, {3}, {0}, {1}, {i, j}, {1, 1}, {5, 1}, {dim0, 5}, true);
    }
    return b.build();
  };
  std::string why;
  const Bytes good = blob(Bad::kNothing);
  EXPECT_TRUE(read_blob(good.data(), good.size(), &why).ok()) << why;
  EXPECT_TRUE(fails_with(blob(Bad::kDimSize), Error::InvalidProgram,
                         "out (tensor 4, 20 elements) is addressed at element offsets [0, 24]"));
  EXPECT_TRUE(fails_with(blob(Bad::kIndexDtype), Error::InvalidProgram,
                         "an index (tensor 2) is Float32, expected Int64 or Int32"));
  EXPECT_TRUE(fails_with(blob(Bad::kIndexExtent), Error::InvalidProgram,
                         "an index (tensor 3, 2 elements) is addressed"));
  EXPECT_TRUE(fails_with(blob(Bad::kIndexCount), Error::InvalidProgram, "num_indices"));
}

}  // namespace
}  // namespace kiln::engine
