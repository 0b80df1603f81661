// The C API on IR buffers: a valid graph builds into a blob the runtime reads; malformed IR is
// rejected with a message naming the problem, never a crash.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <random>
#include <string>

#include "ir_writer.h"
#include "kiln/builder.h"
#include "format/blob_reader.h"
#include "format/variant_set_reader.h"

namespace kiln::builder {
namespace {

using namespace kiln::builder::testing;

Graph small_graph(int64_t n = 16) {
  Graph g;
  int64_t x = input(g, {n}, 0);
  int64_t w = weight(g, std::vector<float>(size_t(n), 0.5f), {n});
  int64_t t = g.add_tensor(blob::DType::kFloat32, {n}, "t");
  int64_t out = g.add_tensor(blob::DType::kFloat32, {n}, "out");
  g.ops.push_back(binary(blob::BinaryKind::kMul, x, w, t, n));
  g.ops.push_back(unary(blob::UnaryKind::kTanh, t, out));
  g.outputs = {out};
  return g;
}

struct Result {
  int rc;
  std::string error;
  std::vector<uint8_t> bytes;
};

Result build(const std::vector<uint8_t>& ir, uint32_t passes = KILN_BUILDER_PASSES_ALL) {
  void* blob = reinterpret_cast<void*>(1);
  size_t size = 7;
  char error[256] = "untouched";
  Result r;
  r.rc = kiln_builder_build_blob(ir.data(), ir.size(), passes, &blob, &size, error, sizeof(error));
  r.error = error;
  if (blob != nullptr) {
    r.bytes.assign(static_cast<uint8_t*>(blob), static_cast<uint8_t*>(blob) + size);
  } else {
    EXPECT_EQ(size, 0u);
  }
  kiln_builder_free(blob);
  return r;
}

void expect_rejected(const std::vector<uint8_t>& ir, const std::string& message) {
  Result r = build(ir);
  EXPECT_EQ(r.rc, KILN_BUILDER_INVALID_IR) << r.error;
  EXPECT_NE(r.error.find(message), std::string::npos) << "message: " << r.error;
  EXPECT_TRUE(r.bytes.empty());
}

TEST(CApi, ValidGraphBuildsIntoABlobTheRuntimeReads) {
  EXPECT_EQ(kiln_builder_api_version(), KILN_BUILDER_API_VERSION);
  Result r = build(serialize(small_graph()));
  ASSERT_EQ(r.rc, KILN_BUILDER_OK) << r.error;
  EXPECT_EQ(r.error, "");
  std::string why;
  auto graph = kiln::engine::read_blob(r.bytes.data(), r.bytes.size(), &why);
  ASSERT_TRUE(graph.ok()) << why;
  EXPECT_EQ(graph->ops.size(), 1u);   // mul and tanh fused
}

TEST(CApi, VariantSetStoresSharedWeightsOnce) {
  std::vector<std::vector<uint8_t>> irs;
  for (std::vector<int64_t> shape : {std::vector<int64_t>{16}, std::vector<int64_t>{2, 8}}) {
    Graph g = small_graph();
    g.tensors[0].shape = shape;   // another input shape, the same weights
    irs.push_back(serialize(g));
  }
  const void* ptrs[] = {irs[0].data(), irs[1].data()};
  size_t sizes[] = {irs[0].size(), irs[1].size()};
  void* out = nullptr;
  size_t size = 0;
  char error[256];
  ASSERT_EQ(kiln_builder_build_variant_set(ptrs, sizes, 2, KILN_BUILDER_PASSES_ALL, &out, &size,
                                           error, sizeof(error)),
            KILN_BUILDER_OK)
      << error;
  std::string why;
  auto set = kiln::engine::read_variant_set(out, size, &why);
  ASSERT_TRUE(set.ok()) << why;
  EXPECT_EQ(set->variants.size(), 2u);
  EXPECT_EQ(set->weights.size, 64u);
  EXPECT_EQ(set->variants[1].inputs[0].rank, 2u);
  kiln_builder_free(out);

  // A broken second variant is named.
  irs[1][0] = 'X';
  ptrs[1] = irs[1].data();
  EXPECT_EQ(kiln_builder_build_variant_set(ptrs, sizes, 2, KILN_BUILDER_PASSES_ALL, &out, &size,
                                           error, sizeof(error)),
            KILN_BUILDER_INVALID_IR);
  EXPECT_NE(std::string(error).find("variant 1: IR magic"), std::string::npos) << error;
  EXPECT_EQ(out, nullptr);
}

TEST(CApi, TruncatedIrIsRejectedAtEveryLength) {
  std::vector<uint8_t> ir = serialize(small_graph());
  for (size_t n = 0; n < ir.size(); ++n) {
    std::vector<uint8_t> cut(ir.begin(), ir.begin() + std::ptrdiff_t(n));
    Result r = build(cut);
    EXPECT_EQ(r.rc, KILN_BUILDER_INVALID_IR) << "length " << n;
    EXPECT_FALSE(r.error.empty());
  }
}

template <typename T>
std::vector<uint8_t> patched(std::vector<uint8_t> ir, size_t offset, T value) {
  std::memcpy(ir.data() + offset, &value, sizeof(T));
  return ir;
}

constexpr size_t kTensors = KILN_IR_HEADER_SIZE;

TEST(CApi, MalformedHeadersAreNamed) {
  std::vector<uint8_t> ir = serialize(small_graph());
  expect_rejected(patched(ir, 0, 'X'), "magic");
  expect_rejected(patched(ir, 8, uint32_t(7)), "IR version 7");
  expect_rejected(patched(ir, 16, uint32_t(9)), "precision 9");
  expect_rejected(patched(ir, 20, uint32_t(1u << 30)), "do not fit");
  expect_rejected(patched(ir, 56, uint64_t(3)), "total_size 3");
  expect_rejected(patched(ir, 40, uint64_t(99)), "num_operands 99");
}

TEST(CApi, BadTensorEntriesAreNamed) {
  std::vector<uint8_t> ir = serialize(small_graph());
  size_t t2 = kTensors + 2 * KILN_IR_TENSOR_ENTRY_SIZE;
  expect_rejected(patched(ir, t2, uint32_t(99)), "tensor 2: unknown dtype 99");
  expect_rejected(patched(ir, t2 + 4, uint32_t(9)), "tensor 2 has rank 9");
  expect_rejected(patched(ir, t2 + 8, int64_t(-4)), "tensor 2: size[0] = -4");
  expect_rejected(patched(ir, t2 + 72, uint32_t(8)), "tensor 2: unknown storage 8");
  expect_rejected(patched(ir, t2 + 76, int32_t(40)), "tensor 2: alias_of 40");
  // 2 -> 3 -> 2: a cycle.
  auto cyc = patched(patched(ir, t2 + 76, int32_t(3)), t2 + KILN_IR_TENSOR_ENTRY_SIZE + 76, int32_t(2));
  expect_rejected(cyc, "cycle");
  size_t t1 = kTensors + KILN_IR_TENSOR_ENTRY_SIZE;
  expect_rejected(patched(ir, t1 + 88, uint64_t(4)), "tensor 1: data_size 4");
}

TEST(CApi, BadOpsAndIoAreNamed) {
  std::vector<uint8_t> ir = serialize(small_graph());
  size_t ops = kTensors + 4 * KILN_IR_TENSOR_ENTRY_SIZE;
  size_t pool = ops + 2 * KILN_IR_OP_ENTRY_SIZE;
  expect_rejected(patched(ir, ops, uint32_t(77)), "op 0: unknown opcode 77");
  // kMul's `a` (slot 1) and kTanh's `out` (slot 2 of op 1, which starts at slot 10).
  expect_rejected(patched(ir, pool + 8, int64_t(42)), "op 0: a = 42 is not a tensor id");
  expect_rejected(patched(ir, pool + (10 + 2) * 8, int64_t(-1)), "op 1: out = -1");
  // kBinary's rank (slot 6) claims 3 dims: the lists then need more operands than it has.
  expect_rejected(patched(ir, pool + 6 * 8, int64_t(3)), "op 0 (kBinary)");
  size_t io = pool + 15 * 8;
  expect_rejected(patched(ir, io + 4, uint32_t(12)), "output 0: tensor id 12");
}

// bf16, a broadcast weight, a where over a Bool input, a view, two outputs: every pass has work.
Graph busy_graph() {
  Graph g;
  g.precision = blob::Precision::kBf16;
  int64_t x = input(g, {2, 8}, 0);
  int64_t m = input(g, {2, 8}, 1, blob::DType::kBool);
  int64_t w = weight(g, std::vector<float>(8, 0.25f), {8});
  int64_t a = g.add_tensor(blob::DType::kFloat32, {2, 8}, "a");
  int64_t b = g.add_tensor(blob::DType::kFloat32, {2, 8}, "b");
  int64_t c = g.add_tensor(blob::DType::kFloat32, {2, 8}, "c");
  int64_t v = g.add_tensor(blob::DType::kFloat32, {16}, "v");
  g.tensors[size_t(v)].alias_of = c;
  int64_t out = g.add_tensor(blob::DType::kFloat32, {16}, "out");
  g.ops.push_back(make_op(blob::Opcode::kBinary, {{0}, {x}, {w}, {a}, {double_bits(1.0)}, {0},
                                                  {2}, {2, 8}, {8, 1}, {0, 1}}));
  g.ops.push_back(unary(blob::UnaryKind::kSilu, a, b));
  g.ops.push_back(make_op(blob::Opcode::kWhere, {{m}, {a}, {b}, {c}, {2}, {2, 8}, {8, 1}, {8, 1},
                                                 {8, 1}}));
  g.ops.push_back(unary(blob::UnaryKind::kExp, v, out));
  g.outputs = {out, b};
  return g;
}

TEST(CApi, RandomMutationsNeverCrash) {
  for (const Graph& g : {small_graph(), busy_graph()}) {
    std::vector<uint8_t> ir = serialize(g);
    ASSERT_EQ(build(ir).rc, KILN_BUILDER_OK) << build(ir).error;
    std::mt19937 rng(7);
    for (int i = 0; i < 20000; ++i) {
      std::vector<uint8_t> bad = ir;
      for (int k = 0, n = 1 + int(rng() % 4); k < n; ++k) {
        size_t pos = rng() % bad.size();
        bad[pos] = rng() % 2 ? uint8_t(bad[pos] ^ (1u << (rng() % 8))) : uint8_t(rng());
      }
      Result r = build(bad);
      EXPECT_TRUE(r.rc == KILN_BUILDER_OK || !r.error.empty()) << "mutant " << i;
    }
  }
}

TEST(CApi, ErrorTextIsTruncatedToTheCallersBuffer) {
  std::vector<uint8_t> ir = serialize(small_graph());
  ir[0] = 'X';
  void* blob = nullptr;
  size_t size = 0;
  char error[8];
  std::memset(error, 'z', sizeof(error));
  EXPECT_EQ(kiln_builder_build_blob(ir.data(), ir.size(), KILN_BUILDER_PASSES_ALL, &blob, &size,
                                    error, sizeof(error)),
            KILN_BUILDER_INVALID_IR);
  EXPECT_EQ(std::strlen(error), 7u);
  EXPECT_EQ(kiln_builder_build_blob(ir.data(), ir.size(), KILN_BUILDER_PASSES_ALL, &blob, &size,
                                    nullptr, 0),
            KILN_BUILDER_INVALID_IR);
  EXPECT_EQ(kiln_builder_build_blob(nullptr, 0, KILN_BUILDER_PASSES_ALL, &blob, &size, error,
                                    sizeof(error)),
            KILN_BUILDER_INVALID_IR);
  EXPECT_EQ(kiln_builder_build_blob(ir.data(), ir.size(), KILN_BUILDER_PASSES_ALL, nullptr, &size,
                                    error, sizeof(error)),
            KILN_BUILDER_INTERNAL);
}

TEST(CApi, UnplannedArenaWithoutThePlannerFailsTheReaderCheck) {
  Graph g = small_graph();
  g.arena_size = 0;   // t lives in the arena but nothing plans it
  Result r = build(serialize(g), KILN_BUILDER_PASSES_ALL & ~KILN_BUILDER_PASS_PLAN_MEMORY &
                                     ~KILN_BUILDER_PASS_FUSE_ELEMENTWISE);
  EXPECT_EQ(r.rc, KILN_BUILDER_INVALID_BLOB);
  EXPECT_NE(r.error.find("runtime's blob reader rejects"), std::string::npos) << r.error;
}

}  // namespace
}  // namespace kiln::builder
