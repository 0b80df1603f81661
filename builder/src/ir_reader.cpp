#include "builder/src/ir_reader.h"

#include <cstring>

#include "kiln/builder.h"

namespace kiln::builder {
namespace {

using ull = unsigned long long;
using ll = long long;

// A cursor over the buffer that refuses to read past its end.
class Cursor {
 public:
  Cursor(const uint8_t* data, size_t size) : data_(data), size_(size) {}

  template <typename T>
  T get(const char* what) {
    T value;
    need(sizeof(T), what);
    std::memcpy(&value, data_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return value;
  }

  const uint8_t* take(uint64_t n, const char* what) {
    need(n, what);
    const uint8_t* p = data_ + pos_;
    pos_ += n;
    return p;
  }

  size_t pos() const { return pos_; }

 private:
  void need(uint64_t n, const char* what) {
    if (n > size_ - pos_) {
      fail(KILN_BUILDER_INVALID_IR, "IR truncated: %s needs %llu bytes at offset %zu, the buffer "
           "has %zu", what, ull(n), pos_, size_);
    }
  }

  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
};

struct Entry {
  uint64_t data_size = 0;
  uint32_t name_size = 0;
};

}  // namespace

Graph read_ir(const void* data, size_t size) {
  if (data == nullptr) fail(KILN_BUILDER_INVALID_IR, "IR buffer is NULL");
  Cursor c(static_cast<const uint8_t*>(data), size);
  const uint8_t* magic = c.take(8, "header");
  if (std::memcmp(magic, KILN_IR_MAGIC, 8) != 0) {
    fail(KILN_BUILDER_INVALID_IR, "IR magic is not KILNIR (not a Kiln IR buffer)");
  }
  uint32_t version = c.get<uint32_t>("header");
  if (version != KILN_IR_VERSION) {
    fail(KILN_BUILDER_INVALID_IR, "IR version %u, this builder reads version %u (rebuild the "
         "Python package and libkiln_builder.so together)", version, KILN_IR_VERSION);
  }
  uint32_t header_size = c.get<uint32_t>("header");
  if (header_size != KILN_IR_HEADER_SIZE) {
    fail(KILN_BUILDER_INVALID_IR, "IR header_size %u, expected %u", header_size, KILN_IR_HEADER_SIZE);
  }
  Graph g;
  uint32_t precision = c.get<uint32_t>("header");
  if (precision > uint32_t(blob::Precision::kBf16)) {
    fail(KILN_BUILDER_INVALID_IR, "IR precision %u is not a blob::Precision", precision);
  }
  g.precision = static_cast<blob::Precision>(precision);
  uint32_t num_tensors = c.get<uint32_t>("header");
  uint32_t num_ops = c.get<uint32_t>("header");
  uint32_t num_inputs = c.get<uint32_t>("header");
  uint32_t num_outputs = c.get<uint32_t>("header");
  c.get<uint32_t>("header");
  uint64_t num_operands = c.get<uint64_t>("header");
  g.arena_size = c.get<uint64_t>("header");
  uint64_t total_size = c.get<uint64_t>("header");
  if (total_size != size) {
    fail(KILN_BUILDER_INVALID_IR, "IR total_size %llu != buffer size %zu", ull(total_size), size);
  }
  // Bound the counts by the buffer before allocating anything for them.
  if (uint64_t(num_tensors) * KILN_IR_TENSOR_ENTRY_SIZE > size ||
      uint64_t(num_ops) * KILN_IR_OP_ENTRY_SIZE > size || num_operands > size / 8 ||
      (uint64_t(num_inputs) + num_outputs) * 4 > size) {
    fail(KILN_BUILDER_INVALID_IR, "IR counts (num_tensors %u, num_ops %u, num_operands %llu, "
         "num_inputs %u, num_outputs %u) do not fit in %zu bytes", num_tensors, num_ops,
         ull(num_operands), num_inputs, num_outputs, size);
  }

  std::vector<Entry> entries(num_tensors);
  g.tensors.resize(num_tensors);
  for (uint32_t i = 0; i < num_tensors; ++i) {
    Tensor& t = g.tensors[i];
    t.id = i;
    uint32_t dtype = c.get<uint32_t>("tensor entry");
    uint32_t rank = c.get<uint32_t>("tensor entry");
    int64_t sizes[blob::kMaxRank];
    for (auto& s : sizes) s = c.get<int64_t>("tensor entry");
    uint32_t storage = c.get<uint32_t>("tensor entry");
    int32_t alias_of = c.get<int32_t>("tensor entry");
    t.offset = c.get<uint64_t>("tensor entry");
    entries[i].data_size = c.get<uint64_t>("tensor entry");
    entries[i].name_size = c.get<uint32_t>("tensor entry");
    c.get<uint32_t>("tensor entry");
    if (!is_known_dtype(dtype)) fail(KILN_BUILDER_INVALID_IR, "tensor %u: unknown dtype %u", i, dtype);
    t.dtype = static_cast<blob::DType>(dtype);
    if (rank > blob::kMaxRank) {
      fail(KILN_BUILDER_INVALID_IR, "tensor %u has rank %u > %u", i, rank, blob::kMaxRank);
    }
    int64_t numel = 1;
    for (uint32_t d = 0; d < rank; ++d) {
      if (sizes[d] < 0) fail(KILN_BUILDER_INVALID_IR, "tensor %u: size[%u] = %lld", i, d, ll(sizes[d]));
      // Keep numel * 8 within int64 so every later byte count is exact.
      if (__builtin_mul_overflow(numel, sizes[d], &numel) || numel > (int64_t(1) << 59)) {
        fail(KILN_BUILDER_INVALID_IR, "tensor %u: element count overflows", i);
      }
      t.shape.push_back(sizes[d]);
    }
    if (storage > uint32_t(blob::Storage::kState)) {
      fail(KILN_BUILDER_INVALID_IR, "tensor %u: unknown storage %u", i, storage);
    }
    t.storage = static_cast<blob::Storage>(storage);
    if (alias_of < -1 || alias_of >= int64_t(num_tensors) || alias_of == int64_t(i)) {
      fail(KILN_BUILDER_INVALID_IR, "tensor %u: alias_of %d is not another tensor id (0..%u)", i,
           alias_of, num_tensors);
    }
    t.alias_of = alias_of;
  }
  // Alias chains must end: walk each with a step bound.
  for (uint32_t i = 0; i < num_tensors; ++i) {
    int64_t id = i;
    for (uint32_t steps = 0; g.tensors[id].alias_of != kNoTensor; ++steps) {
      if (steps >= num_tensors) fail(KILN_BUILDER_INVALID_IR, "tensor %u: alias_of chain is a cycle", i);
      id = g.tensors[id].alias_of;
    }
    const Tensor& t = g.tensors[i];
    if (t.alias_of != kNoTensor && t.nbytes() != g.tensors[id].nbytes()) {
      fail(KILN_BUILDER_INVALID_IR, "tensor %u (a view of %lld) has %llu bytes, its root %llu",
           i, ll(id), ull(t.nbytes()), ull(g.tensors[id].nbytes()));
    }
    bool stored = t.alias_of == kNoTensor &&
                  (t.storage == blob::Storage::kWeight || t.storage == blob::Storage::kState);
    uint64_t want = stored ? t.nbytes() : 0;
    if (entries[i].data_size != want) {
      fail(KILN_BUILDER_INVALID_IR, "tensor %u: data_size %llu, expected %llu (%s)", i,
           ull(entries[i].data_size), ull(want),
           stored ? "numel * element size of a weight or state" : "only weights and states have data");
    }
  }

  std::vector<std::pair<uint32_t, uint32_t>> op_entries(num_ops);
  uint64_t total_operands = 0;
  for (uint32_t i = 0; i < num_ops; ++i) {
    op_entries[i].first = c.get<uint32_t>("op entry");
    op_entries[i].second = c.get<uint32_t>("op entry");
    total_operands += op_entries[i].second;
  }
  if (total_operands != num_operands) {
    fail(KILN_BUILDER_INVALID_IR, "ops take %llu operands in all, the header says num_operands %llu",
         ull(total_operands), ull(num_operands));
  }
  std::vector<int64_t> pool(num_operands);
  if (num_operands) std::memcpy(pool.data(), c.take(num_operands * 8, "operand pool"), num_operands * 8);
  uint64_t first = 0;
  for (uint32_t i = 0; i < num_ops; ++i) {
    Op op = decode_op(i, op_entries[i].first, pool.data() + first, op_entries[i].second);
    first += op_entries[i].second;
    const auto& specs = *layout(op_entries[i].first);
    for (size_t f = 0; f < specs.size(); ++f) {
      if (specs[f].kind != 't' && specs[f].kind != 'T') continue;
      bool optional = specs[f].kind == 't' && std::strcmp(specs[f].name, "out") != 0;
      for (int64_t id : op.fields[f]) {
        if ((id == kNoTensor && optional) || (id >= 0 && id < int64_t(num_tensors))) continue;
        fail(KILN_BUILDER_INVALID_IR, "op %u: %s = %lld is not a tensor id (0..%u)", i,
             specs[f].name, ll(id), num_tensors);
      }
    }
    g.ops.push_back(std::move(op));
  }

  for (uint32_t i = 0; i < num_inputs + num_outputs; ++i) {
    uint32_t id = c.get<uint32_t>("io table");
    if (id >= num_tensors) {
      fail(KILN_BUILDER_INVALID_IR, "%s %u: tensor id %u, there are %u tensors",
           i < num_inputs ? "input" : "output", i < num_inputs ? i : i - num_inputs, id, num_tensors);
    }
    (i < num_inputs ? g.inputs : g.outputs).push_back(id);
  }
  for (uint32_t i = 0; i < num_tensors; ++i) {
    const uint8_t* name = c.take(entries[i].name_size, "names section");
    g.tensors[i].name.assign(reinterpret_cast<const char*>(name), entries[i].name_size);
  }
  for (uint32_t i = 0; i < num_tensors; ++i) {
    if (entries[i].data_size == 0 && !(g.tensors[i].alias_of == kNoTensor &&
                                      (g.tensors[i].storage == blob::Storage::kWeight ||
                                       g.tensors[i].storage == blob::Storage::kState))) {
      continue;
    }
    const uint8_t* bytes = c.take(entries[i].data_size, "data section");
    g.tensors[i].data.assign(bytes, bytes + entries[i].data_size);
    g.tensors[i].has_data = true;
  }
  if (c.pos() != size) {
    fail(KILN_BUILDER_INVALID_IR, "IR has %zu bytes after the data section", size - c.pos());
  }
  return g;
}

}  // namespace kiln::builder
