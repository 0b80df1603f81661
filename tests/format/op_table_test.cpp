// The op table (format/op_table.def) against what is derived from it: enum counts and names,
// opcode names, the Args structs, and the reader's operand counts for a minimal op of every opcode.
#include "format/op_table.h"

#include <gtest/gtest.h>

#include <set>
#include <string>
#include <vector>

#include "format/blob_reader.h"
#include "format/graph.h"
#include "tests/format/blob_builder.h"

namespace kiln::engine {
namespace {

using testing::BlobBuilder;

template <typename Enum>
void expect_dense_and_named(int64_t expected_count) {
  EXPECT_EQ(blob::kCount<Enum>, expected_count) << blob::EnumInfo<Enum>::name;
  std::set<std::string> names;
  for (int64_t v = 0; v < blob::kCount<Enum>; ++v) {
    const char* name = kind_name(static_cast<Enum>(v));
    ASSERT_NE(name, nullptr) << blob::EnumInfo<Enum>::name << " " << v;
    EXPECT_TRUE(names.insert(name).second) << name;
  }
  EXPECT_EQ(kind_name(static_cast<Enum>(blob::kCount<Enum>)), nullptr);
}

TEST(OpTable, EnumCountsComeFromTheTable) {
  expect_dense_and_named<blob::UnaryKind>(32);
  expect_dense_and_named<blob::BinaryKind>(18);
  expect_dense_and_named<blob::ReduceKind>(8);
  expect_dense_and_named<blob::PoolKind>(2);
  expect_dense_and_named<blob::Epilogue>(8);
  expect_dense_and_named<blob::FusedForm>(3);
  expect_dense_and_named<blob::BagMode>(3);
  EXPECT_EQ(int64_t(blob::UnaryKind::kElu), blob::kCount<blob::UnaryKind> - 1);
}

TEST(OpTable, EveryOpcodeHasANameAndArgs) {
  std::set<std::string> names;
  for (const blob::OpDesc& op : blob::kOps) {
    EXPECT_STREQ(opcode_name(op.opcode), op.name);
    EXPECT_TRUE(names.insert(op.name).second) << op.name;
    EXPECT_GT(op.num_fields, 0u) << op.name;
  }
  EXPECT_EQ(names.size(), blob::kNumOpcodes);
  EXPECT_STREQ(opcode_name(static_cast<blob::Opcode>(0)), "unknown opcode");
  EXPECT_EQ(std::variant_size_v<OpArgs>, blob::kNumOpcodes);
  EXPECT_STREQ(opcode_name(blob::Opcode::kLayerNorm), "layer_norm");
  static_assert(KILN_FIELD(Matmul, "residual") == 17);
  static_assert(KILN_FIELD(Copy, "out_strides") == 7);
}

// A minimal op of every opcode: tensor fields name tensor 0 (optional ones -1), integers sit at
// max(min, 1) and lists are as long as their count says. The reader must accept the count (any
// other complaint is fine: the op is nonsense) and reject one operand more or less.
std::vector<int64_t> minimal_operands(const blob::OpDesc& desc) {
  std::vector<int64_t> slots;
  std::vector<int64_t> scalar(desc.num_fields, 0);
  for (size_t i = 0; i < desc.num_fields; ++i) {
    const blob::FieldDesc& f = desc.fields[i];
    if (f.count == nullptr) {
      int64_t v = 0;
      if (f.kind == blob::FieldKind::kInt) v = std::min(std::max<int64_t>(f.min, 1), f.max);
      if (f.kind == blob::FieldKind::kTensor) v = f.role == blob::Role::kOptionalInput ? -1 : 0;
      scalar[i] = v;
      slots.push_back(v);
      continue;
    }
    int64_t n = 1;
    const std::string count(f.count);
    for (size_t start = 0; start <= count.size();) {
      const size_t star = count.find('*', start);
      const std::string factor =
          count.substr(start, star == std::string::npos ? star : star - start);
      n *= factor[0] >= '0' && factor[0] <= '9'
               ? std::stoll(factor)
               : scalar[blob::field_index(desc.fields, i, factor.c_str())];
      if (star == std::string::npos) break;
      start = star + 1;
    }
    slots.insert(slots.end(), size_t(n), 0);
  }
  return slots;
}

std::string read_error(blob::Opcode opcode, const std::vector<int64_t>& operands) {
  BlobBuilder b;
  b.arena(blob::DType::kFloat32, {1});
  b.op(opcode, operands);
  const std::vector<uint8_t> bytes = b.build();
  std::string why;
  const auto result = read_blob(bytes.data(), bytes.size(), &why);
  return result.ok() ? "" : why;
}

TEST(OpTable, TheReaderCountsEveryOpcodesOperandsAsTheTableDoes) {
  for (const blob::OpDesc& desc : blob::kOps) {
    std::vector<int64_t> operands = minimal_operands(desc);
    EXPECT_EQ(read_error(desc.opcode, operands).find("its layout needs"), std::string::npos)
        << desc.name << ": " << read_error(desc.opcode, operands);
    operands.push_back(0);
    EXPECT_NE(read_error(desc.opcode, operands).find("its layout needs"), std::string::npos)
        << desc.name;
    operands.resize(operands.size() - 2);
    EXPECT_NE(read_error(desc.opcode, operands).find("its layout needs"), std::string::npos)
        << desc.name;
  }
}

}  // namespace
}  // namespace kiln::engine
