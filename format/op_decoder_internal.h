// The op decoder's working parts, shared by the generic table-driven decoding (op_decoder.cpp)
// and the per-op checks that are not simple relations (op_checks.cpp). Internal to the reader.
#pragma once

#include <cstdarg>
#include <cstring>
#include <initializer_list>
#include <limits>
#include <string>

#include <executorch/runtime/core/result.h>

#include "format/fail.h"
#include "format/graph.h"

namespace kiln::engine::op_decoder {

using executorch::runtime::Error;

inline constexpr int64_t kInt64Min = std::numeric_limits<int64_t>::min();

using ull = unsigned long long;
using ll = long long;

// Two tensors whose bytes may be the same memory at run time.
inline bool tensors_overlap(const Tensor& a, const Tensor& b) {
  if (a.nbytes == 0 || b.nbytes == 0 || a.storage != b.storage) {
    return false;
  }
  switch (a.storage) {
    case blob::Storage::kArena:
    case blob::Storage::kWeight:
    case blob::Storage::kState:
      return a.offset < b.offset + b.nbytes && b.offset < a.offset + a.nbytes;
    case blob::Storage::kInput:
    case blob::Storage::kOutput: return a.offset == b.offset;  // both start at the bound argument
  }
  return false;
}

// Decodes one op's operands. The first failure sticks: later calls return harmless defaults and
// record nothing, so each check reads as a flat list followed by `if (!ok())`.
//
// decode_layout() does everything the op table states (op_table.def): it walks the fields in
// operand order, reads each list's length from the integers before it, checks the operand count,
// every tensor id against its role, every integer against its range, every enum value and list
// element. After it, value(i) / list(i) / position(i) give field i (KILN_FIELD(Name, "wire")).
class OpDecoder {
 public:
  OpDecoder(const Graph& graph, size_t index, const blob::OpDesc& desc, const int64_t* operands,
            uint64_t count, std::string* why)
      : graph_(graph),
        index_(index),
        opcode_(desc.opcode),
        desc_(desc),
        operands_(operands),
        count_(count),
        why_(why) {}

  bool decode_layout();

  /// Field i (a scalar) after decode_layout.
  int64_t value(size_t i) const { return raw(position_[i]); }
  double real_field(size_t i) const { return real(position_[i]); }
  /// Field i (a list) after decode_layout: its first slot and its length.
  const int64_t* list(size_t i) const { return operands_ + position_[i]; }
  uint64_t length(size_t i) const { return length_[i]; }
  /// The operand index field i starts at (for messages).
  size_t position(size_t i) const { return position_[i]; }
  void copy_list(size_t i, int64_t* out) const {
    for (uint64_t k = 0; k < length_[i]; ++k) out[k] = list(i)[k];
  }

  bool ok() const { return error_ == Error::Ok; }
  Error error() const { return error_; }

  void fail(const char* format, ...) __attribute__((format(printf, 2, 3))) {
    if (!ok()) {
      return;
    }
    va_list args;
    va_start(args, format);
    const std::string detail = vformat(format, args);
    va_end(args);
    error_ = engine::fail(why_, Error::InvalidProgram, "Kiln blob: op %zu (%s): %s", index_,
                          opcode_name(opcode_), detail.c_str());
  }

  // The layout's operand count; `needed_for` says what it depends on, for the message.
  bool expect_count(uint64_t needed, const char* needed_for) {
    if (ok() && count_ != needed) {
      fail("has %llu operands, its layout needs %llu%s", ull(count_), ull(needed), needed_for);
    }
    return ok();
  }

  bool expect_at_least(uint64_t needed) {
    if (ok() && count_ < needed) {
      fail("has %llu operands, its layout needs at least %llu", ull(count_), ull(needed));
    }
    return ok();
  }

  int64_t raw(size_t i) const { return i < count_ ? operands_[i] : 0; }

  double real(size_t i) const {
    const int64_t bits = raw(i);
    double v;
    std::memcpy(&v, &bits, sizeof(v));
    return v;
  }

  // A tensor the op reads.
  int64_t input(size_t i, const char* name) { return tensor(i, name, false, false); }
  int64_t optional_input(size_t i, const char* name) { return tensor(i, name, true, false); }
  // The tensor the op writes.
  int64_t output(size_t i, const char* name) { return tensor(i, name, false, true); }

  int64_t integer(size_t i, const char* name, int64_t min,
                  int64_t max = std::numeric_limits<int64_t>::max()) {
    const int64_t v = raw(i);
    if (ok() && (v < min || v > max)) {
      if (max == std::numeric_limits<int64_t>::max()) {
        fail("operand %zu (%s) is %lld, must be >= %lld", i, name, ll(v), ll(min));
      } else {
        fail("operand %zu (%s) is %lld, must be in [%lld, %lld]", i, name, ll(v), ll(min), ll(max));
      }
    }
    return ok() ? v : (min > 0 ? min : 0);
  }

  bool flag(size_t i, const char* name) { return integer(i, name, 0, 1) != 0; }

  template <typename Enum>
  Enum kind(size_t i, const char* name, const char* enum_name, int64_t count) {
    const int64_t v = raw(i);
    if (ok() && (v < 0 || v >= count)) {
      fail("operand %zu (%s) is %lld, not a known %s (0..%lld)", i, name, ll(v), enum_name,
           ll(count - 1));
    }
    return static_cast<Enum>(ok() ? v : 0);
  }

  uint32_t rank(size_t i) { return static_cast<uint32_t>(integer(i, "rank", 0, blob::kMaxRank)); }

  void integers(size_t first, uint32_t n, const char* name, int64_t min, int64_t* out) {
    for (uint32_t d = 0; d < n && ok(); ++d) {
      out[d] = raw(first + d);
      if (out[d] < min) {
        fail("operand %zu (%s[%u]) is %lld, must be >= %lld", first + d, name, d, ll(out[d]),
             ll(min));
      }
    }
  }

  // Product of non-negative factors; reports an overflow as a failure naming `what`.
  int64_t product(const char* what, std::initializer_list<int64_t> factors) {
    int64_t p = 1;
    for (int64_t f : factors) {
      if (__builtin_mul_overflow(p, f, &p)) {
        fail("%s overflows int64", what);
        return 0;
      }
    }
    return p;
  }

  const Tensor& t(int64_t id) const { return graph_.tensors[static_cast<size_t>(id)]; }

  void require_numel(int64_t id, const char* name, int64_t expected, const char* from) {
    if (ok() && t(id).numel != expected) {
      fail("%s (tensor %lld) has %lld elements, but %s gives %lld", name, ll(id), ll(t(id).numel),
           from, ll(expected));
    }
  }

  void require_dtype(int64_t id, const char* name, bool good, const char* expected) {
    if (ok() && !good) {
      fail("%s (tensor %lld) is %s, expected %s", name, ll(id), dtype_name(t(id).dtype), expected);
    }
  }

  void require_class(int64_t id, const char* name, blob::DTypeClass c) {
    if (id == kNoTensor) {
      return;
    }
    const blob::DType dt = t(id).dtype;
    switch (c) {
      case blob::DTypeClass::kFloating:
        require_dtype(id, name, is_floating(dt), "Float32, Float16 or BFloat16");
        break;
      case blob::DTypeClass::kIndex:
        require_dtype(id, name, dt == blob::DType::kInt64 || dt == blob::DType::kInt32,
                      "Int64 or Int32");
        break;
      case blob::DTypeClass::kBool: require_dtype(id, name, dt == blob::DType::kBool, "Bool"); break;
    }
  }

  void require_floating(int64_t id, const char* name) {
    if (id != kNoTensor) {
      require_dtype(id, name, is_floating(t(id).dtype), "Float32, Float16 or BFloat16");
    }
  }

  void require_same_dtype(int64_t id, const char* name, int64_t other, const char* other_name) {
    if (ok() && t(id).dtype != t(other).dtype) {
      fail("%s (tensor %lld) is %s but %s (tensor %lld) is %s; they must match", name, ll(id),
           dtype_name(t(id).dtype), other_name, ll(other), dtype_name(t(other).dtype));
    }
  }

  // Every element offset `offset + sum_d idx_d * strides[d]` for idx in `sizes` must lie inside
  // the tensor. Only the lowest and highest offsets matter, and they come from the corners.
  void check_extent(const char* name, int64_t id, uint32_t rank, const int64_t* sizes,
                    int64_t offset, const int64_t* strides) {
    if (!ok()) {
      return;
    }
    for (uint32_t d = 0; d < rank; ++d) {
      if (sizes[d] == 0) {
        return;  // nothing is accessed
      }
    }
    int64_t lo = offset;
    int64_t hi = offset;
    for (uint32_t d = 0; d < rank; ++d) {
      int64_t span;
      bool overflow = __builtin_mul_overflow(sizes[d] - 1, strides[d], &span);
      overflow = overflow || __builtin_add_overflow(span < 0 ? lo : hi, span, span < 0 ? &lo : &hi);
      if (overflow) {
        fail("addressing %s (tensor %lld): offset plus strides times sizes overflows int64", name,
             ll(id));
        return;
      }
    }
    if (lo < 0 || hi >= t(id).numel) {
      fail(
          "%s (tensor %lld, %lld elements) is addressed at element offsets [%lld, %lld], outside "
          "[0, %lld)",
          name, ll(id), ll(t(id).numel), ll(lo), ll(hi), ll(t(id).numel));
    }
  }

  // Ops never write what they read (blob_format.h), and only arena or output tensors are written.
  void check_output_disjoint() {
    if (!ok() || written_ == kNoTensor) {
      return;
    }
    const Tensor& out = t(written_);
    for (size_t r = 0; r < num_read_; ++r) {
      const int64_t id = read_[r].id;
      if (id == written_ || tensors_overlap(out, t(id))) {
        fail(
            "output %s (tensor %lld, %s bytes [%llu, %llu)) overlaps input %s (tensor %lld, %s "
            "bytes [%llu, %llu))",
            written_name_, ll(written_), storage_name(out.storage), ull(out.offset),
            ull(out.offset + out.nbytes), read_[r].name, ll(id), storage_name(t(id).storage),
            ull(t(id).offset), ull(t(id).offset + t(id).nbytes));
        return;
      }
    }
  }

  int64_t tensor(size_t i, const char* name, bool optional, bool written) {
    return tensor(i, name, optional ? blob::Role::kOptionalInput
                                    : written ? blob::Role::kOutput : blob::Role::kInput);
  }

  int64_t tensor(size_t i, const char* name, blob::Role role) {
    const bool optional = role == blob::Role::kOptionalInput;
    const bool written = role == blob::Role::kOutput || role == blob::Role::kStateOutput;
    const int64_t id = raw(i);
    if (!ok()) {
      return kNoTensor;
    }
    if (optional && id == kNoTensor) {
      return kNoTensor;
    }
    if (id < 0 || static_cast<uint64_t>(id) >= graph_.tensors.size()) {
      fail("operand %zu (%s) is tensor id %lld, but the blob has %zu tensors%s", i, name, ll(id),
           graph_.tensors.size(), optional ? " (-1 means none)" : "");
      return kNoTensor;
    }
    if (written) {
      const blob::Storage s = t(id).storage;
      // State is the documented exception to "ops never write their inputs": an op whose output
      // role is kStateOutput (kIndexPut), and only such an op, writes it in place.
      const bool state_op = role == blob::Role::kStateOutput;
      if (state_op && s != blob::Storage::kState) {
        fail("operand %zu (%s) writes tensor %lld, whose storage is %s; %s writes only "
             "State tensors",
             i, name, ll(id), storage_name(s), opcode_name(opcode_));
        return kNoTensor;
      }
      if (!state_op && s != blob::Storage::kArena && s != blob::Storage::kOutput) {
        fail(
            "operand %zu (%s) writes tensor %lld, whose storage is %s; ops write only Arena or "
            "Output tensors",
            i, name, ll(id), storage_name(s));
        return kNoTensor;
      }
      written_ = id;
      written_name_ = name;
    } else if (num_read_ < kMaxRead) {
      read_[num_read_++] = {id, name};
    }
    return id;
  }

 private:
  uint64_t list_count(size_t field);
  std::string count_formula() const;

  struct Read {
    int64_t id;
    const char* name;
  };
  static constexpr size_t kMaxRead = blob::kMaxFusedInputs;

  static constexpr size_t kMaxFields = 40;

  const Graph& graph_;
  size_t index_;
  blob::Opcode opcode_;
  const blob::OpDesc& desc_;
  size_t position_[kMaxFields] = {};
  uint64_t length_[kMaxFields] = {};
  const int64_t* operands_;
  uint64_t count_;
  std::string* why_;
  Error error_ = Error::Ok;
  Read read_[kMaxRead] = {};
  size_t num_read_ = 0;
  int64_t written_ = kNoTensor;
  const char* written_name_ = "";
};


static_assert([] {
  for (const blob::OpDesc& op : blob::kOps) {
    if (op.num_fields > 40) return false;
  }
  return true;
}(), "OpDecoder::kMaxFields (40) is smaller than an op's field count");

// ---- The table's relations (KILN_CHECKS_<Name>), one table_checks overload per opcode. ----

#define KILN_A1(x) a.x
#define KILN_A2(x, y) a.x, a.y
#define KILN_A3(x, y, z) a.x, a.y, a.z
#define KILN_A4(x, y, z, w) a.x, a.y, a.z, a.w
#define KILN_PICK_A(_1, _2, _3, _4, NAME, ...) NAME
#define KILN_MEMBERS(...) \
  KILN_PICK_A(__VA_ARGS__, KILN_A4, KILN_A3, KILN_A2, KILN_A1, unused)(__VA_ARGS__)
#define KILN_CHECK_NUMEL(t, text, ...)                                                \
  if (a.t != kNoTensor) {                                                             \
    d.require_numel(a.t, #t, d.product(text, {KILN_MEMBERS(__VA_ARGS__)}), text);     \
  }
#define KILN_CHECK_DTYPE(t, cls) d.require_class(a.t, #t, blob::DTypeClass::cls);
#define KILN_CHECK_SAME_DTYPE(t, u)                 \
  if (a.t != kNoTensor && a.u != kNoTensor) {       \
    d.require_same_dtype(a.t, #t, a.u, #u);         \
  }
#define KILN_TABLE_CHECKS(Name, code, snake, args)                                          \
  inline void table_checks([[maybe_unused]] OpDecoder& d, [[maybe_unused]] const Name##Args& a) { \
    KILN_CHECKS_##Name(KILN_CHECK_NUMEL, KILN_CHECK_DTYPE, KILN_CHECK_SAME_DTYPE)           \
  }
KILN_OPCODES(KILN_TABLE_CHECKS)
#undef KILN_TABLE_CHECKS
#undef KILN_CHECK_NUMEL
#undef KILN_CHECK_DTYPE
#undef KILN_CHECK_SAME_DTYPE
#undef KILN_MEMBERS
#undef KILN_PICK_A
#undef KILN_A1
#undef KILN_A2
#undef KILN_A3
#undef KILN_A4

/// An op's checks after its table decoding: by default only its table relations. An op with
/// checks the table cannot state (window counts, extents, a fused program) has a check()
/// overload in op_checks.cpp, declared here, that calls table_checks where it fits.
template <typename Args>
void check(OpDecoder& d, const Args& a) {
  table_checks(d, a);
}
void check(OpDecoder& d, const CopyArgs& a);
void check(OpDecoder& d, const BinaryArgs& a);
void check(OpDecoder& d, const UnaryArgs& a);
void check(OpDecoder& d, const WhereArgs& a);
void check(OpDecoder& d, const MatmulArgs& a);
void check(OpDecoder& d, const ReduceArgs& a);
void check(OpDecoder& d, const Conv2dArgs& a);
void check(OpDecoder& d, const Pool2dArgs& a);
void check(OpDecoder& d, const FusedElementwiseArgs& a);
void check(OpDecoder& d, const AttentionArgs& a);
void check(OpDecoder& d, const GatherArgs& a);
void check(OpDecoder& d, const EmbeddingBagArgs& a);
void check(OpDecoder& d, const RopeArgs& a);
void check(OpDecoder& d, const QuantMatmulArgs& a);
void check(OpDecoder& d, const ScatterArgs& a);

/// Fills the Args struct of a `custom` op (op_table.def) from its decoded fields.
void fill(OpDecoder& d, FusedElementwiseArgs& a);
void fill(OpDecoder& d, ScatterArgs& a);

}  // namespace kiln::engine::op_decoder
