#include "builder/src/ir.h"

#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <map>

#include "kiln/builder.h"

namespace kiln::builder {

void fail(int code, const char* format, ...) {
  char buffer[512];
  va_list args;
  va_start(args, format);
  std::vsnprintf(buffer, sizeof(buffer), format, args);
  va_end(args);
  throw BuildError(code, buffer);
}

int64_t Tensor::numel() const {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  return n;
}

uint64_t Tensor::nbytes() const { return uint64_t(numel()) * element_size(dtype); }

int64_t double_bits(double value) {
  int64_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  return bits;
}

double bits_double(int64_t bits) {
  double value;
  std::memcpy(&value, &bits, sizeof(value));
  return value;
}

namespace {

char field_kind(blob::FieldKind kind) {
  switch (kind) {
    case blob::FieldKind::kTensor: return 't';
    case blob::FieldKind::kInt:
    case blob::FieldKind::kEnum: return 'n';
    case blob::FieldKind::kReal: return 'f';
    case blob::FieldKind::kList: return 'l';
    case blob::FieldKind::kTensorList: return 'T';
  }
  return '?';
}

// Every opcode's operand layout, from the op table (format/op_table.h), by opcode.
const std::map<uint32_t, std::vector<FieldSpec>>& layouts() {
  static const std::map<uint32_t, std::vector<FieldSpec>> table = [] {
    std::map<uint32_t, std::vector<FieldSpec>> t;
    for (const blob::OpDesc& op : blob::kOps) {
      std::vector<FieldSpec>& specs = t[uint32_t(op.opcode)];
      for (size_t i = 0; i < op.num_fields; ++i) {
        specs.push_back({field_kind(op.fields[i].kind), op.fields[i].name, op.fields[i].count});
      }
    }
    return t;
  }();
  return table;
}

// "kCopy", as the builder's messages name an opcode.
const char* opcode_name(uint32_t opcode) {
  const blob::OpDesc* op = blob::find_op(opcode);
  return op != nullptr ? op->enum_name : "?";
}

size_t field_index(const std::vector<FieldSpec>& specs, const char* name) {
  for (size_t i = 0; i < specs.size(); ++i) {
    if (std::strcmp(specs[i].name, name) == 0) return i;
  }
  fail(KILN_BUILDER_INTERNAL, "operand layout has no field %s", name);
}

// The element count of a list field from the scalar fields decoded before it; -1 when a factor
// is negative or the product overflows.
int64_t list_count(const std::vector<FieldSpec>& specs, const std::vector<std::vector<int64_t>>& fields,
                   const char* count) {
  int64_t n = 1;
  std::string text(count);
  size_t start = 0;
  while (start <= text.size()) {
    size_t star = text.find('*', start);
    std::string factor = text.substr(start, star == std::string::npos ? std::string::npos : star - start);
    int64_t v;
    if (!factor.empty() && factor[0] >= '0' && factor[0] <= '9') {
      v = std::stoll(factor);
    } else {
      size_t i = field_index(specs, factor.c_str());
      if (i >= fields.size() || fields[i].size() != 1) return -1;
      v = fields[i][0];
    }
    if (v < 0 || __builtin_mul_overflow(n, v, &n)) return -1;
    if (star == std::string::npos) break;
    start = star + 1;
  }
  return n;
}

}  // namespace

const std::vector<FieldSpec>* layout(uint32_t opcode) {
  auto it = layouts().find(opcode);
  return it == layouts().end() ? nullptr : &it->second;
}

int64_t& Op::at(const char* name) {
  return fields[field_index(*layout(uint32_t(opcode)), name)][0];
}

int64_t Op::at(const char* name) const {
  return fields[field_index(*layout(uint32_t(opcode)), name)][0];
}

std::vector<int64_t>& Op::list(const char* name) {
  return fields[field_index(*layout(uint32_t(opcode)), name)];
}

const std::vector<int64_t>& Op::list(const char* name) const {
  return fields[field_index(*layout(uint32_t(opcode)), name)];
}

double Op::real(const char* name) const { return bits_double(at(name)); }

std::vector<int64_t> Op::reads() const {
  const auto& specs = *layout(uint32_t(opcode));
  std::vector<int64_t> out;
  for (size_t i = 0; i < specs.size(); ++i) {
    if (specs[i].kind == 't' && std::strcmp(specs[i].name, "out") != 0 && fields[i][0] >= 0) {
      out.push_back(fields[i][0]);
    }
  }
  for (size_t i = 0; i < specs.size(); ++i) {
    if (specs[i].kind == 'T') out.insert(out.end(), fields[i].begin(), fields[i].end());
  }
  return out;
}

void Op::rename(int64_t from, int64_t to) {
  for_each_tensor([&](int64_t& id) {
    if (id == from) id = to;
  });
}

Op decode_op(size_t index, uint32_t opcode, const int64_t* slots, uint64_t count) {
  const auto* specs = layout(opcode);
  if (specs == nullptr) fail(KILN_BUILDER_INVALID_IR, "op %zu: unknown opcode %u", index, opcode);
  Op op;
  op.opcode = static_cast<blob::Opcode>(opcode);
  uint64_t pos = 0;
  for (const FieldSpec& f : *specs) {
    if (f.kind == 'l' || f.kind == 'T') {
      int64_t n = list_count(*specs, op.fields, f.count);
      if (n < 0 || uint64_t(n) > count - pos) {
        fail(KILN_BUILDER_INVALID_IR,
             "op %zu (%s): field %s needs %lld operands (%s), %llu are left of its %llu", index,
             opcode_name(opcode), f.name, (long long)n, f.count, (unsigned long long)(count - pos),
             (unsigned long long)count);
      }
      op.fields.emplace_back(slots + pos, slots + pos + n);
      pos += uint64_t(n);
    } else {
      if (pos >= count) {
        fail(KILN_BUILDER_INVALID_IR, "op %zu (%s): %llu operands, the layout needs more (at %s)",
             index, opcode_name(opcode), (unsigned long long)count, f.name);
      }
      op.fields.push_back({slots[pos++]});
    }
  }
  if (pos != count) {
    fail(KILN_BUILDER_INVALID_IR, "op %zu (%s): %llu operands, its layout uses %llu", index,
         opcode_name(opcode), (unsigned long long)count, (unsigned long long)pos);
  }
  return op;
}

std::vector<int64_t> encode_op(const Op& op, size_t index) {
  const auto& specs = *layout(uint32_t(op.opcode));
  std::vector<int64_t> out;
  for (size_t i = 0; i < specs.size(); ++i) {
    if (specs[i].kind == 'l' || specs[i].kind == 'T') {
      int64_t n = list_count(specs, op.fields, specs[i].count);
      if (n < 0 || uint64_t(n) != op.fields[i].size()) {
        fail(KILN_BUILDER_BUILD_FAILED, "op %zu (%s): %s has %zu entries, %s is %lld", index,
             opcode_name(uint32_t(op.opcode)), specs[i].name, op.fields[i].size(), specs[i].count,
             (long long)n);
      }
    }
    out.insert(out.end(), op.fields[i].begin(), op.fields[i].end());
  }
  return out;
}

Op make_op(blob::Opcode opcode, std::vector<std::vector<int64_t>> fields) {
  Op op;
  op.opcode = opcode;
  op.fields = std::move(fields);
  return op;
}

int64_t Graph::root(int64_t id) const {
  // Chains are validated acyclic when the IR is read; the bound guards against a pass bug.
  for (size_t steps = 0; tensors[size_t(id)].alias_of != kNoTensor; ++steps) {
    if (steps > tensors.size()) fail(KILN_BUILDER_INTERNAL, "tensor %lld: alias cycle", (long long)id);
    id = tensors[size_t(id)].alias_of;
  }
  return id;
}

uint64_t Graph::view_offset(int64_t id) const {
  uint64_t bytes = 0;
  for (size_t steps = 0; tensors[size_t(id)].alias_of != kNoTensor; ++steps) {
    if (steps > tensors.size()) fail(KILN_BUILDER_INTERNAL, "tensor %lld: alias cycle", (long long)id);
    bytes += tensors[size_t(id)].view_bytes;
    id = tensors[size_t(id)].alias_of;
  }
  return bytes;
}

int64_t Graph::add_tensor(blob::DType dtype, const std::vector<int64_t>& shape,
                          const std::string& name) {
  Tensor t;
  t.id = int64_t(tensors.size());
  t.dtype = dtype;
  t.shape = shape;
  t.name = name;
  tensors.push_back(std::move(t));
  return tensors.back().id;
}

}  // namespace kiln::builder
