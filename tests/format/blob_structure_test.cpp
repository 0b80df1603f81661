// The blob reader on the blob's structure: header, sections, tensor records and the io table.
#include "tests/format/reader_test_support.h"  // the standard headers the tests use, too

namespace kiln::engine {
namespace {

using namespace reader_test;

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
  // A blob from an earlier Kiln (version 1: kMatmul without its residual operand).
  patch<uint32_t>(bytes, HEADER_FIELD(format_version), 1);
  EXPECT_TRUE(fails_with(bytes, Error::DelegateInvalidCompatibility, "format_version is 1"));
  EXPECT_TRUE(fails_with(bytes, Error::DelegateInvalidCompatibility, "re-export"));
  EXPECT_TRUE(fails_with(bytes, Error::DelegateInvalidCompatibility, "reads format version 4"));
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


}  // namespace
}  // namespace kiln::engine
