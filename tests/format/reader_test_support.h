// What the blob reader's tests share (tests/format/*_test.cpp): a checker for the reader's error
// code and message, a byte patcher, and the kitchen-sink blob that holds one valid op of every
// opcode. Header-only and test-only.
#pragma once

#include <executorch/runtime/platform/platform.h>
#include <executorch/runtime/platform/runtime.h>
#include <gtest/gtest.h>

#include <cstddef>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "format/blob_reader.h"
#include "tests/format/blob_builder.h"
#include "tests/format/log_capture.h"

namespace kiln::engine::reader_test {

// Captures what the engine logs, to prove the message reaches the ExecuTorch log too (registered
// once per test binary: inline variables are initialised once).
inline std::string& g_log = testing::captured_log();
inline const auto* const kLog =
    ::testing::AddGlobalTestEnvironment(new testing::LogCaptureEnvironment);

using executorch::runtime::Error;
using testing::BlobBuilder;
using Bytes = std::vector<uint8_t>;
using blob::DType;

template <typename T>
inline void patch(Bytes& b, size_t offset, T value) {
  std::memcpy(b.data() + offset, &value, sizeof(value));
}

#define HEADER_FIELD(name) offsetof(blob::Header, name)

inline ::testing::AssertionResult fails_with(const Bytes& bytes, Error code,
                                             const std::string& needle,
                                             size_t size = std::numeric_limits<size_t>::max()) {
  std::string why;
  const size_t n = size == std::numeric_limits<size_t>::max() ? bytes.size() : size;
  auto result = read_blob(bytes.data(), n, &why);
  if (result.ok()) {
    return ::testing::AssertionFailure()
           << "accepted; expected error containing '" << needle << "'";
  }
  if (result.error() != code) {
    return ::testing::AssertionFailure()
           << "error " << executorch::runtime::to_string(result.error()) << ", expected "
           << executorch::runtime::to_string(code) << ": " << why;
  }
  if (why.find(needle) == std::string::npos) {
    return ::testing::AssertionFailure() << "message lacks '" << needle << "': " << why;
  }
  return ::testing::AssertionSuccess() << why;
}

// Tensor ids of the kitchen-sink blob, for tests that corrupt a specific one.
struct Sink {
  int64_t x, idx, cond, img, w, bias, emb, ln_w, conv_w, conv_b;
  int64_t t0, t1, t2, t3, t4, t5, t7, t8, t9, t10, y0, y1;
};

// One valid op of every opcode, wired into a small graph.
inline BlobBuilder kitchen_sink(Sink* ids = nullptr) {
  BlobBuilder b;
  Sink s{};
  const std::vector<float> w(3 * 4, 0.5f), bias(4, 0.25f), emb(10 * 4, 1.0f), ln_w(4, 1.0f),
      conv_w(3 * 2 * 3 * 3, 0.1f), conv_b(3, 0.0f);
  s.x = b.input(DType::kFloat32, {2, 3});
  s.idx = b.input(DType::kInt64, {4});
  s.cond = b.input(DType::kBool, {2, 4});
  s.img = b.input(DType::kFloat32, {1, 2, 5, 5});
  s.w = b.weight(DType::kFloat32, {3, 4}, w.data());
  s.bias = b.weight(DType::kFloat32, {4}, bias.data());
  s.emb = b.weight(DType::kFloat32, {10, 4}, emb.data());
  s.ln_w = b.weight(DType::kFloat32, {4}, ln_w.data());
  s.conv_w = b.weight(DType::kFloat32, {3, 2, 3, 3}, conv_w.data());
  s.conv_b = b.weight(DType::kFloat32, {3}, conv_b.data());
  s.t0 = b.arena(DType::kFloat32, {2, 4});
  s.t1 = b.arena(DType::kFloat32, {2, 4});
  s.t2 = b.arena(DType::kFloat32, {2, 4});
  s.t3 = b.arena(DType::kFloat32, {2, 4});
  s.t4 = b.arena(DType::kFloat32, {2, 4});
  s.t5 = b.arena(DType::kFloat32, {2, 4});
  s.t7 = b.arena(DType::kFloat32, {4, 4});
  s.t8 = b.arena(DType::kFloat32, {2, 4});
  s.t9 = b.arena(DType::kFloat32, {1, 3, 5, 5});
  s.t10 = b.arena(DType::kFloat32, {1, 3, 2, 2});
  s.y0 = b.output(DType::kFloat32, {2});
  s.y1 = b.output(DType::kFloat32, {4, 2});

  BlobBuilder::Matmul mm;
  mm.a = s.x, mm.b = s.w, mm.bias = s.bias, mm.out = s.t0, mm.m = 2, mm.n = 4, mm.k = 3;
  b.matmul(mm);                                                                            // op 0
  b.binary(blob::BinaryKind::kAdd, s.t0, s.bias, s.t1, 1.0, 0.0, {2, 4}, {4, 1}, {0, 1});  // 1
  b.unary(blob::UnaryKind::kRelu, s.t1, s.t2);                                             // op 2
  b.where(s.cond, s.t2, s.t1, s.t3, {2, 4}, {4, 1}, {4, 1}, {4, 1});                       // op 3
  b.softmax(s.t3, s.t4, 2, 4, 1, false);                                                   // op 4
  b.layer_norm(s.t4, s.ln_w, -1, s.t5, 2, 4, 1e-5);                                        // op 5
  b.reduce(blob::ReduceKind::kSum, s.t5, s.y0, 2, 4, 1);                                   // op 6
  b.embedding(s.emb, s.idx, s.t7, 4, 4, 10);                                               // op 7
  b.fill(s.t8, 1.5);                                                                       // op 8
  BlobBuilder::Conv2d c;
  c.x = s.img, c.weight = s.conv_w, c.bias = s.conv_b, c.out = s.t9;
  c.n = 1, c.c_in = 2, c.h = 5, c.w = 5, c.c_out = 3, c.kh = 3, c.kw = 3, c.pad_h = 1, c.pad_w = 1;
  b.conv2d(c);  // op 9
  BlobBuilder::Pool2d p;
  p.x = s.t9, p.out = s.t10, p.n = 1, p.c = 3, p.h = 5, p.w = 5, p.kh = 2, p.kw = 2;
  p.stride_h = 2, p.stride_w = 2;
  b.pool2d(p);                                       // op 10
  b.copy(s.t0, s.y1, {4, 2}, 0, {1, 4}, 0, {2, 1});  // op 11
  if (ids != nullptr) *ids = s;
  return b;
}

// Index into the operand pool of operand `i` of op `op`.
inline size_t operand_at(const BlobBuilder& b, size_t op, size_t i) {
  return static_cast<size_t>(b.ops[op].first_operand) + i;
}

}  // namespace kiln::engine::reader_test
