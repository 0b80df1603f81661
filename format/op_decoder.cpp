// The table-driven half of the op decoder: the operand layout of every opcode comes from the op
// table (op_table.def), so nothing here knows an opcode's slots. Per-op checks the table cannot
// state are in op_checks.cpp.
#include "format/op_decoder.h"

#include <string>

#include "format/op_decoder_internal.h"

namespace kiln::engine {
namespace op_decoder {

// The element count of list field `field`: the product of the numbers and earlier integer fields
// its count names (op_table.h checks at compile time that they come before it). Only called once
// those integers are decoded and range-checked.
uint64_t OpDecoder::list_count(size_t field) {
  const char* c = desc_.fields[field].count;
  uint64_t n = 1;
  while (*c != '\0') {
    const char* end = c;
    while (*end != '\0' && *end != '*') ++end;
    const std::string factor(c, end);
    uint64_t v;
    if (factor[0] >= '0' && factor[0] <= '9') {
      v = std::stoull(factor);
    } else {
      const size_t j = blob::field_index(desc_.fields, field, factor.c_str());
      v = static_cast<uint64_t>(value(j));  // an integer with min >= 0 (see decode_layout)
    }
    if (__builtin_mul_overflow(n, v, &n)) {
      fail("the length of %s overflows", desc_.fields[field].name);
      return 0;
    }
    c = *end == '*' ? end + 1 : end;
  }
  return n;
}

// "5 + 3 * rank": the op's operand count as the message states it (scalars, then each distinct
// list count with how often it occurs).
std::string OpDecoder::count_formula() const {
  size_t scalars = 0;
  std::string counts[kMaxFields];
  size_t times[kMaxFields] = {};
  size_t distinct = 0;
  for (size_t i = 0; i < desc_.num_fields; ++i) {
    const char* c = desc_.fields[i].count;
    if (c == nullptr) {
      ++scalars;
      continue;
    }
    // Numbers first: "num_instrs*8" reads "8 * num_instrs".
    std::string numbers, names;
    while (*c != '\0') {
      const char* end = c;
      while (*end != '\0' && *end != '*') ++end;
      std::string& side = *c >= '0' && *c <= '9' ? numbers : names;
      side += (side.empty() ? "" : " * ") + std::string(c, end);
      c = *end == '*' ? end + 1 : end;
    }
    const std::string term = numbers.empty() ? names : numbers + " * " + names;
    size_t k = 0;
    while (k < distinct && counts[k] != term) ++k;
    if (k == distinct) counts[distinct++] = term;
    ++times[k];
  }
  if (distinct == 0) {
    return "";
  }
  std::string formula = " (" + std::to_string(scalars);
  for (size_t k = 0; k < distinct; ++k) {
    formula += " + " + (times[k] > 1 ? std::to_string(times[k]) + " * " : "") + counts[k];
  }
  return formula + ")";
}

bool OpDecoder::decode_layout() {
  // 1. Positions. A list's length needs the integers its count names: each such integer is
  //    range-checked as soon as the walk reaches it, before the count is trusted.
  uint64_t pos = 0;
  for (size_t i = 0; i < desc_.num_fields && ok(); ++i) {
    const blob::FieldDesc& f = desc_.fields[i];
    position_[i] = static_cast<size_t>(pos);
    if (f.count != nullptr) {
      length_[i] = list_count(i);
      if (__builtin_add_overflow(pos, length_[i], &pos)) {
        fail("the operand count overflows");
      }
      continue;
    }
    length_[i] = 1;
    bool counts_a_list = false;
    for (size_t j = i + 1; j < desc_.num_fields; ++j) {
      counts_a_list = counts_a_list || blob::count_mentions(desc_.fields[j].count, f.name);
    }
    if (counts_a_list) {
      if (!expect_at_least(pos + 1)) {
        return false;
      }
      integer(static_cast<size_t>(pos), f.name, f.min < 0 ? 0 : f.min, f.max);
    }
    ++pos;
  }
  if (!ok() || !expect_count(pos, count_formula().c_str())) {
    return false;
  }
  // 2. Every field against the table.
  for (size_t i = 0; i < desc_.num_fields && ok(); ++i) {
    const blob::FieldDesc& f = desc_.fields[i];
    const size_t at = position_[i];
    switch (f.kind) {
      case blob::FieldKind::kTensor: tensor(at, f.name, f.role); break;
      case blob::FieldKind::kInt: integer(at, f.name, f.min, f.max); break;
      case blob::FieldKind::kEnum: {
        const int64_t v = raw(at);
        if (v < 0 || v > f.max) {
          fail("operand %zu (%s) is %lld, not a known %s (0..%lld)", at, f.name, ll(v), f.enum_name,
               ll(f.max));
        }
        break;
      }
      case blob::FieldKind::kReal: break;
      case blob::FieldKind::kList:
        for (uint64_t k = 0; k < length_[i] && ok() && f.min != blob::kAnyInt; ++k) {
          const int64_t v = raw(at + k);
          if (v < f.min) {
            fail("operand %zu (%s[%u]) is %lld, must be >= %lld", size_t(at + k), f.name,
                 unsigned(k), ll(v), ll(f.min));
          }
        }
        break;
      case blob::FieldKind::kTensorList:
        for (uint64_t k = 0; k < length_[i] && ok(); ++k) tensor(at + k, f.element, f.role);
        break;
    }
  }
  return ok();
}

// ---- The Args struct of every `table` op, filled field by field in table order. ----

#define KILN_FILL_T(member, wire, role) a.member = d.value(i++);
#define KILN_FILL_I(type, member, wire, lo, hi) a.member = static_cast<type>(d.value(i++));
#define KILN_FILL_E(Enum, member, wire) a.member = static_cast<blob::Enum>(d.value(i++));
#define KILN_FILL_R(member, wire) a.member = d.real_field(i++);
#define KILN_FILL_L(member, wire, count, lo) d.copy_list(i++, a.member);
#define KILN_FILL_TL(member, wire, count, role) ++i;
#define KILN_FILL_table(Name)                                                           \
  void fill(OpDecoder& d, Name##Args& a) {                                              \
    size_t i = 0;                                                                       \
    KILN_FIELDS_##Name(KILN_FILL_T, KILN_FILL_I, KILN_FILL_E, KILN_FILL_R, KILN_FILL_L, \
                       KILN_FILL_TL)                                                    \
  }
#define KILN_FILL_custom(Name)
#define KILN_FILL(Name, code, snake, args) KILN_FILL_##args(Name)
KILN_OPCODES(KILN_FILL)
#undef KILN_FILL
#undef KILN_FILL_custom
#undef KILN_FILL_table
#undef KILN_FILL_T
#undef KILN_FILL_I
#undef KILN_FILL_E
#undef KILN_FILL_R
#undef KILN_FILL_L
#undef KILN_FILL_TL

}  // namespace op_decoder

executorch::runtime::Result<Op> decode_op(const Graph& graph, size_t index, blob::Opcode opcode,
                                          const int64_t* operands, uint64_t count,
                                          std::string* why) {
  const blob::OpDesc* desc = blob::find_op(static_cast<uint32_t>(opcode));
  if (desc == nullptr) {
    return fail(why, op_decoder::Error::InvalidProgram, "Kiln blob: op %zu has unknown opcode %u",
                index, static_cast<unsigned>(opcode));
  }
  op_decoder::OpDecoder d(graph, index, *desc, operands, count, why);
  Op op{opcode, {}};
  switch (opcode) {
#define KILN_DECODE_CASE(Name, code, snake, how) \
  case blob::Opcode::k##Name: {                  \
    Name##Args a{};                              \
    if (d.decode_layout()) {                     \
      op_decoder::fill(d, a);                    \
      op_decoder::check(d, a);                   \
    }                                            \
    op.args = a;                                 \
    break;                                       \
  }
    KILN_OPCODES(KILN_DECODE_CASE)
#undef KILN_DECODE_CASE
  }
  d.check_output_disjoint();
  if (!d.ok()) {
    return d.error();
  }
  return op;
}

}  // namespace kiln::engine
