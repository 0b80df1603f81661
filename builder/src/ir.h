// The builder's in-memory Kiln IR: tensors and ops as the blob records them, plus what only the
// builder needs (weight contents, `alias_of` for views, names). Ops keep their operands as the
// blob's operand layouts define them (blob_format.h), one value list per field, so the passes
// address fields by name and the writer encodes them without a per-opcode struct.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "format/blob_format.h"
#include "format/dtype.h"
#include "format/op_table.h"

namespace kiln::builder {

namespace blob = kiln::engine::blob;

/// What every builder step throws on failure; the C API turns it into an error code and message.
/// Exceptions stay inside the library: the C boundary catches everything.
struct BuildError : std::runtime_error {
  int code;
  BuildError(int code, const std::string& message) : std::runtime_error(message), code(code) {}
};

[[noreturn]] void fail(int code, const char* format, ...) __attribute__((format(printf, 2, 3)));

inline constexpr int64_t kNoTensor = -1;
inline constexpr uint64_t kArenaAlignment = 256;

struct Tensor {
  int64_t id = 0;
  blob::DType dtype = blob::DType::kFloat32;
  std::vector<int64_t> shape;
  blob::Storage storage = blob::Storage::kArena;
  uint64_t offset = 0;
  std::vector<uint8_t> data;      // a weight's contents or a state's initial value
  bool has_data = false;
  int64_t alias_of = kNoTensor;   // a view: shares the storage of this tensor id
  uint64_t view_bytes = 0;        // a view's start inside alias_of's bytes (0: the whole of it)
  std::string name;

  int64_t numel() const;
  uint64_t nbytes() const;
};

// The format's dtype helpers (format/dtype.h), the one copy every consumer uses.
using kiln::engine::element_size;
using kiln::engine::is_floating;
using kiln::engine::is_known_dtype;

/// One field of an operand layout, as the op table (format/op_table.def) defines it: kind 't'
/// tensor id, 'n' integer (enums included), 'f' double (stored as bits), 'l' a list of integers,
/// 'T' a list of tensor ids. A list's length is the product of the fields named in `count` (or
/// the number there).
struct FieldSpec {
  char kind;
  const char* name;
  const char* count;   // lists only: "rank", "num_inputs*rank", "num_instrs*8"
};

/// The operand layout of an opcode, read from the op table; nullptr for an unknown opcode.
const std::vector<FieldSpec>* layout(uint32_t opcode);

struct Op {
  blob::Opcode opcode;
  std::vector<std::vector<int64_t>> fields;   // one entry per layout field, scalars have one value

  int64_t& at(const char* name);
  int64_t at(const char* name) const;
  std::vector<int64_t>& list(const char* name);
  const std::vector<int64_t>& list(const char* name) const;
  double real(const char* name) const;   // an 'f' field as a double
  int64_t out() const { return at("out"); }

  /// Tensor ids this op reads: every single tensor field but `out` that is not kNoTensor, in
  /// layout order, then the tensor lists.
  std::vector<int64_t> reads() const;
  /// Replaces tensor id `from` with `to` in every tensor field.
  void rename(int64_t from, int64_t to);
  /// Calls fn(int64_t&) on every tensor id (single fields, kNoTensor included, and lists).
  template <typename Fn>
  void for_each_tensor(Fn fn);
  template <typename Fn>
  void for_each_tensor(Fn fn) const;
};

/// Decodes op `index` from its operand slots; throws BuildError naming the op and field when the
/// count does not match the layout.
Op decode_op(size_t index, uint32_t opcode, const int64_t* slots, uint64_t count);
/// The op's operand slots (throws when a list's length disagrees with its count fields).
std::vector<int64_t> encode_op(const Op& op, size_t index);

/// Builds an op from field values given in layout order (used by the passes for new ops).
Op make_op(blob::Opcode opcode, std::vector<std::vector<int64_t>> fields);

int64_t double_bits(double value);
double bits_double(int64_t bits);

struct Graph {
  std::vector<Tensor> tensors;
  std::vector<Op> ops;
  std::vector<int64_t> inputs;    // tensor ids, delegate input order
  std::vector<int64_t> outputs;   // tensor ids, delegate output order
  blob::Precision precision = blob::Precision::kFp32;
  uint64_t arena_size = 0;

  int64_t root(int64_t id) const;
  /// Where a view starts inside its root, in bytes (the sum of view_bytes along the chain).
  uint64_t view_offset(int64_t id) const;
  int64_t add_tensor(blob::DType dtype, const std::vector<int64_t>& shape, const std::string& name);
};

template <typename Fn>
void Op::for_each_tensor(Fn fn) {
  const auto& specs = *layout(static_cast<uint32_t>(opcode));
  for (size_t i = 0; i < specs.size(); ++i) {
    if (specs[i].kind == 't' || specs[i].kind == 'T') {
      for (int64_t& id : fields[i]) fn(id);
    }
  }
}

template <typename Fn>
void Op::for_each_tensor(Fn fn) const {
  const auto& specs = *layout(static_cast<uint32_t>(opcode));
  for (size_t i = 0; i < specs.size(); ++i) {
    if (specs[i].kind == 't' || specs[i].kind == 'T') {
      for (int64_t id : fields[i]) fn(id);
    }
  }
}

}  // namespace kiln::builder
