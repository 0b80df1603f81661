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

/// The bytes an arena tensor occupies; empty for the other storages (bound or constant memory,
/// which no arena tensor shares).
struct ArenaRange {
  uint64_t begin = 0, end = 0;
  bool overlaps(const ArenaRange& o) const { return begin < o.end && o.begin < end; }
};

inline ArenaRange arena_range(const Graph& g, int64_t t) {
  const Tensor& x = g.tensors[size_t(t)];
  if (x.storage != blob::Storage::kArena || x.nbytes == 0) return {};
  return {x.offset, x.offset + x.nbytes};
}

/// Whether an op after `from` reads the bytes of `range` before an op overwrites all of them, or a
/// delegate output is a view of them (the arena reuses bytes once their tensor is dead, so a later
/// read of a new tensor there is no read of the old one).
inline bool read_later(const Graph& g, const ArenaRange& range, size_t from) {
  for (int64_t out : g.outputs) {
    if (arena_range(g, out).overlaps(range)) return true;
  }
  for (size_t k = from + 1; k < g.ops.size(); ++k) {
    bool read = false, overwritten = false, partly = false;
    for_each_tensor(g.ops[k], [&](int64_t t, blob::Role role) {
      const ArenaRange r = arena_range(g, t);
      if (!r.overlaps(range)) return;
      if (is_read(role)) {
        read = true;
      } else if (r.begin <= range.begin && r.end >= range.end) {
        overwritten = true;
      } else {
        partly = true;
      }
    });
    if (read || partly) return true;   // a partial overwrite: the rest may still be read
    if (overwritten) return false;
  }
  return false;
}

/// Whether tensors a and b may share memory: one tensor, views of one arena span, or views of one
/// program state (state records at overlapping offsets). Bound inputs and outputs are told apart
/// by id, weights are never written.
inline bool share_memory(const Graph& g, int64_t a, int64_t b) {
  if (a == b) return true;
  const Tensor& x = g.tensors[size_t(a)];
  const Tensor& y = g.tensors[size_t(b)];
  if (x.storage != y.storage || x.nbytes == 0 || y.nbytes == 0) return false;
  if (x.storage != blob::Storage::kArena && x.storage != blob::Storage::kState) return false;
  return x.offset < y.offset + y.nbytes && y.offset < x.offset + x.nbytes;
}

}  // namespace kiln::engine
