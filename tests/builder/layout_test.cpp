// The builder's operand layouts (builder/src/ir.cpp) against the op table (format/op_table.def),
// and a minimal op of every opcode through the builder's encode/decode: the builder cannot
// disagree with the table.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "builder/src/ir.h"

namespace kiln::builder {
namespace {

// FieldSpec's kind letter of each table kind (ir.h).
char expected_kind(blob::FieldKind k) {
  constexpr std::pair<blob::FieldKind, char> kLetters[] = {
      {blob::FieldKind::kTensor, 't'}, {blob::FieldKind::kInt, 'n'}, {blob::FieldKind::kEnum, 'n'},
      {blob::FieldKind::kReal, 'f'},   {blob::FieldKind::kList, 'l'},
      {blob::FieldKind::kTensorList, 'T'}};
  for (const auto& [kind, letter] : kLetters) {
    if (kind == k) return letter;
  }
  return '?';
}

TEST(Layouts, EveryOpcodeOfTheTableHasTheTablesLayout) {
  for (const blob::OpDesc& op : blob::kOps) {
    const auto* specs = layout(uint32_t(op.opcode));
    ASSERT_NE(specs, nullptr) << op.name;
    ASSERT_EQ(specs->size(), op.num_fields) << op.name;
    for (size_t i = 0; i < op.num_fields; ++i) {
      const blob::FieldDesc& f = op.fields[i];
      EXPECT_STREQ((*specs)[i].name, f.name) << op.name;
      EXPECT_EQ((*specs)[i].kind, expected_kind(f.kind)) << op.name << "." << f.name;
      EXPECT_EQ((*specs)[i].count == nullptr, f.count == nullptr) << op.name << "." << f.name;
      if (f.count != nullptr) {
        EXPECT_STREQ((*specs)[i].count, f.count) << op.name;
      }
    }
  }
  EXPECT_EQ(layout(0), nullptr);
  EXPECT_EQ(layout(blob::kMaxOpcode + 1), nullptr);
}

// Every integer at 1 (or its minimum above that), every list as long as its count says: encoding
// and decoding give the same fields, and the slot count is the sum of the field lengths.
TEST(Layouts, AMinimalOpOfEveryOpcodeRoundTrips) {
  for (const blob::OpDesc& desc : blob::kOps) {
    std::vector<std::vector<int64_t>> fields;
    size_t slots = 0;
    for (size_t i = 0; i < desc.num_fields; ++i) {
      const blob::FieldDesc& f = desc.fields[i];
      if (f.count == nullptr) {
        const int64_t v = f.kind == blob::FieldKind::kInt ? std::max<int64_t>(f.min, 1) : 0;
        fields.push_back({std::min(v, f.max)});
        ++slots;
        continue;
      }
      int64_t n = 1;
      std::string count(f.count);
      for (size_t start = 0; start <= count.size();) {
        size_t star = count.find('*', start);
        std::string factor = count.substr(start, star == std::string::npos ? star : star - start);
        n *= factor[0] >= '0' && factor[0] <= '9'
                 ? std::stoll(factor)
                 : fields[blob::field_index(desc.fields, i, factor.c_str())][0];
        if (star == std::string::npos) break;
        start = star + 1;
      }
      fields.emplace_back(size_t(n), 0);
      slots += size_t(n);
    }
    Op op = make_op(desc.opcode, fields);
    std::vector<int64_t> encoded = encode_op(op, 0);
    EXPECT_EQ(encoded.size(), slots) << desc.name;
    Op back = decode_op(0, uint32_t(desc.opcode), encoded.data(), encoded.size());
    EXPECT_EQ(back.fields, fields) << desc.name;
    EXPECT_THROW(decode_op(0, uint32_t(desc.opcode), encoded.data(), encoded.size() + 1),
                 BuildError)
        << desc.name;
  }
}

}  // namespace
}  // namespace kiln::builder
