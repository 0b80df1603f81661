#include "format/op_decoder.h"

#include <cstdarg>
#include <cstring>
#include <initializer_list>
#include <limits>

#include "format/fail.h"

namespace kiln::engine {
namespace {

using executorch::runtime::Error;
using executorch::runtime::Result;

constexpr int64_t kInt64Min = std::numeric_limits<int64_t>::min();

using ull = unsigned long long;
using ll = long long;

// Two tensors whose bytes may be the same memory at run time.
bool tensors_overlap(const Tensor& a, const Tensor& b) {
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
// record nothing, so each decoder reads as a flat list of fields followed by `if (!ok())`.
class OpDecoder {
 public:
  OpDecoder(const Graph& graph, size_t index, blob::Opcode opcode, const int64_t* operands,
            uint64_t count, std::string* why)
      : graph_(graph),
        index_(index),
        opcode_(opcode),
        operands_(operands),
        count_(count),
        why_(why) {}

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

 private:
  int64_t tensor(size_t i, const char* name, bool optional, bool written) {
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
      // State is the documented exception to "ops never write their inputs": kIndexPut, and
      // only kIndexPut, writes it in place.
      const bool state_op = opcode_ == blob::Opcode::kIndexPut;
      if (state_op && s != blob::Storage::kState) {
        fail("operand %zu (%s) writes tensor %lld, whose storage is %s; index_put writes only "
             "State tensors",
             i, name, ll(id), storage_name(s));
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

  struct Read {
    int64_t id;
    const char* name;
  };
  static constexpr size_t kMaxRead = blob::kMaxFusedInputs;

  const Graph& graph_;
  size_t index_;
  blob::Opcode opcode_;
  const int64_t* operands_;
  uint64_t count_;
  std::string* why_;
  Error error_ = Error::Ok;
  Read read_[kMaxRead] = {};
  size_t num_read_ = 0;
  int64_t written_ = kNoTensor;
  const char* written_name_ = "";
};

// --- One decoder per opcode. Each follows the operand layout in blob_format.h. ---

int64_t numel_of(OpDecoder& d, uint32_t rank, const int64_t* sizes) {
  int64_t n = 1;
  for (uint32_t i = 0; i < rank && d.ok(); ++i) {
    n = d.product("the element count of sizes", {n, sizes[i]});
  }
  return n;
}

CopyArgs decode_copy(OpDecoder& d) {
  CopyArgs a{};
  if (!d.expect_at_least(3)) {
    return a;
  }
  a.rank = d.rank(2);
  if (!d.expect_count(5 + 3 * uint64_t{a.rank}, " (5 + 3 * rank)")) {
    return a;
  }
  const uint32_t r = a.rank;
  a.x = d.input(0, "x");
  a.out = d.output(1, "out");
  d.integers(3, r, "sizes", 0, a.sizes);
  a.in_offset = d.raw(3 + r);
  d.integers(4 + r, r, "in_strides", kInt64Min, a.in_strides);
  a.out_offset = d.raw(4 + 2 * r);
  d.integers(5 + 2 * r, r, "out_strides", kInt64Min, a.out_strides);
  if (!d.ok()) {
    return a;
  }
  numel_of(d, r, a.sizes);
  d.check_extent("x", a.x, r, a.sizes, a.in_offset, a.in_strides);
  d.check_extent("out", a.out, r, a.sizes, a.out_offset, a.out_strides);
  return a;
}

bool is_compare_or_logical(blob::BinaryKind k) {
  return k >= blob::BinaryKind::kEq && k <= blob::BinaryKind::kLogicalOr;
}

BinaryArgs decode_binary(OpDecoder& d) {
  BinaryArgs a{};
  if (!d.expect_at_least(7)) {
    return a;
  }
  a.rank = d.rank(6);
  if (!d.expect_count(7 + 3 * uint64_t{a.rank}, " (7 + 3 * rank)")) {
    return a;
  }
  const uint32_t r = a.rank;
  a.kind = d.kind<blob::BinaryKind>(0, "kind", "BinaryKind", 17);
  a.a = d.input(1, "a");
  a.b = d.optional_input(2, "b");
  a.out = d.output(3, "out");
  a.alpha = d.real(4);
  a.scalar = d.real(5);
  d.integers(7, r, "sizes", 0, a.sizes);
  d.integers(7 + r, r, "a_strides", kInt64Min, a.a_strides);
  d.integers(7 + 2 * r, r, "b_strides", kInt64Min, a.b_strides);
  if (!d.ok()) {
    return a;
  }
  d.require_numel(a.out, "out", numel_of(d, r, a.sizes), "sizes");
  d.check_extent("a", a.a, r, a.sizes, 0, a.a_strides);
  if (a.b != kNoTensor) {
    d.check_extent("b", a.b, r, a.sizes, 0, a.b_strides);
  }
  if (is_compare_or_logical(a.kind)) {
    d.require_dtype(a.out, "out", d.t(a.out).dtype == blob::DType::kBool,
                    "Bool for a comparison or logical kind");
  }
  return a;
}

UnaryArgs decode_unary(OpDecoder& d) {
  UnaryArgs a{};
  if (!d.expect_count(5, "")) {
    return a;
  }
  a.kind = d.kind<blob::UnaryKind>(0, "kind", "UnaryKind", 24);
  a.x = d.input(1, "x");
  a.out = d.output(2, "out");
  a.p0 = d.real(3);
  a.p1 = d.real(4);
  if (!d.ok()) {
    return a;
  }
  d.require_numel(a.out, "out", d.t(a.x).numel, "the element count of x");
  if (a.kind == blob::UnaryKind::kLogicalNot) {
    d.require_dtype(a.out, "out", d.t(a.out).dtype == blob::DType::kBool, "Bool for logical_not");
  }
  return a;
}

WhereArgs decode_where(OpDecoder& d) {
  WhereArgs a{};
  if (!d.expect_at_least(5)) {
    return a;
  }
  a.rank = d.rank(4);
  if (!d.expect_count(5 + 4 * uint64_t{a.rank}, " (5 + 4 * rank)")) {
    return a;
  }
  const uint32_t r = a.rank;
  a.cond = d.input(0, "cond");
  a.a = d.input(1, "a");
  a.b = d.input(2, "b");
  a.out = d.output(3, "out");
  d.integers(5, r, "sizes", 0, a.sizes);
  d.integers(5 + r, r, "cond_strides", kInt64Min, a.cond_strides);
  d.integers(5 + 2 * r, r, "a_strides", kInt64Min, a.a_strides);
  d.integers(5 + 3 * r, r, "b_strides", kInt64Min, a.b_strides);
  if (!d.ok()) {
    return a;
  }
  d.require_dtype(a.cond, "cond", d.t(a.cond).dtype == blob::DType::kBool, "Bool");
  d.require_numel(a.out, "out", numel_of(d, r, a.sizes), "sizes");
  d.check_extent("cond", a.cond, r, a.sizes, 0, a.cond_strides);
  d.check_extent("a", a.a, r, a.sizes, 0, a.a_strides);
  d.check_extent("b", a.b, r, a.sizes, 0, a.b_strides);
  return a;
}

MatmulArgs decode_matmul(OpDecoder& d) {
  MatmulArgs a{};
  if (!d.expect_count(18, "")) {
    return a;
  }
  a.a = d.input(0, "a");
  a.b = d.input(1, "b");
  a.bias = d.optional_input(2, "bias");
  a.out = d.output(3, "out");
  a.batch = d.integer(4, "batch", 0);
  a.m = d.integer(5, "M", 0);
  a.n = d.integer(6, "N", 0);
  a.k = d.integer(7, "K", 0);
  a.trans_a = d.flag(8, "trans_a");
  a.trans_b = d.flag(9, "trans_b");
  a.a_batch_stride = d.integer(10, "a_batch_stride", 0);
  a.b_batch_stride = d.integer(11, "b_batch_stride", 0);
  a.bias_row_stride = d.integer(12, "bias_row_stride", 0);
  a.bias_col_stride = d.integer(13, "bias_col_stride", 0);
  a.alpha = d.real(14);
  a.beta = d.real(15);
  a.epilogue = d.kind<blob::Epilogue>(16, "epilogue", "Epilogue", 4);
  a.residual = d.optional_input(17, "residual");
  if (!d.ok()) {
    return a;
  }
  d.require_floating(a.a, "a");
  d.require_same_dtype(a.b, "b", a.a, "a");
  if (d.ok() && d.t(a.out).dtype != d.t(a.a).dtype && d.t(a.out).dtype != blob::DType::kFloat32) {
    d.fail("out (tensor %lld) is %s, expected %s (as a) or Float32", ll(a.out),
           dtype_name(d.t(a.out).dtype), dtype_name(d.t(a.a).dtype));
  }
  d.require_floating(a.bias, "bias");
  // Each batch reads one dense M x K (K x M) matrix of a and K x N (N x K) of b.
  const int64_t a_matrix = d.product("M * K", {a.m, a.k});
  const int64_t b_matrix = d.product("K * N", {a.k, a.n});
  const int64_t one = 1;
  const int64_t a_sizes[2] = {a.batch, a_matrix};
  const int64_t a_strides[2] = {a.a_batch_stride, one};
  d.check_extent("a", a.a, 2, a_sizes, 0, a_strides);
  const int64_t b_sizes[2] = {a.batch, b_matrix};
  const int64_t b_strides[2] = {a.b_batch_stride, one};
  d.check_extent("b", a.b, 2, b_sizes, 0, b_strides);
  const int64_t out_numel = d.product("batch * M * N", {a.batch, a.m, a.n});
  d.require_numel(a.out, "out", out_numel, "batch * M * N");
  if (a.residual != kNoTensor) {
    d.require_same_dtype(a.residual, "residual", a.out, "out");
    d.require_numel(a.residual, "residual", out_numel, "batch * M * N");
  }
  if (a.bias != kNoTensor) {
    const int64_t bias_sizes[3] = {a.batch, a.m, a.n};
    const int64_t bias_strides[3] = {0, a.bias_row_stride, a.bias_col_stride};
    d.check_extent("bias", a.bias, 3, bias_sizes, 0, bias_strides);
  }
  return a;
}

SoftmaxArgs decode_softmax(OpDecoder& d) {
  SoftmaxArgs a{};
  if (!d.expect_count(6, "")) {
    return a;
  }
  a.x = d.input(0, "x");
  a.out = d.output(1, "out");
  a.outer = d.integer(2, "outer", 0);
  a.dim = d.integer(3, "dim", 0);
  a.inner = d.integer(4, "inner", 0);
  a.is_log = d.flag(5, "is_log");
  if (!d.ok()) {
    return a;
  }
  const int64_t n = d.product("outer * dim * inner", {a.outer, a.dim, a.inner});
  d.require_numel(a.x, "x", n, "outer * dim * inner");
  d.require_numel(a.out, "out", n, "outer * dim * inner");
  d.require_floating(a.x, "x");
  d.require_same_dtype(a.out, "out", a.x, "x");
  return a;
}

LayerNormArgs decode_layer_norm(OpDecoder& d) {
  LayerNormArgs a{};
  if (!d.expect_count(7, "")) {
    return a;
  }
  a.x = d.input(0, "x");
  a.weight = d.optional_input(1, "weight");
  a.bias = d.optional_input(2, "bias");
  a.out = d.output(3, "out");
  a.rows = d.integer(4, "rows", 0);
  a.cols = d.integer(5, "cols", 0);
  a.eps = d.real(6);
  if (!d.ok()) {
    return a;
  }
  const int64_t n = d.product("rows * cols", {a.rows, a.cols});
  d.require_numel(a.x, "x", n, "rows * cols");
  d.require_numel(a.out, "out", n, "rows * cols");
  if (a.weight != kNoTensor) {
    d.require_numel(a.weight, "weight", a.cols, "cols");
  }
  if (a.bias != kNoTensor) {
    d.require_numel(a.bias, "bias", a.cols, "cols");
  }
  d.require_floating(a.x, "x");
  d.require_same_dtype(a.out, "out", a.x, "x");
  d.require_floating(a.weight, "weight");
  d.require_floating(a.bias, "bias");
  return a;
}

ReduceArgs decode_reduce(OpDecoder& d) {
  ReduceArgs a{};
  if (!d.expect_count(6, "")) {
    return a;
  }
  a.kind = d.kind<blob::ReduceKind>(0, "kind", "ReduceKind", 5);
  a.x = d.input(1, "x");
  a.out = d.output(2, "out");
  a.outer = d.integer(3, "outer", 0);
  a.reduce = d.integer(4, "reduce", 0);
  a.inner = d.integer(5, "inner", 0);
  if (!d.ok()) {
    return a;
  }
  d.require_numel(a.x, "x", d.product("outer * reduce * inner", {a.outer, a.reduce, a.inner}),
                  "outer * reduce * inner");
  const int64_t kept = d.product("outer * inner", {a.outer, a.inner});
  d.require_numel(a.out, "out", kept, "outer * inner");
  const blob::DType out = d.ok() ? d.t(a.out).dtype : blob::DType::kBool;
  if (a.kind == blob::ReduceKind::kAny) {
    d.require_dtype(a.out, "out", out == blob::DType::kBool, "Bool for any");
  } else if (a.kind == blob::ReduceKind::kMean) {
    d.require_dtype(a.out, "out", is_floating(out), "a floating dtype for mean");
  }
  if (d.ok() && a.reduce == 0 && kept > 0 &&
      (a.kind == blob::ReduceKind::kAmax || a.kind == blob::ReduceKind::kAmin)) {
    d.fail("amax/amin over an empty axis (reduce = 0) has no identity");
  }
  return a;
}

EmbeddingArgs decode_embedding(OpDecoder& d) {
  EmbeddingArgs a{};
  if (!d.expect_count(6, "")) {
    return a;
  }
  a.weight = d.input(0, "weight");
  a.indices = d.input(1, "indices");
  a.out = d.output(2, "out");
  a.num_indices = d.integer(3, "num_indices", 0);
  a.dim = d.integer(4, "dim", 0);
  a.vocab = d.integer(5, "vocab", 0);
  if (!d.ok()) {
    return a;
  }
  d.require_numel(a.weight, "weight", d.product("vocab * dim", {a.vocab, a.dim}), "vocab * dim");
  d.require_numel(a.indices, "indices", a.num_indices, "num_indices");
  d.require_numel(a.out, "out", d.product("num_indices * dim", {a.num_indices, a.dim}),
                  "num_indices * dim");
  const blob::DType idx = d.t(a.indices).dtype;
  d.require_dtype(a.indices, "indices", idx == blob::DType::kInt64 || idx == blob::DType::kInt32,
                  "Int64 or Int32");
  d.require_same_dtype(a.out, "out", a.weight, "weight");
  return a;
}

IndexPutArgs decode_index_put(OpDecoder& d) {
  IndexPutArgs a{};
  if (!d.expect_count(7, "")) {
    return a;
  }
  a.values = d.input(0, "values");
  a.positions = d.input(1, "positions");
  a.out = d.output(2, "out");
  a.outer = d.integer(3, "outer", 0);
  a.dim_size = d.integer(4, "dim_size", 0);
  a.inner = d.integer(5, "inner", 0);
  a.num_positions = d.integer(6, "num_positions", 0);
  if (!d.ok()) {
    return a;
  }
  d.require_numel(a.out, "out", d.product("outer * dim_size * inner", {a.outer, a.dim_size, a.inner}),
                  "outer * dim_size * inner");
  d.require_numel(a.values, "values",
                  d.product("outer * num_positions * inner", {a.outer, a.num_positions, a.inner}),
                  "outer * num_positions * inner");
  d.require_numel(a.positions, "positions", a.num_positions, "num_positions");
  const blob::DType pos = d.t(a.positions).dtype;
  d.require_dtype(a.positions, "positions",
                  pos == blob::DType::kInt64 || pos == blob::DType::kInt32, "Int64 or Int32");
  d.require_same_dtype(a.values, "values", a.out, "out");
  return a;
}

FillArgs decode_fill(OpDecoder& d) {
  FillArgs a{};
  if (!d.expect_count(2, "")) {
    return a;
  }
  a.out = d.output(0, "out");
  a.value = d.real(1);
  return a;
}

// floor((in + 2 * pad - dil * (k - 1) - 1) / stride) + 1, the convolution / pooling output size.
int64_t window_count(OpDecoder& d, const char* axis, int64_t in, int64_t pad, int64_t dil,
                     int64_t k, int64_t stride, bool* ceil_ok) {
  int64_t padded, reach, span;
  if (__builtin_mul_overflow(pad, 2, &padded) || __builtin_add_overflow(in, padded, &padded) ||
      __builtin_mul_overflow(dil, k - 1, &reach) || __builtin_add_overflow(reach, 1, &reach) ||
      __builtin_sub_overflow(padded, reach, &span)) {
    d.fail("output size along %s overflows int64", axis);
    return 0;
  }
  if (span < 0) {
    d.fail("the dilated kernel along %s (%lld) is larger than the padded input (%lld)", axis,
           ll(reach), ll(padded));
    return 0;
  }
  *ceil_ok = span % stride != 0;
  return span / stride + 1;
}

Conv2dArgs decode_conv2d(OpDecoder& d) {
  Conv2dArgs a{};
  if (!d.expect_count(20, "")) {
    return a;
  }
  a.x = d.input(0, "x");
  a.weight = d.input(1, "weight");
  a.bias = d.optional_input(2, "bias");
  a.out = d.output(3, "out");
  a.n = d.integer(4, "N", 0);
  a.c_in = d.integer(5, "C_in", 0);
  a.h = d.integer(6, "H", 0);
  a.w = d.integer(7, "W", 0);
  a.c_out = d.integer(8, "C_out", 0);
  a.kh = d.integer(9, "kH", 1);
  a.kw = d.integer(10, "kW", 1);
  a.stride_h = d.integer(11, "stride_h", 1);
  a.stride_w = d.integer(12, "stride_w", 1);
  a.pad_h = d.integer(13, "pad_h", 0);
  a.pad_w = d.integer(14, "pad_w", 0);
  a.dil_h = d.integer(15, "dil_h", 1);
  a.dil_w = d.integer(16, "dil_w", 1);
  a.groups = d.integer(17, "groups", 1);
  a.h_out = d.integer(18, "H_out", 0);
  a.w_out = d.integer(19, "W_out", 0);
  if (!d.ok()) {
    return a;
  }
  if (a.c_in % a.groups != 0 || a.c_out % a.groups != 0) {
    d.fail("groups (%lld) must divide C_in (%lld) and C_out (%lld)", ll(a.groups), ll(a.c_in),
           ll(a.c_out));
    return a;
  }
  bool unused;
  const int64_t h_out = window_count(d, "H", a.h, a.pad_h, a.dil_h, a.kh, a.stride_h, &unused);
  const int64_t w_out = window_count(d, "W", a.w, a.pad_w, a.dil_w, a.kw, a.stride_w, &unused);
  if (d.ok() && (h_out != a.h_out || w_out != a.w_out)) {
    d.fail(
        "H_out x W_out is %lld x %lld, but the input, kernel, stride, padding and dilation give "
        "%lld x %lld",
        ll(a.h_out), ll(a.w_out), ll(h_out), ll(w_out));
  }
  d.require_numel(a.x, "x", d.product("N * C_in * H * W", {a.n, a.c_in, a.h, a.w}),
                  "N * C_in * H * W");
  d.require_numel(
      a.weight, "weight",
      d.product("C_out * C_in / groups * kH * kW", {a.c_out, a.c_in / a.groups, a.kh, a.kw}),
      "C_out * C_in / groups * kH * kW");
  if (a.bias != kNoTensor) {
    d.require_numel(a.bias, "bias", a.c_out, "C_out");
  }
  d.require_numel(a.out, "out",
                  d.product("N * C_out * H_out * W_out", {a.n, a.c_out, a.h_out, a.w_out}),
                  "N * C_out * H_out * W_out");
  d.require_floating(a.x, "x");
  d.require_same_dtype(a.weight, "weight", a.x, "x");
  d.require_same_dtype(a.out, "out", a.x, "x");
  d.require_floating(a.bias, "bias");
  return a;
}

Pool2dArgs decode_pool2d(OpDecoder& d) {
  Pool2dArgs a{};
  if (!d.expect_count(18, "")) {
    return a;
  }
  a.kind = d.kind<blob::PoolKind>(0, "kind", "PoolKind", 2);
  a.x = d.input(1, "x");
  a.out = d.output(2, "out");
  a.n = d.integer(3, "N", 0);
  a.c = d.integer(4, "C", 0);
  a.h = d.integer(5, "H", 0);
  a.w = d.integer(6, "W", 0);
  a.kh = d.integer(7, "kH", 1);
  a.kw = d.integer(8, "kW", 1);
  a.stride_h = d.integer(9, "stride_h", 1);
  a.stride_w = d.integer(10, "stride_w", 1);
  a.pad_h = d.integer(11, "pad_h", 0);
  a.pad_w = d.integer(12, "pad_w", 0);
  a.dil_h = d.integer(13, "dil_h", 1);
  a.dil_w = d.integer(14, "dil_w", 1);
  a.h_out = d.integer(15, "H_out", 0);
  a.w_out = d.integer(16, "W_out", 0);
  a.count_include_pad = d.flag(17, "count_include_pad");
  if (!d.ok()) {
    return a;
  }
  if (a.kind == blob::PoolKind::kAvg && (a.dil_h != 1 || a.dil_w != 1)) {
    d.fail("average pooling has no dilation, but dil_h x dil_w is %lld x %lld", ll(a.dil_h),
           ll(a.dil_w));
    return a;
  }
  // ceil_mode is folded into H_out / W_out: either the floor count or one more.
  bool h_ceil = false;
  bool w_ceil = false;
  const int64_t h_out = window_count(d, "H", a.h, a.pad_h, a.dil_h, a.kh, a.stride_h, &h_ceil);
  const int64_t w_out = window_count(d, "W", a.w, a.pad_w, a.dil_w, a.kw, a.stride_w, &w_ceil);
  if (d.ok() && (a.h_out < h_out || a.h_out > h_out + (h_ceil ? 1 : 0) || a.w_out < w_out ||
                 a.w_out > w_out + (w_ceil ? 1 : 0))) {
    d.fail(
        "H_out x W_out is %lld x %lld, but the input, kernel, stride, padding and dilation give "
        "%lld x %lld (floor) or one more along an axis (ceil_mode)",
        ll(a.h_out), ll(a.w_out), ll(h_out), ll(w_out));
  }
  d.require_numel(a.x, "x", d.product("N * C * H * W", {a.n, a.c, a.h, a.w}), "N * C * H * W");
  d.require_numel(a.out, "out", d.product("N * C * H_out * W_out", {a.n, a.c, a.h_out, a.w_out}),
                  "N * C * H_out * W_out");
  d.require_floating(a.x, "x");
  d.require_same_dtype(a.out, "out", a.x, "x");
  return a;
}

bool is_floating_kind(blob::UnaryKind k) { return k != blob::UnaryKind::kLogicalNot; }

FusedElementwiseArgs decode_fused_elementwise(OpDecoder& d) {
  FusedElementwiseArgs a{};
  if (!d.expect_at_least(3)) {
    return a;
  }
  a.rank = d.rank(1);
  const uint32_t r = a.rank;
  if (!d.expect_at_least(4 + uint64_t{r})) {
    return a;
  }
  a.num_inputs = static_cast<uint32_t>(d.integer(2 + r, "num_inputs", 0, blob::kMaxFusedInputs));
  const uint32_t n_in = a.num_inputs;
  const uint64_t instrs_at = 3 + uint64_t{r} + n_in + uint64_t{n_in} * r;
  if (!d.expect_at_least(instrs_at + 1)) {
    return a;
  }
  a.num_instrs = static_cast<uint32_t>(
      d.integer(instrs_at, "num_instrs", 1, blob::kMaxFusedInstrs));
  const uint64_t program_at = instrs_at + 1;
  if (!d.expect_count(program_at + uint64_t{a.num_instrs} * blob::kFusedInstrWidth,
                      " (4 + rank + num_inputs * (1 + rank) + 8 * num_instrs)")) {
    return a;
  }
  a.out = d.output(0, "out");
  d.integers(2, r, "sizes", 0, a.sizes);
  for (uint32_t i = 0; i < n_in && d.ok(); ++i) {
    a.inputs[i] = d.input(3 + r + i, "inputs[i]");
    d.integers(3 + r + n_in + uint64_t{i} * r, r, "strides", kInt64Min, a.strides[i]);
  }
  if (!d.ok()) {
    return a;
  }
  const int64_t numel = numel_of(d, r, a.sizes);
  d.require_numel(a.out, "out", numel, "sizes");
  d.require_floating(a.out, "out");
  for (uint32_t i = 0; i < n_in && d.ok(); ++i) {
    const blob::DType dt = d.t(a.inputs[i]).dtype;
    d.require_dtype(a.inputs[i], "an input", is_floating(dt) || dt == blob::DType::kBool,
                    "Float32, Float16, BFloat16 or Bool");
    d.check_extent("an input", a.inputs[i], r, a.sizes, 0, a.strides[i]);
  }
  for (uint32_t j = 0; j < a.num_instrs && d.ok(); ++j) {
    const size_t at = program_at + size_t{j} * blob::kFusedInstrWidth;
    FusedInstr& in = a.instrs[j];
    in.form = d.kind<blob::FusedForm>(at, "program form", "FusedForm", 3);
    const int64_t defined = int64_t{n_in} + j;  // registers written before instruction j
    int needed = 1;
    if (in.form == blob::FusedForm::kUnary) {
      const auto k = d.kind<blob::UnaryKind>(at + 1, "program kind", "UnaryKind", 24);
      if (d.ok() && !is_floating_kind(k)) {
        d.fail("instruction %u: logical_not is not a fused kind", j);
      }
      in.kind = static_cast<int64_t>(k);
    } else if (in.form == blob::FusedForm::kBinary) {
      const auto k = d.kind<blob::BinaryKind>(at + 1, "program kind", "BinaryKind", 17);
      if (d.ok() && is_compare_or_logical(k)) {
        d.fail("instruction %u: compare and logical kinds are not fused kinds", j);
      }
      in.kind = static_cast<int64_t>(k);
      needed = 2;
    } else {
      in.kind = d.integer(at + 1, "program kind", 0, 0);
      needed = 3;
    }
    for (int s = 0; s < 3 && d.ok(); ++s) {
      const int64_t v = d.raw(at + 2 + s);
      // A binary's second source may be -1 (the scalar); sources past the form's are -1.
      const bool may_be_absent = s >= needed || (in.form == blob::FusedForm::kBinary && s == 1);
      if ((v == -1 && may_be_absent) || (s < needed && v >= 0 && v < defined)) {
        in.src[s] = static_cast<int32_t>(v);
      } else {
        d.fail("instruction %u: source %d is register %lld; it must be one written before "
               "(0..%lld)%s",
               j, s, ll(v), ll(defined - 1), may_be_absent ? " or -1" : "");
      }
    }
    in.p0 = d.real(at + 5);
    in.p1 = d.real(at + 6);
    const int64_t rnd = d.raw(at + 7);
    in.round = static_cast<blob::DType>(rnd);
    if (d.ok() && rnd != static_cast<int64_t>(blob::DType::kFloat32) &&
        rnd != static_cast<int64_t>(blob::DType::kFloat16) &&
        rnd != static_cast<int64_t>(blob::DType::kBFloat16)) {
      d.fail("instruction %u: round dtype %lld is not Float32, Float16 or BFloat16", j, ll(rnd));
    }
  }
  return a;
}

}  // namespace

Result<Op> decode_op(const Graph& graph, size_t index, blob::Opcode opcode, const int64_t* operands,
                     uint64_t count, std::string* why) {
  OpDecoder d(graph, index, opcode, operands, count, why);
  Op op{opcode, FillArgs{}};
  switch (opcode) {
    case blob::Opcode::kCopy: op.args = decode_copy(d); break;
    case blob::Opcode::kBinary: op.args = decode_binary(d); break;
    case blob::Opcode::kUnary: op.args = decode_unary(d); break;
    case blob::Opcode::kWhere: op.args = decode_where(d); break;
    case blob::Opcode::kMatmul: op.args = decode_matmul(d); break;
    case blob::Opcode::kSoftmax: op.args = decode_softmax(d); break;
    case blob::Opcode::kLayerNorm: op.args = decode_layer_norm(d); break;
    case blob::Opcode::kReduce: op.args = decode_reduce(d); break;
    case blob::Opcode::kEmbedding: op.args = decode_embedding(d); break;
    case blob::Opcode::kFill: op.args = decode_fill(d); break;
    case blob::Opcode::kConv2d: op.args = decode_conv2d(d); break;
    case blob::Opcode::kPool2d: op.args = decode_pool2d(d); break;
    case blob::Opcode::kIndexPut: op.args = decode_index_put(d); break;
    case blob::Opcode::kFusedElementwise: op.args = decode_fused_elementwise(d); break;
  }
  d.check_output_disjoint();
  if (!d.ok()) {
    return d.error();
  }
  return op;
}

}  // namespace kiln::engine
