// Serialises a builder Graph into the KILNIR interchange format (kiln/builder.h), the way the
// Python binding does, so the tests can feed the C API; plus small graph-building helpers.
#pragma once

#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "builder/src/blob_writer.h"
#include "builder/src/ir.h"
#include "builder/src/passes.h"
#include "format/blob_reader.h"
#include "kiln/builder.h"

namespace kiln::builder::testing {

template <typename T>
void append(std::vector<uint8_t>& out, const T& v) {
  const auto* p = reinterpret_cast<const uint8_t*>(&v);
  out.insert(out.end(), p, p + sizeof(T));
}

inline std::vector<uint8_t> serialize(const Graph& g) {
  std::vector<uint8_t> body;
  std::vector<int64_t> pool;
  std::vector<uint8_t> names, data;
  for (const Tensor& t : g.tensors) {
    append(body, uint32_t(t.dtype));
    append(body, uint32_t(t.shape.size()));
    for (uint32_t d = 0; d < blob::kMaxRank; ++d) append(body, d < t.shape.size() ? t.shape[d] : int64_t(0));
    append(body, uint32_t(t.storage));
    append(body, int32_t(t.alias_of));
    append(body, uint64_t(t.offset));
    append(body, uint64_t(t.has_data ? t.data.size() : 0));
    append(body, uint32_t(t.name.size()));
    append(body, uint32_t(0));
    names.insert(names.end(), t.name.begin(), t.name.end());
    if (t.has_data) data.insert(data.end(), t.data.begin(), t.data.end());
  }
  for (size_t i = 0; i < g.ops.size(); ++i) {
    std::vector<int64_t> slots = encode_op(g.ops[i], i);
    append(body, uint32_t(g.ops[i].opcode));
    append(body, uint32_t(slots.size()));
    pool.insert(pool.end(), slots.begin(), slots.end());
  }
  for (int64_t v : pool) append(body, v);
  for (int64_t t : g.inputs) append(body, uint32_t(t));
  for (int64_t t : g.outputs) append(body, uint32_t(t));
  body.insert(body.end(), names.begin(), names.end());
  body.insert(body.end(), data.begin(), data.end());

  std::vector<uint8_t> out(KILN_IR_MAGIC, KILN_IR_MAGIC + 8);
  append(out, uint32_t(KILN_IR_VERSION));
  append(out, uint32_t(KILN_IR_HEADER_SIZE));
  append(out, uint32_t(g.precision));
  append(out, uint32_t(g.tensors.size()));
  append(out, uint32_t(g.ops.size()));
  append(out, uint32_t(g.inputs.size()));
  append(out, uint32_t(g.outputs.size()));
  append(out, uint32_t(0));
  append(out, uint64_t(pool.size()));
  append(out, uint64_t(g.arena_size));
  append(out, uint64_t(KILN_IR_HEADER_SIZE + body.size()));
  out.insert(out.end(), body.begin(), body.end());
  return out;
}

// Small graph-building helpers.
inline int64_t input(Graph& g, std::vector<int64_t> shape, uint64_t index,
                     blob::DType dtype = blob::DType::kFloat32) {
  int64_t t = g.add_tensor(dtype, shape, "in" + std::to_string(index));
  g.tensors[size_t(t)].storage = blob::Storage::kInput;
  g.tensors[size_t(t)].offset = index;
  g.inputs.push_back(t);
  return t;
}

inline int64_t weight(Graph& g, const std::vector<float>& values, std::vector<int64_t> shape) {
  int64_t t = g.add_tensor(blob::DType::kFloat32, shape, "w");
  Tensor& w = g.tensors[size_t(t)];
  w.storage = blob::Storage::kWeight;
  w.has_data = true;
  const auto* bytes = reinterpret_cast<const uint8_t*>(values.data());
  w.data.assign(bytes, bytes + values.size() * sizeof(float));
  return t;
}

inline Op unary(blob::UnaryKind kind, int64_t x, int64_t out) {
  return make_op(blob::Opcode::kUnary, {{int64_t(kind)}, {x}, {out}, {0}, {0}});
}

inline Op binary(blob::BinaryKind kind, int64_t a, int64_t b, int64_t out, int64_t n) {
  return make_op(blob::Opcode::kBinary, {{int64_t(kind)}, {a}, {b}, {out}, {double_bits(1.0)},
                                         {double_bits(0.0)}, {1}, {n}, {1}, {1}});
}

// The passes after fusion, then the blob written and read back by the runtime's reader.
inline void finish_and_read_back(Graph& g) {
  bind_outputs(g);
  compact(g);
  plan_memory(g);
  std::vector<uint8_t> bytes = write_blob(g);
  std::string why;
  EXPECT_TRUE(kiln::engine::read_blob(bytes.data(), bytes.size(), &why).ok()) << why;
}

}  // namespace kiln::builder::testing
