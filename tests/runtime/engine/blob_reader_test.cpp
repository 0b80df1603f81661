#include "runtime/engine/blob_reader.h"

#include <executorch/runtime/platform/platform.h>
#include <executorch/runtime/platform/runtime.h>
#include <gtest/gtest.h>

#include <cstddef>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "tests/runtime/engine/blob_builder.h"
#include "tests/runtime/engine/log_capture.h"

namespace kiln::engine {
namespace {

using executorch::runtime::Error;
using testing::BlobBuilder;
using Bytes = std::vector<uint8_t>;
using blob::DType;

// Captures what the engine logs, to prove the message reaches the ExecuTorch log too.
std::string& g_log = testing::captured_log();
const auto* const kLog = ::testing::AddGlobalTestEnvironment(new testing::LogCaptureEnvironment);

template <typename T>
void patch(Bytes& b, size_t offset, T value) {
  std::memcpy(b.data() + offset, &value, sizeof(value));
}

#define HEADER_FIELD(name) offsetof(blob::Header, name)

::testing::AssertionResult fails_with(const Bytes& bytes, Error code, const std::string& needle,
                                      size_t size = std::numeric_limits<size_t>::max()) {
  std::string why;
  const size_t n = size == std::numeric_limits<size_t>::max() ? bytes.size() : size;
  auto result = read_blob(bytes.data(), n, &why);
  if (result.ok()) {
    return ::testing::AssertionFailure()
           << "accepted; expected error containing '" << needle << "'";
  }
  if (result.error() != code) {
    return ::testing::AssertionFailure()
           << "error " << executorch::runtime::to_string(result.error()) << ", expected "
           << executorch::runtime::to_string(code) << ": " << why;
  }
  if (why.find(needle) == std::string::npos) {
    return ::testing::AssertionFailure() << "message lacks '" << needle << "': " << why;
  }
  return ::testing::AssertionSuccess() << why;
}

// Tensor ids of the kitchen-sink blob, for tests that corrupt a specific one.
struct Sink {
  int64_t x, idx, cond, img, w, bias, emb, ln_w, conv_w, conv_b;
  int64_t t0, t1, t2, t3, t4, t5, t7, t8, t9, t10, y0, y1;
};

// One valid op of every opcode, wired into a small graph.
BlobBuilder kitchen_sink(Sink* ids = nullptr) {
  BlobBuilder b;
  Sink s{};
  const std::vector<float> w(3 * 4, 0.5f), bias(4, 0.25f), emb(10 * 4, 1.0f), ln_w(4, 1.0f),
      conv_w(3 * 2 * 3 * 3, 0.1f), conv_b(3, 0.0f);
  s.x = b.input(DType::kFloat32, {2, 3});
  s.idx = b.input(DType::kInt64, {4});
  s.cond = b.input(DType::kBool, {2, 4});
  s.img = b.input(DType::kFloat32, {1, 2, 5, 5});
  s.w = b.weight(DType::kFloat32, {3, 4}, w.data());
  s.bias = b.weight(DType::kFloat32, {4}, bias.data());
  s.emb = b.weight(DType::kFloat32, {10, 4}, emb.data());
  s.ln_w = b.weight(DType::kFloat32, {4}, ln_w.data());
  s.conv_w = b.weight(DType::kFloat32, {3, 2, 3, 3}, conv_w.data());
  s.conv_b = b.weight(DType::kFloat32, {3}, conv_b.data());
  s.t0 = b.arena(DType::kFloat32, {2, 4});
  s.t1 = b.arena(DType::kFloat32, {2, 4});
  s.t2 = b.arena(DType::kFloat32, {2, 4});
  s.t3 = b.arena(DType::kFloat32, {2, 4});
  s.t4 = b.arena(DType::kFloat32, {2, 4});
  s.t5 = b.arena(DType::kFloat32, {2, 4});
  s.t7 = b.arena(DType::kFloat32, {4, 4});
  s.t8 = b.arena(DType::kFloat32, {2, 4});
  s.t9 = b.arena(DType::kFloat32, {1, 3, 5, 5});
  s.t10 = b.arena(DType::kFloat32, {1, 3, 2, 2});
  s.y0 = b.output(DType::kFloat32, {2});
  s.y1 = b.output(DType::kFloat32, {4, 2});

  BlobBuilder::Matmul mm;
  mm.a = s.x, mm.b = s.w, mm.bias = s.bias, mm.out = s.t0, mm.m = 2, mm.n = 4, mm.k = 3;
  b.matmul(mm);                                                                            // op 0
  b.binary(blob::BinaryKind::kAdd, s.t0, s.bias, s.t1, 1.0, 0.0, {2, 4}, {4, 1}, {0, 1});  // 1
  b.unary(blob::UnaryKind::kRelu, s.t1, s.t2);                                             // op 2
  b.where(s.cond, s.t2, s.t1, s.t3, {2, 4}, {4, 1}, {4, 1}, {4, 1});                       // op 3
  b.softmax(s.t3, s.t4, 2, 4, 1, false);                                                   // op 4
  b.layer_norm(s.t4, s.ln_w, -1, s.t5, 2, 4, 1e-5);                                        // op 5
  b.reduce(blob::ReduceKind::kSum, s.t5, s.y0, 2, 4, 1);                                   // op 6
  b.embedding(s.emb, s.idx, s.t7, 4, 4, 10);                                               // op 7
  b.fill(s.t8, 1.5);                                                                       // op 8
  BlobBuilder::Conv2d c;
  c.x = s.img, c.weight = s.conv_w, c.bias = s.conv_b, c.out = s.t9;
  c.n = 1, c.c_in = 2, c.h = 5, c.w = 5, c.c_out = 3, c.kh = 3, c.kw = 3, c.pad_h = 1, c.pad_w = 1;
  b.conv2d(c);  // op 9
  BlobBuilder::Pool2d p;
  p.x = s.t9, p.out = s.t10, p.n = 1, p.c = 3, p.h = 5, p.w = 5, p.kh = 2, p.kw = 2;
  p.stride_h = 2, p.stride_w = 2;
  b.pool2d(p);                                       // op 10
  b.copy(s.t0, s.y1, {4, 2}, 0, {1, 4}, 0, {2, 1});  // op 11
  if (ids != nullptr) *ids = s;
  return b;
}

// Index into the operand pool of operand `i` of op `op`.
size_t operand_at(const BlobBuilder& b, size_t op, size_t i) {
  return static_cast<size_t>(b.ops[op].first_operand) + i;
}

TEST(BlobReader, ValidBlobRoundTrips) {
  Sink s;
  BlobBuilder b = kitchen_sink(&s);
  const Bytes bytes = b.build();
  std::string why;
  auto graph = read_blob(bytes.data(), bytes.size(), &why);
  ASSERT_TRUE(graph.ok()) << why;
  EXPECT_EQ(graph->tensors.size(), b.tensors.size());
  EXPECT_EQ(graph->ops.size(), 12u);
  EXPECT_EQ(graph->inputs, (std::vector<int64_t>{s.x, s.idx, s.cond, s.img}));
  EXPECT_EQ(graph->outputs, (std::vector<int64_t>{s.y0, s.y1}));
  EXPECT_EQ(graph->arena_size, b.arena_size());
  EXPECT_EQ(graph->weights, bytes.data() + b.layout().weights_offset);
  EXPECT_EQ(graph->weights_size, b.weights.size());
  EXPECT_EQ(graph->precision, blob::Precision::kFp32);

  const Tensor& conv_w = graph->tensors[s.conv_w];
  EXPECT_EQ(conv_w.dtype, DType::kFloat32);
  EXPECT_EQ(conv_w.rank, 4u);
  EXPECT_EQ(conv_w.numel, 54);
  EXPECT_EQ(conv_w.storage, blob::Storage::kWeight);
  EXPECT_EQ(conv_w.offset % blob::kWeightAlignment, 0u);

  const auto& mm = std::get<MatmulArgs>(graph->ops[0].args);
  EXPECT_EQ(graph->ops[0].opcode, blob::Opcode::kMatmul);
  EXPECT_EQ(mm.m, 2);
  EXPECT_EQ(mm.n, 4);
  EXPECT_EQ(mm.k, 3);
  EXPECT_EQ(mm.bias, s.bias);
  EXPECT_EQ(mm.beta, 1.0);
  const auto& bin = std::get<BinaryArgs>(graph->ops[1].args);
  EXPECT_EQ(bin.rank, 2u);
  EXPECT_EQ(bin.b_strides[0], 0);
  EXPECT_EQ(std::get<LayerNormArgs>(graph->ops[5].args).weight, s.ln_w);
  EXPECT_EQ(std::get<LayerNormArgs>(graph->ops[5].args).bias, kNoTensor);
  EXPECT_DOUBLE_EQ(std::get<LayerNormArgs>(graph->ops[5].args).eps, 1e-5);
  EXPECT_DOUBLE_EQ(std::get<FillArgs>(graph->ops[8].args).value, 1.5);
  EXPECT_EQ(std::get<Conv2dArgs>(graph->ops[9].args).h_out, 5);
  EXPECT_EQ(std::get<Pool2dArgs>(graph->ops[10].args).h_out, 2);
  const auto& cp = std::get<CopyArgs>(graph->ops[11].args);
  EXPECT_EQ(cp.in_strides[0], 1);
  EXPECT_EQ(cp.in_strides[1], 4);
}

TEST(BlobReader, EmptyGraphIsValid) {
  BlobBuilder b;
  const Bytes bytes = b.build();
  std::string why;
  auto graph = read_blob(bytes.data(), bytes.size(), &why);
  ASSERT_TRUE(graph.ok()) << why;
  EXPECT_TRUE(graph->tensors.empty());
  EXPECT_TRUE(graph->ops.empty());
  EXPECT_EQ(graph->weights, nullptr);
}

TEST(BlobReader, MessageAlsoGoesToTheLog) {
  Bytes bytes = kitchen_sink().build();
  patch<uint32_t>(bytes, HEADER_FIELD(header_size), 64);
  g_log.clear();
  EXPECT_TRUE(fails_with(bytes, Error::InvalidProgram, "header_size is 64"));
  EXPECT_NE(g_log.find("header_size is 64"), std::string::npos) << g_log;
}

TEST(BlobReader, NullOrTinyBufferIsNotABlob) {
  std::string why;
  auto r = read_blob(nullptr, 0, &why);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.error(), Error::InvalidProgram);
  EXPECT_NE(why.find("not a Kiln engine blob"), std::string::npos) << why;
  const Bytes four = {'K', 'I', 'L', 'N'};
  EXPECT_TRUE(fails_with(four, Error::InvalidProgram, "not a Kiln engine blob"));
}

TEST(BlobReader, WrongMagicIsNotABlob) {
  Bytes bytes = kitchen_sink().build();
  bytes[3] = 'X';
  EXPECT_TRUE(fails_with(bytes, Error::InvalidProgram, "not a Kiln engine blob"));
}

TEST(BlobReader, OtherFormatVersionIsIncompatible) {
  Bytes bytes = kitchen_sink().build();
  // A blob from the previous Kiln (version 1: kMatmul without its residual operand).
  patch<uint32_t>(bytes, HEADER_FIELD(format_version), 1);
  EXPECT_TRUE(fails_with(bytes, Error::DelegateInvalidCompatibility, "format_version is 1"));
  EXPECT_TRUE(fails_with(bytes, Error::DelegateInvalidCompatibility, "re-export"));
  EXPECT_TRUE(fails_with(bytes, Error::DelegateInvalidCompatibility, "reads format version 2"));
  patch<uint32_t>(bytes, HEADER_FIELD(format_version), 0);
  EXPECT_TRUE(fails_with(bytes, Error::DelegateInvalidCompatibility, "format_version is 0"));
  // A newer blob is reported as such even when its header is shorter than v1's.
  patch<uint32_t>(bytes, HEADER_FIELD(format_version), 7);
  EXPECT_TRUE(fails_with(bytes, Error::DelegateInvalidCompatibility, "format_version is 7", 16));
}

TEST(BlobReader, TruncationAtEverySectionBoundaryFails) {
  BlobBuilder b = kitchen_sink();
  const Bytes bytes = b.build();
  const auto& l = b.layout();
  const size_t cuts[] = {0,
                         1,
                         7,
                         8,
                         12,
                         64,
                         blob::kHeaderSize - 1,
                         blob::kHeaderSize,
                         l.ops_offset,
                         l.operands_offset,
                         l.io_offset,
                         l.weights_offset,
                         l.blob_size - 1};
  for (size_t cut : cuts) {
    const char* needle = cut < 8                   ? "not a Kiln engine blob"
                         : cut < blob::kHeaderSize ? "truncated"
                                                   : "blob_size";
    EXPECT_TRUE(fails_with(bytes, Error::InvalidProgram, needle, cut)) << "cut at " << cut;
  }
}

TEST(BlobReader, TruncationWithMatchingBlobSizeNamesTheSection) {
  BlobBuilder b = kitchen_sink();
  const Bytes bytes = b.build();
  const auto& l = b.layout();
  const std::pair<size_t, const char*> cuts[] = {
      {l.tensors_offset + 8, "tensors_offset"},   {l.ops_offset + 8, "ops_offset"},
      {l.operands_offset + 8, "operands_offset"}, {l.io_offset + 2, "io_offset"},
      {l.weights_offset + 8, "weights_offset"},
  };
  for (const auto& [cut, field] : cuts) {
    Bytes shorter(bytes.begin(), bytes.begin() + static_cast<ptrdiff_t>(cut));
    patch<uint64_t>(shorter, HEADER_FIELD(blob_size), cut);
    EXPECT_TRUE(fails_with(shorter, Error::InvalidProgram, field)) << "cut at " << cut;
  }
}

TEST(BlobReader, HeaderSizeMustBeV1) {
  Bytes bytes = kitchen_sink().build();
  patch<uint32_t>(bytes, HEADER_FIELD(header_size), 256);
  EXPECT_TRUE(fails_with(bytes, Error::InvalidProgram, "header_size is 256"));
}

TEST(BlobReader, BlobSizeMustMatchTheBuffer) {
  Bytes bytes = kitchen_sink().build();
  patch<uint64_t>(bytes, HEADER_FIELD(blob_size), bytes.size() + 1);
  EXPECT_TRUE(fails_with(bytes, Error::InvalidProgram, "blob_size"));
  Bytes padded = kitchen_sink().build();
  padded.resize(padded.size() + 64);
  EXPECT_TRUE(fails_with(padded, Error::InvalidProgram, "blob_size"));
}

TEST(BlobReader, ReservedHeaderFieldsMustBeZero) {
  Bytes bytes = kitchen_sink().build();
  patch<uint32_t>(bytes, HEADER_FIELD(flags), 4);
  EXPECT_TRUE(fails_with(bytes, Error::InvalidProgram, "flags"));
  bytes = kitchen_sink().build();
  bytes[HEADER_FIELD(reserved) + 3] = 1;
  EXPECT_TRUE(fails_with(bytes, Error::InvalidProgram, "reserved[3]"));
  bytes = kitchen_sink().build();
  patch<uint32_t>(bytes, HEADER_FIELD(precision), 4);
  EXPECT_TRUE(fails_with(bytes, Error::InvalidProgram, "precision is 4"));
}

TEST(BlobReader, SectionOffsetsOutOfRangeNameTheField) {
  const std::pair<size_t, const char*> fields[] = {
      {HEADER_FIELD(tensors_offset), "tensors_offset"},   {HEADER_FIELD(ops_offset), "ops_offset"},
      {HEADER_FIELD(operands_offset), "operands_offset"}, {HEADER_FIELD(io_offset), "io_offset"},
      {HEADER_FIELD(weights_offset), "weights_offset"},
  };
  for (const auto& [at, field] : fields) {
    for (uint64_t bad :
         {uint64_t{0xFFFFFFFFFFFFFFF0ull}, uint64_t{0xFFFFFFFFFFFFFFFFull}, uint64_t{1} << 40}) {
      Bytes bytes = kitchen_sink().build();
      patch<uint64_t>(bytes, at, bad);
      EXPECT_TRUE(fails_with(bytes, Error::InvalidProgram, field)) << field << " = " << bad;
    }
    // Inside the blob, but the section runs past its end.
    Bytes bytes = kitchen_sink().build();
    patch<uint64_t>(bytes, at, bytes.size() - 64);
    EXPECT_TRUE(fails_with(bytes, Error::InvalidProgram, field)) << field << " near the end";
  }
}

TEST(BlobReader, CountsThatOverrunTheBlobFail) {
  Bytes bytes = kitchen_sink().build();
  patch<uint32_t>(bytes, HEADER_FIELD(num_tensors), 0xFFFFFFFFu);
  EXPECT_TRUE(fails_with(bytes, Error::InvalidProgram, "tensors_offset"));
  bytes = kitchen_sink().build();
  patch<uint64_t>(bytes, HEADER_FIELD(num_operands), 0xFFFFFFFFFFFFFFF0ull);
  EXPECT_TRUE(fails_with(bytes, Error::InvalidProgram, "num_operands"));
  bytes = kitchen_sink().build();
  patch<uint64_t>(bytes, HEADER_FIELD(num_operands), 0x1FFFFFFFFFFFFFFFull);
  EXPECT_TRUE(fails_with(bytes, Error::InvalidProgram, "operands_offset"));
  bytes = kitchen_sink().build();
  patch<uint64_t>(bytes, HEADER_FIELD(weights_size), 0xFFFFFFFFFFFFFFF0ull);
  EXPECT_TRUE(fails_with(bytes, Error::InvalidProgram, "weights_offset"));
  bytes = kitchen_sink().build();
  patch<uint32_t>(bytes, HEADER_FIELD(num_outputs), 0xFFFFFFFFu);
  EXPECT_TRUE(fails_with(bytes, Error::InvalidProgram, "io_offset"));
}

TEST(BlobReader, MisalignedSectionFails) {
  BlobBuilder b = kitchen_sink();
  Bytes bytes = b.build();
  patch<uint64_t>(bytes, HEADER_FIELD(weights_offset), b.layout().weights_offset + 8);
  patch<uint64_t>(bytes, HEADER_FIELD(weights_size), b.weights.size() - 8);
  EXPECT_TRUE(fails_with(bytes, Error::InvalidProgram, "weights_offset"));
  EXPECT_TRUE(fails_with(bytes, Error::InvalidProgram, "aligned"));
  bytes = b.build();
  patch<uint64_t>(bytes, HEADER_FIELD(operands_offset), b.layout().operands_offset + 4);
  EXPECT_TRUE(fails_with(bytes, Error::InvalidProgram, "operands_offset ("));
}

TEST(BlobReader, OverlappingSectionsFail) {
  BlobBuilder b = kitchen_sink();
  Bytes bytes = b.build();
  patch<uint64_t>(bytes, HEADER_FIELD(operands_offset), b.layout().ops_offset);
  EXPECT_TRUE(fails_with(bytes, Error::InvalidProgram, "overlap"));
  EXPECT_TRUE(fails_with(bytes, Error::InvalidProgram, "operands_offset"));
  bytes = b.build();
  patch<uint64_t>(bytes, HEADER_FIELD(tensors_offset), 64);
  EXPECT_TRUE(fails_with(bytes, Error::InvalidProgram, "header"));
}

TEST(BlobReader, BadTensorRecordsNameTheTensorAndField) {
  struct Case {
    const char* name;
    void (*corrupt)(blob::TensorRecord&);
    const char* needle;
  };
  const Case cases[] = {
      {"unknown dtype", [](blob::TensorRecord& r) { r.dtype = 7; }, "dtype 7"},
      {"rank 9", [](blob::TensorRecord& r) { r.rank = 9; }, "rank 9"},
      {"negative size", [](blob::TensorRecord& r) { r.sizes[1] = -2; }, "sizes[1] is -2"},
      {"size past rank", [](blob::TensorRecord& r) { r.sizes[5] = 3; }, "sizes[5] is 3 beyond"},
      {"nbytes", [](blob::TensorRecord& r) { r.nbytes += 4; }, "nbytes is"},
      {"unknown storage", [](blob::TensorRecord& r) { r.storage = 5; }, "storage 5"},
      {"reserved", [](blob::TensorRecord& r) { r.reserved = 1; }, "reserved is 1"},
      {"numel overflow",
       [](blob::TensorRecord& r) {
         r.sizes[0] = int64_t{1} << 40;
         r.sizes[1] = int64_t{1} << 40;
       },
       "element count overflows"},
      {"bytes overflow",
       [](blob::TensorRecord& r) {
         r.sizes[0] = int64_t{1} << 31;
         r.sizes[1] = int64_t{1} << 31;
       },
       "byte size overflows"},
  };
  for (const Case& c : cases) {
    Sink s;
    BlobBuilder b = kitchen_sink(&s);
    c.corrupt(b.tensors[s.w]);
    const std::string needle = "tensor " + std::to_string(s.w);
    EXPECT_TRUE(fails_with(b.build(), Error::InvalidProgram, needle)) << c.name;
    EXPECT_TRUE(fails_with(b.build(), Error::InvalidProgram, c.needle)) << c.name;
  }
}

TEST(BlobReader, TensorExtentsMustStayInTheirBuffer) {
  Sink s;
  BlobBuilder b = kitchen_sink(&s);
  b.tensors[s.emb].offset = b.weights.size() - 64;  // aligned, but runs past the end
  EXPECT_TRUE(fails_with(b.build(), Error::InvalidProgram, "is past the weights section"));

  b = kitchen_sink(&s);
  b.tensors[s.emb].offset = 0xFFFFFFFFFFFFFFC0ull;
  EXPECT_TRUE(fails_with(b.build(), Error::InvalidProgram, "overflows"));

  b = kitchen_sink(&s);
  b.tensors[s.emb].offset += 4;
  EXPECT_TRUE(fails_with(b.build(), Error::InvalidProgram, "not 64-byte aligned"));

  b = kitchen_sink(&s);
  b.tensors[s.t9].offset = b.arena_size() - 8;
  EXPECT_TRUE(fails_with(b.build(), Error::InvalidProgram, "arena_size"));

  b = kitchen_sink(&s);
  b.tensors[s.t9].offset = 0xFFFFFFFFFFFFFFF0ull;
  EXPECT_TRUE(fails_with(b.build(), Error::InvalidProgram, "arena"));

  b = kitchen_sink(&s);
  b.tensors[s.img].offset = 4;
  EXPECT_TRUE(fails_with(b.build(), Error::InvalidProgram, "storage Input with index 4"));

  b = kitchen_sink(&s);
  b.tensors[s.y1].offset = 2;
  EXPECT_TRUE(fails_with(b.build(), Error::InvalidProgram, "storage Output with index 2"));
}

TEST(BlobReader, IoTableMustPointAtItsArguments) {
  BlobBuilder b = kitchen_sink();
  Bytes bytes = b.build();
  patch<uint32_t>(bytes, b.layout().io_offset, 5000);
  EXPECT_TRUE(
      fails_with(bytes, Error::InvalidProgram, "io table entry 0 (input 0) is tensor id 5000"));

  Sink s;
  b = kitchen_sink(&s);
  bytes = b.build();
  patch<uint32_t>(bytes, b.layout().io_offset + 4, static_cast<uint32_t>(s.w));  // a weight
  EXPECT_TRUE(fails_with(bytes, Error::InvalidProgram, "io table entry 1 (input 1)"));
  EXPECT_TRUE(fails_with(bytes, Error::InvalidProgram, "storage is Weight"));

  b = kitchen_sink(&s);
  bytes = b.build();
  patch<uint32_t>(bytes, b.layout().io_offset, static_cast<uint32_t>(s.idx));  // input 1 as 0
  EXPECT_TRUE(fails_with(bytes, Error::InvalidProgram, "expected Input 0"));

  b = kitchen_sink(&s);
  bytes = b.build();
  patch<uint32_t>(bytes, b.layout().io_offset + 4 * 4, static_cast<uint32_t>(s.x));  // output 0
  EXPECT_TRUE(fails_with(bytes, Error::InvalidProgram, "(output 0)"));
}

TEST(BlobReader, ArgumentViewsMustFitTheArgument) {
  Sink s;
  BlobBuilder b = kitchen_sink(&s);
  blob::TensorRecord view = b.tensors[s.img];  // input 3: 50 floats
  view.sizes[3] = 6;
  view.nbytes = 60 * 4;
  b.tensors.push_back(view);
  EXPECT_TRUE(fails_with(b.build(), Error::InvalidProgram, "views input 3"));
}

TEST(BlobReader, UnknownOpcodeFails) {
  for (uint32_t opcode : {0u, 15u, 0xFFFFFFFFu}) {
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
      {1, 0, 17, "operand 0 (kind) is 17, not a known BinaryKind"},
      {2, 0, 24, "operand 0 (kind) is 24, not a known UnaryKind"},
      {2, 0, -1, "not a known UnaryKind"},
      {6, 0, 5, "not a known ReduceKind"},
      {10, 0, 2, "not a known PoolKind"},
      {0, 16, 4, "operand 16 (epilogue) is 4, not a known Epilogue"},
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

// No input may crash the reader: flip every byte of a valid blob, then mutate at random.
TEST(BlobReader, SurvivesEveryByteFlipped) {
  const Bytes good = kitchen_sink().build();
  size_t rejected = 0;
  for (size_t i = 0; i < good.size(); ++i) {
    for (uint8_t mask : {uint8_t{0x01}, uint8_t{0x80}, uint8_t{0xFF}}) {
      Bytes bytes = good;
      bytes[i] ^= mask;
      std::string why;
      auto r = read_blob(bytes.data(), bytes.size(), &why);
      if (!r.ok()) {
        ++rejected;
        EXPECT_FALSE(why.empty());
      }
    }
  }
  EXPECT_GT(rejected, good.size());
  g_log.clear();
}

TEST(BlobReader, SurvivesRandomOperandsAndTruncation) {
  std::mt19937_64 rng(1234);
  BlobBuilder base = kitchen_sink();
  const int64_t interesting[] = {-2,
                                 -1,
                                 0,
                                 1,
                                 2,
                                 3,
                                 7,
                                 8,
                                 9,
                                 1 << 20,
                                 std::numeric_limits<int64_t>::max(),
                                 std::numeric_limits<int64_t>::min()};
  for (int iter = 0; iter < 3000; ++iter) {
    BlobBuilder b = base;
    const int edits = 1 + static_cast<int>(rng() % 4);
    for (int e = 0; e < edits; ++e) {
      b.operands[rng() % b.operands.size()] = interesting[rng() % std::size(interesting)];
    }
    Bytes bytes = b.build();
    size_t size = bytes.size();
    if (iter % 5 == 0) {
      size = rng() % (bytes.size() + 1);
    }
    std::string why;
    auto r = read_blob(bytes.data(), size, &why);
    EXPECT_TRUE(r.ok() || !why.empty());
  }
  g_log.clear();
}

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
      {1, 1, 24, "not a known UnaryKind"},
      {1, 1, 17, "logical_not is not a fused kind"},
      {2, 1, 17, "not a known BinaryKind"},
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
