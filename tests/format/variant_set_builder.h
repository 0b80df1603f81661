// Builds variant sets (format/variant_set.h) in tests, laid out as the AOT writer lays
// them out, from BlobBuilder blobs; plus a small shape-specialisable graph to fill them with.
#pragma once

#include <cstdint>
#include <cstring>
#include <vector>

#include "format/blob_format.h"
#include "format/variant_set.h"
#include "tests/format/blob_builder.h"

namespace kiln::engine::testing {

using Bytes = std::vector<uint8_t>;

/// y = relu(x @ W + bias) with x [batch, 4], W [4, 3], bias [3], y [batch, 3] (fp32).
inline BlobBuilder linear_relu(int64_t batch) {
  static const float w[12] = {0.1f, -0.2f, 0.3f, 0.4f, -0.5f, 0.6f,
                              0.7f, 0.8f,  -0.9f, 1.0f, 1.1f, -1.2f};
  static const float bias[3] = {0.1f, -0.2f, 0.3f};
  BlobBuilder b;
  const int64_t x = b.input(blob::DType::kFloat32, {batch, 4});
  const int64_t wt = b.weight(blob::DType::kFloat32, {4, 3}, w);
  const int64_t bt = b.weight(blob::DType::kFloat32, {3}, bias);
  const int64_t y = b.output(blob::DType::kFloat32, {batch, 3});
  BlobBuilder::Matmul mm;
  mm.a = x, mm.b = wt, mm.bias = bt, mm.out = y, mm.m = batch, mm.n = 3, mm.k = 4;
  mm.epilogue = blob::Epilogue::kRelu;
  b.matmul(mm);
  return b;
}

/// What linear_relu computes, for checking results.
inline std::vector<float> linear_relu_reference(const std::vector<float>& x, int64_t batch) {
  BlobBuilder b = linear_relu(batch);
  const float* w = reinterpret_cast<const float*>(b.weights.data());
  const float* bias = reinterpret_cast<const float*>(b.weights.data() + 64);
  std::vector<float> y(batch * 3);
  for (int64_t r = 0; r < batch; ++r) {
    for (int c = 0; c < 3; ++c) {
      double acc = bias[c];
      for (int k = 0; k < 4; ++k) acc += double(x[r * 4 + k]) * w[k * 3 + c];
      y[r * 3 + c] = acc > 0 ? static_cast<float>(acc) : 0.0f;
    }
  }
  return y;
}

/// The blob with its weights section cut off and the external-weights flag set, as the writer
/// stores variants that share one weights section.
inline Bytes without_weights(const Bytes& blob) {
  blob::Header h;
  std::memcpy(&h, blob.data(), sizeof(h));
  Bytes out(blob.begin(), blob.begin() + static_cast<std::ptrdiff_t>(h.weights_offset));
  h.blob_size = h.weights_offset;
  h.weights_size = 0;
  h.flags |= blob::kFlagExternalWeights;
  std::memcpy(out.data(), &h, sizeof(h));
  return out;
}

struct VariantSpec {
  Bytes blob;
  std::vector<std::vector<int64_t>> inputs;  // the input shapes it serves
};

inline uint64_t align_up(uint64_t n, uint64_t a) { return (n + a - 1) / a * a; }

/// Header, variant records, input shapes, blobs (8-aligned), then `weights` (64-aligned) if any.
inline Bytes build_variant_set(const std::vector<VariantSpec>& variants, const Bytes& weights) {
  const uint32_t n = static_cast<uint32_t>(variants.size());
  const uint32_t k = n ? static_cast<uint32_t>(variants[0].inputs.size()) : 0;
  vset::VariantSetHeader h{};
  std::memcpy(h.magic, vset::kMagic, sizeof(h.magic));
  h.format_version = vset::kFormatVersion;
  h.header_size = vset::kHeaderSize;
  h.num_variants = n;
  h.num_inputs = k;
  h.variants_offset = vset::kHeaderSize;
  h.shapes_offset = align_up(h.variants_offset + n * sizeof(vset::VariantRecord), 8);
  uint64_t cursor = h.shapes_offset + uint64_t{n} * k * sizeof(vset::InputShape);
  std::vector<vset::VariantRecord> records(n);
  for (uint32_t v = 0; v < n; ++v) {
    cursor = align_up(cursor, vset::kBlobAlignment);
    records[v] = {cursor, variants[v].blob.size()};
    cursor += variants[v].blob.size();
  }
  if (!weights.empty()) {
    h.weights_offset = align_up(cursor, blob::kWeightAlignment);
    h.weights_size = weights.size();
    cursor = h.weights_offset + weights.size();
  }
  h.container_size = cursor;
  Bytes out(cursor, 0);
  std::memcpy(out.data(), &h, sizeof(h));
  for (uint32_t v = 0; v < n; ++v) {
    std::memcpy(out.data() + h.variants_offset + v * sizeof(vset::VariantRecord), &records[v],
                sizeof(records[v]));
    std::memcpy(out.data() + records[v].blob_offset, variants[v].blob.data(),
                variants[v].blob.size());
    for (uint32_t i = 0; i < k; ++i) {
      vset::InputShape s{};
      s.rank = static_cast<uint32_t>(variants[v].inputs[i].size());
      for (uint32_t d = 0; d < s.rank && d < blob::kMaxRank; ++d) {
        s.sizes[d] = variants[v].inputs[i][d];
      }
      std::memcpy(out.data() + h.shapes_offset + (uint64_t{v} * k + i) * sizeof(s), &s,
                  sizeof(s));
    }
  }
  if (!weights.empty()) {
    std::memcpy(out.data() + h.weights_offset, weights.data(), weights.size());
  }
  return out;
}

/// linear_relu at each batch size, sharing one weights section.
inline Bytes linear_relu_set(const std::vector<int64_t>& batches) {
  std::vector<VariantSpec> specs;
  Bytes weights;
  for (int64_t batch : batches) {
    BlobBuilder b = linear_relu(batch);
    specs.push_back({without_weights(b.build()), {{batch, 4}}});
    weights = b.weights;
  }
  return build_variant_set(specs, weights);
}

}  // namespace kiln::engine::testing
