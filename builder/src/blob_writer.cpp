#include "builder/src/blob_writer.h"

#include <functional>
#include <cstring>
#include <map>
#include <string>
#include <string_view>
#include <tuple>

#include "kiln/builder.h"
#include "format/variant_set.h"

namespace kiln::builder {
namespace {

namespace vset = kiln::engine::vset;

uint64_t align_up(uint64_t n, uint64_t a) { return (n + a - 1) / a * a; }

template <typename T>
void put(std::vector<uint8_t>& out, uint64_t offset, const T& value) {
  std::memcpy(out.data() + offset, &value, sizeof(T));
}

constexpr uint64_t kSectionAlignment = 8;

}  // namespace

std::vector<uint8_t> write_blob(const Graph& g) {
  // Weight and state bytes are copied once, straight into the blob: a billion-parameter model's
  // weights are gigabytes, and every staging copy is another few on the exporting machine.
  uint64_t weights_size = 0;
  std::vector<uint64_t> weight_offset(g.tensors.size(), 0);
  std::vector<const Tensor*> placed;  // tensors whose bytes the blob stores, in offset order
  // Identical weights share bytes (found by dtype, size and a hash, confirmed by comparing the
  // bytes); a state's initial value is its identity, so never shared.
  std::map<std::tuple<uint32_t, size_t, size_t>, std::vector<const Tensor*>> by_content;
  auto place = [&](const Tensor& t) {
    uint64_t offset = align_up(weights_size, blob::kWeightAlignment);
    weights_size = offset + t.data.size();
    placed.push_back(&t);
    return offset;
  };
  for (const Tensor& t : g.tensors) {
    if (t.alias_of != kNoTensor) continue;
    if (t.storage == blob::Storage::kWeight) {
      const std::string_view bytes(reinterpret_cast<const char*>(t.data.data()), t.data.size());
      auto& same_key = by_content[{uint32_t(t.dtype), t.data.size(),
                                   std::hash<std::string_view>{}(bytes)}];
      const Tensor* twin = nullptr;
      for (const Tensor* other : same_key) {
        if (other->data == t.data) twin = other;
      }
      if (twin != nullptr) {
        weight_offset[size_t(t.id)] = weight_offset[size_t(twin->id)];
      } else {
        weight_offset[size_t(t.id)] = place(t);
        same_key.push_back(&t);
      }
    } else if (t.storage == blob::Storage::kState) {
      weight_offset[size_t(t.id)] = place(t);
    }
  }

  std::vector<blob::TensorRecord> records;
  for (const Tensor& t : g.tensors) {
    if (t.shape.size() > blob::kMaxRank) {
      fail(KILN_BUILDER_BUILD_FAILED, "tensor %lld (%s) has rank %zu > %u", (long long)t.id,
           t.name.c_str(), t.shape.size(), blob::kMaxRank);
    }
    const Tensor& root = g.tensors[size_t(g.root(t.id))];
    blob::TensorRecord r{};
    r.dtype = uint32_t(t.dtype);
    r.rank = uint32_t(t.shape.size());
    for (size_t d = 0; d < t.shape.size(); ++d) r.sizes[d] = t.shape[d];
    r.storage = uint32_t(root.storage);
    bool stored = root.storage == blob::Storage::kWeight || root.storage == blob::Storage::kState;
    if (stored && !root.has_data) {
      fail(KILN_BUILDER_BUILD_FAILED, "tensor %lld (%s): weight or state without data",
           (long long)root.id, root.name.c_str());
    }
    if (stored && g.view_offset(t.id) != 0) {
      fail(KILN_BUILDER_INTERNAL, "tensor %lld (%s): a view inside a weight or state",
           (long long)t.id, t.name.c_str());
    }
    r.offset = stored ? weight_offset[size_t(root.id)] : root.offset + g.view_offset(t.id);
    r.nbytes = t.nbytes();
    records.push_back(r);
  }

  std::vector<blob::OpRecord> ops;
  std::vector<int64_t> operands;
  for (size_t i = 0; i < g.ops.size(); ++i) {
    std::vector<int64_t> slots = encode_op(g.ops[i], i);
    blob::OpRecord r{};
    r.opcode = uint32_t(g.ops[i].opcode);
    r.num_operands = uint32_t(slots.size());
    r.first_operand = operands.size();
    ops.push_back(r);
    operands.insert(operands.end(), slots.begin(), slots.end());
  }
  std::vector<uint32_t> io;
  for (int64_t t : g.inputs) io.push_back(uint32_t(t));
  for (int64_t t : g.outputs) io.push_back(uint32_t(t));

  blob::Header h{};
  std::memcpy(h.magic, blob::kMagic, sizeof(h.magic));
  h.format_version = blob::kFormatVersion;
  h.header_size = blob::kHeaderSize;
  h.num_tensors = uint32_t(records.size());
  h.num_ops = uint32_t(ops.size());
  h.num_inputs = uint32_t(g.inputs.size());
  h.num_outputs = uint32_t(g.outputs.size());
  h.tensors_offset = blob::kHeaderSize;
  h.ops_offset = align_up(h.tensors_offset + records.size() * sizeof(blob::TensorRecord),
                          kSectionAlignment);
  h.operands_offset = align_up(h.ops_offset + ops.size() * sizeof(blob::OpRecord), kSectionAlignment);
  h.num_operands = operands.size();
  h.io_offset = align_up(h.operands_offset + operands.size() * 8, kSectionAlignment);
  h.weights_offset = align_up(h.io_offset + io.size() * 4, blob::kWeightAlignment);
  h.weights_size = weights_size;
  h.arena_size = g.arena_size;
  h.precision = uint32_t(g.precision);
  h.flags = 0;
  h.blob_size = h.weights_offset + weights_size;

  std::vector<uint8_t> out(h.blob_size, 0);
  put(out, 0, h);
  if (!records.empty()) {
    std::memcpy(out.data() + h.tensors_offset, records.data(), records.size() * sizeof(records[0]));
  }
  if (!ops.empty()) std::memcpy(out.data() + h.ops_offset, ops.data(), ops.size() * sizeof(ops[0]));
  if (!operands.empty()) {
    std::memcpy(out.data() + h.operands_offset, operands.data(), operands.size() * 8);
  }
  if (!io.empty()) std::memcpy(out.data() + h.io_offset, io.data(), io.size() * 4);
  for (const Tensor* t : placed) {
    if (!t->data.empty()) {
      std::memcpy(out.data() + h.weights_offset + weight_offset[size_t(t->id)], t->data.data(),
                  t->data.size());
    }
  }
  return out;
}

std::vector<uint8_t> write_variant_set(const std::vector<VariantBlob>& variants) {
  if (variants.empty() || variants.size() > vset::kMaxVariants) {
    fail(KILN_BUILDER_BUILD_FAILED, "a variant set holds 1..%u variants, not %zu",
         vset::kMaxVariants, variants.size());
  }
  size_t num_inputs = variants[0].input_shapes.size();
  std::vector<blob::Header> headers;
  for (size_t v = 0; v < variants.size(); ++v) {
    if (variants[v].input_shapes.size() != num_inputs) {
      fail(KILN_BUILDER_BUILD_FAILED, "variant %zu has %zu delegate inputs, variant 0 has %zu", v,
           variants[v].input_shapes.size(), num_inputs);
    }
    blob::Header h;
    std::memcpy(&h, variants[v].blob.data(), sizeof(h));
    headers.push_back(h);
  }
  auto weights_of = [&](size_t v) {
    const auto& b = variants[v].blob;
    return std::vector<uint8_t>(b.begin() + std::ptrdiff_t(headers[v].weights_offset),
                                b.begin() + std::ptrdiff_t(headers[v].weights_offset +
                                                           headers[v].weights_size));
  };
  std::vector<uint8_t> shared = weights_of(0);
  for (size_t v = 1; v < variants.size() && !shared.empty(); ++v) {
    if (weights_of(v) != shared) shared.clear();
  }
  std::vector<std::vector<uint8_t>> blobs;
  for (size_t v = 0; v < variants.size(); ++v) {
    if (shared.empty()) {
      blobs.push_back(variants[v].blob);
      continue;
    }
    // The blob without its weights section, flagged as reading the set's shared one.
    blob::Header h = headers[v];
    h.blob_size = h.weights_offset;
    h.weights_size = 0;
    h.flags |= blob::kFlagExternalWeights;
    std::vector<uint8_t> b(variants[v].blob.begin(),
                           variants[v].blob.begin() + std::ptrdiff_t(h.weights_offset));
    put(b, 0, h);
    blobs.push_back(std::move(b));
  }

  uint64_t variants_offset = vset::kHeaderSize;
  uint64_t shapes_offset = align_up(variants_offset + blobs.size() * sizeof(vset::VariantRecord),
                                    kSectionAlignment);
  uint64_t cursor = shapes_offset + blobs.size() * num_inputs * sizeof(vset::InputShape);
  std::vector<uint64_t> blob_offsets;
  for (const auto& b : blobs) {
    cursor = align_up(cursor, vset::kBlobAlignment);
    blob_offsets.push_back(cursor);
    cursor += b.size();
  }
  uint64_t weights_offset = shared.empty() ? 0 : align_up(cursor, blob::kWeightAlignment);
  uint64_t size = shared.empty() ? cursor : weights_offset + shared.size();

  std::vector<uint8_t> out(size, 0);
  vset::VariantSetHeader h{};
  std::memcpy(h.magic, vset::kMagic, sizeof(h.magic));
  h.format_version = vset::kFormatVersion;
  h.header_size = vset::kHeaderSize;
  h.container_size = size;
  h.num_variants = uint32_t(blobs.size());
  h.num_inputs = uint32_t(num_inputs);
  h.variants_offset = variants_offset;
  h.shapes_offset = shapes_offset;
  h.weights_offset = weights_offset;
  h.weights_size = shared.size();
  put(out, 0, h);
  for (size_t v = 0; v < blobs.size(); ++v) {
    put(out, variants_offset + v * sizeof(vset::VariantRecord),
        vset::VariantRecord{blob_offsets[v], blobs[v].size()});
    std::memcpy(out.data() + blob_offsets[v], blobs[v].data(), blobs[v].size());
    for (size_t i = 0; i < num_inputs; ++i) {
      const auto& shape = variants[v].input_shapes[i];
      if (shape.size() > blob::kMaxRank) {
        fail(KILN_BUILDER_BUILD_FAILED, "variant %zu input %zu has rank %zu", v, i, shape.size());
      }
      vset::InputShape s{};
      s.rank = uint32_t(shape.size());
      for (size_t d = 0; d < shape.size(); ++d) s.sizes[d] = shape[d];
      put(out, shapes_offset + (v * num_inputs + i) * sizeof(vset::InputShape), s);
    }
  }
  if (!shared.empty()) std::memcpy(out.data() + weights_offset, shared.data(), shared.size());
  return out;
}

}  // namespace kiln::builder
