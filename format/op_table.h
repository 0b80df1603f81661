// The op table (op_table.def) as constexpr data: every opcode with its operand fields, and every
// enum with its entries and count. The reader's generic decoder, the builder's layouts, the format
// description for Python and the tests read these arrays; nothing else lists an operand layout.
#pragma once

#include <cstddef>
#include <cstdint>
#include <iterator>
#include <limits>

#include "format/blob_format.h"

namespace kiln::engine::blob {

/// Integer bounds of the table: kAnyInt as a minimum and kMaxInt as a maximum mean unbounded.
inline constexpr int64_t kAnyInt = std::numeric_limits<int64_t>::min();
inline constexpr int64_t kMaxInt = std::numeric_limits<int64_t>::max();

/// What one operand field holds.
enum class FieldKind : uint8_t { kTensor, kInt, kEnum, kReal, kList, kTensorList };
/// How an op uses a tensor field (kNone for the other kinds).
enum class Role : uint8_t { kNone, kInput, kOptionalInput, kOutput, kStateOutput };
/// A dtype relation the table can state (KILN_CHECKS_*).
enum class DTypeClass : uint8_t { kFloating, kIndex, kBool };

/// One operand field of an opcode, in operand order.
struct FieldDesc {
  FieldKind kind;
  const char* name;        // the wire name ("C_in"), as messages, the builder and Python use it
  Role role;               // tensors and tensor lists
  int64_t min, max;        // integers and enums: the accepted range; lists: min per element
  const char* count;       // lists: the element count, a product of earlier integers and numbers
  const char* enum_name;   // enums: the enum the value belongs to ("BinaryKind")
  const char* element;     // tensor lists: how messages name one element ("inputs[i]")
};

/// One opcode: its code, names and fields.
struct OpDesc {
  Opcode opcode;
  const char* name;        // "layer_norm" (opcode_name)
  const char* enum_name;   // "kLayerNorm"
  const FieldDesc* fields;
  size_t num_fields;
};

/// One entry of an enum: its value and its snake_case name ("gelu_erf").
struct EnumEntry {
  int64_t value;
  const char* name;
};

/// The entries of each enum (EnumInfo<UnaryKind>::entries, ::count, ::name).
template <typename Enum>
struct EnumInfo;

#define KILN_ENUM_ENTRY(Name, value, snake) EnumEntry{value, #snake},
#define KILN_ENUM_INFO(Enum, Type, operand_kind)                                    \
  template <>                                                                       \
  struct EnumInfo<Enum> {                                                           \
    static constexpr const char* name = #Enum;                                      \
    static constexpr bool operand_kind_ = operand_kind;                             \
    static constexpr EnumEntry entries[] = {KILN_ENUM_##Enum(KILN_ENUM_ENTRY)};     \
    static constexpr int64_t count = int64_t(std::size(entries));                   \
  };
KILN_ENUMS(KILN_ENUM_INFO)
#undef KILN_ENUM_INFO
#undef KILN_ENUM_ENTRY

/// Number of values of an operand-kind enum (its values are 0..count-1).
template <typename Enum>
inline constexpr int64_t kCount = EnumInfo<Enum>::count;

constexpr bool is_dense(const EnumEntry* entries, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    if (entries[i].value != int64_t(i)) return false;
  }
  return true;
}
#define KILN_ENUM_DENSE(Enum, Type, operand_kind)                                          \
  static_assert(!operand_kind || is_dense(EnumInfo<Enum>::entries, EnumInfo<Enum>::count), \
                #Enum " must list the values 0..count-1 in order");
KILN_ENUMS(KILN_ENUM_DENSE)
#undef KILN_ENUM_DENSE

// ---- Operand fields, one constexpr array per opcode (k<Name>Fields). ----

#define KILN_FD_T(member, wire, role) \
  FieldDesc{FieldKind::kTensor, wire, Role::role, 0, 0, nullptr, nullptr, nullptr},
#define KILN_FD_I(type, member, wire, lo, hi) \
  FieldDesc{FieldKind::kInt, wire, Role::kNone, lo, hi, nullptr, nullptr, nullptr},
#define KILN_FD_E(Enum, member, wire) \
  FieldDesc{FieldKind::kEnum, wire, Role::kNone, 0, kCount<Enum> - 1, nullptr, #Enum, nullptr},
#define KILN_FD_R(member, wire) \
  FieldDesc{FieldKind::kReal, wire, Role::kNone, 0, 0, nullptr, nullptr, nullptr},
#define KILN_FD_L(member, wire, count, lo) \
  FieldDesc{FieldKind::kList, wire, Role::kNone, lo, kMaxInt, count, nullptr, nullptr},
#define KILN_FD_TL(member, wire, count, role) \
  FieldDesc{FieldKind::kTensorList, wire, Role::role, 0, 0, count, nullptr, wire "[i]"},
#define KILN_OP_FIELDS(Name, code, snake, args)                                        \
  inline constexpr FieldDesc k##Name##Fields[] = {KILN_FIELDS_##Name(                  \
      KILN_FD_T, KILN_FD_I, KILN_FD_E, KILN_FD_R, KILN_FD_L, KILN_FD_TL)};
KILN_OPCODES(KILN_OP_FIELDS)
#undef KILN_OP_FIELDS
#undef KILN_FD_T
#undef KILN_FD_I
#undef KILN_FD_E
#undef KILN_FD_R
#undef KILN_FD_L
#undef KILN_FD_TL

#define KILN_OP_DESC(Name, code, snake, args) \
  OpDesc{Opcode::k##Name, #snake, "k" #Name, k##Name##Fields, std::size(k##Name##Fields)},
/// Every opcode, in table order.
inline constexpr OpDesc kOps[] = {KILN_OPCODES(KILN_OP_DESC)};
#undef KILN_OP_DESC
inline constexpr size_t kNumOpcodes = std::size(kOps);
/// The largest opcode. Codes rise in table order from 1; a code may be missing while the branch
/// that takes it is not merged yet (then no blob holds it, and the reader rejects it).
inline constexpr uint32_t kMaxOpcode = uint32_t(kOps[kNumOpcodes - 1].opcode);
static_assert([] {
  uint32_t previous = 0;
  for (size_t i = 0; i < kNumOpcodes; ++i) {
    if (uint32_t(kOps[i].opcode) <= previous) return false;
    previous = uint32_t(kOps[i].opcode);
  }
  return uint32_t(kOps[0].opcode) == 1;
}(), "opcodes rise from 1 in table order");

constexpr bool same_name(const char* a, const char* b) {
  while (*a != '\0' && *a == *b) ++a, ++b;
  return *a == *b;
}

/// Whether list count `count` ("num_inputs*rank") has the factor `name`.
constexpr bool count_mentions(const char* count, const char* name) {
  while (count != nullptr && *count != '\0') {
    const char* n = name;
    while (*n != '\0' && *count == *n) ++count, ++n;
    if (*n == '\0' && (*count == '\0' || *count == '*')) return true;
    while (*count != '\0' && *count != '*') ++count;
    if (*count == '*') ++count;
  }
  return false;
}

/// The table entry of an opcode, or nullptr for a code no opcode has.
constexpr const OpDesc* find_op(uint32_t code) {
  for (const OpDesc& op : kOps) {
    if (uint32_t(op.opcode) == code) return &op;
  }
  return nullptr;
}

/// Index of the field called `name` in `fields`, or `n` when there is none.
constexpr size_t field_index(const FieldDesc* fields, size_t n, const char* name) {
  for (size_t i = 0; i < n; ++i) {
    if (same_name(fields[i].name, name)) return i;
  }
  return n;
}

/// The index of field "wire" of opcode Name, resolved at compile time: a misspelt name does not
/// compile. KILN_FIELD(Matmul, "residual") is 17.
#define KILN_FIELD(Name, wire)                                                                   \
  ([] {                                                                                          \
    constexpr size_t i = ::kiln::engine::blob::field_index(                                      \
        ::kiln::engine::blob::k##Name##Fields, std::size(::kiln::engine::blob::k##Name##Fields), \
        wire);                                                                                   \
    static_assert(i < std::size(::kiln::engine::blob::k##Name##Fields),                          \
                  "op " #Name " has no operand field " wire);                                    \
    return i;                                                                                    \
  }())

// Every list count is a product of numbers and integer fields that come before the list, so a
// reader walking the operands in order always knows a list's length when it reaches it.
constexpr bool counts_are_valid(const FieldDesc* fields, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    const char* c = fields[i].count;
    const bool list = fields[i].kind == FieldKind::kList || fields[i].kind == FieldKind::kTensorList;
    if (list != (c != nullptr)) return false;
    while (c != nullptr && *c != '\0') {
      char factor[32] = {};
      size_t len = 0;
      for (; *c != '\0' && *c != '*'; ++c) {
        if (len + 1 >= sizeof(factor)) return false;
        factor[len++] = *c;
      }
      if (*c == '*') ++c;
      if (len == 0) return false;
      if (factor[0] >= '0' && factor[0] <= '9') continue;
      const size_t j = field_index(fields, i, factor);
      if (j >= i || fields[j].kind != FieldKind::kInt) return false;
    }
  }
  return true;
}
#define KILN_OP_COUNTS_VALID(Name, code, snake, args)                                  \
  static_assert(counts_are_valid(k##Name##Fields, std::size(k##Name##Fields)),          \
                "op " #Name ": a list count must name integer fields before the list");
KILN_OPCODES(KILN_OP_COUNTS_VALID)
#undef KILN_OP_COUNTS_VALID

static_assert(kFusedInstrWidth == 8, "the fused program's count is num_instrs*8 (op_table.def)");

}  // namespace kiln::engine::blob

namespace kiln::engine {

/// "layer_norm" for kLayerNorm; "unknown opcode" for a value no opcode has.
constexpr const char* opcode_name(blob::Opcode opcode) {
  const blob::OpDesc* op = blob::find_op(uint32_t(opcode));
  return op != nullptr ? op->name : "unknown opcode";
}

/// The snake_case name of an enum value ("gelu_erf"), or nullptr when the enum has no such value.
template <typename Enum>
constexpr const char* kind_name(Enum value) {
  for (const blob::EnumEntry& e : blob::EnumInfo<Enum>::entries) {
    if (e.value == int64_t(value)) return e.name;
  }
  return nullptr;
}

}  // namespace kiln::engine
