// Every tensor operand of a decoded op with the role the op table gives it, for the passes over a
// Graph that ask which ops read or write a tensor (the engine's step fusion). Generated from the
// op table like the Args structs; the two custom ops are listed by hand.
#pragma once

#include <cstdint>
#include <variant>

#include "format/graph.h"
#include "format/op_table.h"

namespace kiln::engine {

namespace op_tensors_detail {

#define KILN_OT_T(member, wire, role) \
  if (a.member != kNoTensor) f(a.member, blob::Role::role);
#define KILN_OT_I(type, member, wire, lo, hi)
#define KILN_OT_E(Enum, member, wire)
#define KILN_OT_R(member, wire)
#define KILN_OT_L(member, wire, count, lo)
#define KILN_OT_TL(member, wire, count, role)
#define KILN_OT_VISIT_table(Name)                                                    \
  template <typename F>                                                             \
  void visit(const Name##Args& a, F& f) {                                           \
    KILN_FIELDS_##Name(KILN_OT_T, KILN_OT_I, KILN_OT_E, KILN_OT_R, KILN_OT_L, KILN_OT_TL) \
  }
#define KILN_OT_VISIT_custom(Name)
#define KILN_OT_VISIT(Name, code, snake, args) KILN_OT_VISIT_##args(Name)
KILN_OPCODES(KILN_OT_VISIT)
#undef KILN_OT_VISIT
#undef KILN_OT_VISIT_custom
#undef KILN_OT_VISIT_table
#undef KILN_OT_TL
#undef KILN_OT_L
#undef KILN_OT_R
#undef KILN_OT_E
#undef KILN_OT_I
#undef KILN_OT_T

template <typename F>
void visit(const FusedElementwiseArgs& a, F& f) {
  for (uint32_t i = 0; i < a.num_inputs; ++i) f(a.inputs[i], blob::Role::kInput);
  f(a.out, blob::Role::kOutput);
}

template <typename F>
void visit(const ScatterArgs& a, F& f) {
  f(a.values, blob::Role::kInput);
  for (uint32_t i = 0; i < a.num_indices; ++i) f(a.indices[i], blob::Role::kInput);
  f(a.out, blob::Role::kOutput);
}

}  // namespace op_tensors_detail

/// Calls f(tensor_id, role) for every tensor operand of `op` (optional ones left out when absent).
template <typename F>
void for_each_tensor(const Op& op, F&& f) {
  std::visit([&](const auto& a) { op_tensors_detail::visit(a, f); }, op.args);
}

/// Whether the role reads the tensor (an input) or writes it (an output, or state written in place).
inline bool is_read(blob::Role role) {
  return role == blob::Role::kInput || role == blob::Role::kOptionalInput;
}

}  // namespace kiln::engine
