#include "format/variant_set_reader.h"

#include <cstdio>
#include <cstring>
#include <string>
#include <utility>

#include "format/fail.h"

namespace kiln::engine {
namespace {

using executorch::runtime::Error;
using executorch::runtime::Result;
using ull = unsigned long long;

// [offset, offset + length) inside [0, limit), without overflow.
bool inside(uint64_t offset, uint64_t length, uint64_t limit) {
  return offset <= limit && length <= limit - offset;
}

bool same_shape(const Shape& a, const Shape& b) {
  if (a.rank != b.rank) return false;
  for (uint32_t d = 0; d < a.rank; ++d) {
    if (a.sizes[d] != b.sizes[d]) return false;
  }
  return true;
}

std::string shape_text(const Shape& s) {
  std::string out = "[";
  for (uint32_t d = 0; d < s.rank; ++d) out += (d ? "," : "") + std::to_string(s.sizes[d]);
  return out + "]";
}

Shape tensor_shape(const Tensor& t) {
  Shape s;
  s.rank = t.rank;
  std::memcpy(s.sizes, t.sizes, sizeof(s.sizes));
  return s;
}

class VariantSetReader {
 public:
  VariantSetReader(const uint8_t* data, size_t size, std::string* why)
      : data_(data), size_(size), why_(why) {}

  Result<VariantSet> read() {
    Error err = check_header();
    if (err == Error::Ok) err = check_tables();
    for (uint32_t v = 0; err == Error::Ok && v < h_.num_variants; ++v) err = read_variant(v);
    if (err != Error::Ok) return err;
    return std::move(set_);
  }

 private:
  Error check_header() {
    if (data_ == nullptr || size_ < sizeof(vset::kMagic) ||
        std::memcmp(data_, vset::kMagic, sizeof(vset::kMagic)) != 0) {
      return fail(why_, Error::InvalidProgram,
                  "not a Kiln variant set: the %zu-byte buffer does not start with 'KILNVSET'",
                  data_ == nullptr ? size_t{0} : size_);
    }
    if (size_ < sizeof(vset::VariantSetHeader)) {
      return fail(why_, Error::InvalidProgram,
                  "Kiln variant set: truncated: %zu bytes is smaller than the %u-byte header",
                  size_, vset::kHeaderSize);
    }
    std::memcpy(&h_, data_, sizeof(h_));
    if (h_.format_version != vset::kFormatVersion) {
      return fail(why_, Error::DelegateInvalidCompatibility,
                  "Kiln variant set: format_version is %u, but this Kiln reads version %u; "
                  "re-export the model with the installed Kiln",
                  h_.format_version, vset::kFormatVersion);
    }
    if (h_.header_size != vset::kHeaderSize) {
      return fail(why_, Error::InvalidProgram,
                  "Kiln variant set: header_size is %u, version %u has a %u-byte header",
                  h_.header_size, vset::kFormatVersion, vset::kHeaderSize);
    }
    if (h_.container_size != size_) {
      return fail(why_, Error::InvalidProgram,
                  "Kiln variant set: container_size is %llu bytes but the buffer holds %zu "
                  "(truncated or padded)",
                  ull(h_.container_size), size_);
    }
    if (h_.num_variants == 0 || h_.num_variants > vset::kMaxVariants) {
      return fail(why_, Error::InvalidProgram,
                  "Kiln variant set: num_variants is %u, must be 1..%u", h_.num_variants,
                  vset::kMaxVariants);
    }
    if (h_.num_inputs > vset::kMaxInputs) {
      return fail(why_, Error::InvalidProgram,
                  "Kiln variant set: num_inputs is %u, above the maximum %u", h_.num_inputs,
                  vset::kMaxInputs);
    }
    return Error::Ok;
  }

  Error check_section(const char* field, uint64_t offset, uint64_t length, uint64_t alignment) {
    if (length == 0) return Error::Ok;
    if (offset < vset::kHeaderSize || !inside(offset, length, size_)) {
      return fail(why_, Error::InvalidProgram,
                  "Kiln variant set: %s (%llu) with %llu bytes is outside [%u, %zu)", field,
                  ull(offset), ull(length), vset::kHeaderSize, size_);
    }
    if (offset % alignment != 0) {
      return fail(why_, Error::InvalidProgram, "Kiln variant set: %s (%llu) is not %llu-byte "
                  "aligned", field, ull(offset), ull(alignment));
    }
    return Error::Ok;
  }

  Error check_tables() {
    // num_variants <= 64 and num_inputs <= 1024 keep these products far from overflowing.
    const uint64_t records = uint64_t{h_.num_variants} * sizeof(vset::VariantRecord);
    const uint64_t shapes =
        uint64_t{h_.num_variants} * h_.num_inputs * sizeof(vset::InputShape);
    Error err = check_section("variants_offset", h_.variants_offset, records, 8);
    if (err == Error::Ok) err = check_section("shapes_offset", h_.shapes_offset, shapes, 8);
    if (err == Error::Ok) {
      err = check_section("weights_offset", h_.weights_offset, h_.weights_size,
                          blob::kWeightAlignment);
    }
    if (err != Error::Ok) return err;
    if (h_.weights_size == 0 && h_.weights_offset != 0) {
      return fail(why_, Error::InvalidProgram,
                  "Kiln variant set: weights_offset is %llu with weights_size 0 (must be 0)",
                  ull(h_.weights_offset));
    }
    set_.weights = {h_.weights_size > 0 ? data_ + h_.weights_offset : nullptr, h_.weights_size};
    set_.variants.resize(h_.num_variants);
    return Error::Ok;
  }

  Error read_shape(uint32_t v, uint32_t i, Shape& out) {
    vset::InputShape s;
    std::memcpy(&s, data_ + h_.shapes_offset + (uint64_t{v} * h_.num_inputs + i) * sizeof(s),
                sizeof(s));
    if (s.rank > blob::kMaxRank || s.reserved != 0) {
      return fail(why_, Error::InvalidProgram,
                  "Kiln variant set: variant %u input %u: rank %u (max %u), reserved %u (must be 0)",
                  v, i, s.rank, blob::kMaxRank, s.reserved);
    }
    for (uint32_t d = 0; d < blob::kMaxRank; ++d) {
      if ((d < s.rank && s.sizes[d] < 0) || (d >= s.rank && s.sizes[d] != 0)) {
        return fail(why_, Error::InvalidProgram,
                    "Kiln variant set: variant %u input %u: sizes[%u] is %lld", v, i, d,
                    static_cast<long long>(s.sizes[d]));
      }
    }
    out.rank = s.rank;
    std::memcpy(out.sizes, s.sizes, sizeof(out.sizes));
    return Error::Ok;
  }

  Error read_variant(uint32_t v) {
    vset::VariantRecord r;
    std::memcpy(&r, data_ + h_.variants_offset + uint64_t{v} * sizeof(r), sizeof(r));
    if (r.blob_size == 0 || r.blob_offset < vset::kHeaderSize ||
        !inside(r.blob_offset, r.blob_size, size_) || r.blob_offset % vset::kBlobAlignment != 0) {
      return fail(why_, Error::InvalidProgram,
                  "Kiln variant set: variant %u blob [offset %llu, %llu bytes) is empty, "
                  "misaligned or outside the %zu-byte container",
                  v, ull(r.blob_offset), ull(r.blob_size), size_);
    }
    Variant& out = set_.variants[v];
    out.blob = data_ + r.blob_offset;
    out.blob_size = r.blob_size;
    std::string detail;
    auto graph = read_blob(out.blob, out.blob_size, &detail, &set_.weights);
    if (!graph.ok()) {
      return fail(why_, graph.error(), "Kiln variant set: variant %u: %s", v, detail.c_str());
    }
    const Graph& g = graph.get();
    out.arena_size = g.arena_size;
    if (g.inputs.size() != h_.num_inputs) {
      return fail(why_, Error::InvalidProgram,
                  "Kiln variant set: variant %u's blob has %zu inputs, the set declares %u", v,
                  g.inputs.size(), h_.num_inputs);
    }
    out.inputs.resize(h_.num_inputs);
    for (uint32_t i = 0; i < h_.num_inputs; ++i) {
      Error err = read_shape(v, i, out.inputs[i]);
      if (err != Error::Ok) return err;
      const Shape actual = tensor_shape(g.tensors[g.inputs[i]]);
      if (!same_shape(out.inputs[i], actual)) {
        return fail(why_, Error::InvalidProgram,
                    "Kiln variant set: variant %u input %u is declared %s but its blob's input "
                    "is %s",
                    v, i, shape_text(out.inputs[i]).c_str(), shape_text(actual).c_str());
      }
    }
    // Every variant stands in for the same delegate: same arity and dtypes as the first.
    std::vector<blob::DType> io;
    for (int64_t id : g.inputs) io.push_back(g.tensors[id].dtype);
    for (int64_t id : g.outputs) io.push_back(g.tensors[id].dtype);
    if (v == 0) {
      io_dtypes_ = io;
      num_outputs_ = g.outputs.size();
    } else if (io != io_dtypes_ || g.outputs.size() != num_outputs_) {
      return fail(why_, Error::InvalidProgram,
                  "Kiln variant set: variant %u's inputs/outputs (%zu outputs) differ in number "
                  "or dtype from variant 0's (%zu outputs)",
                  v, g.outputs.size(), num_outputs_);
    }
    for (uint32_t w = 0; w < v; ++w) {
      if (find_variant_in(set_.variants[w], out.inputs)) {
        return fail(why_, Error::InvalidProgram,
                    "Kiln variant set: variants %u and %u serve the same input shapes", w, v);
      }
    }
    return Error::Ok;
  }

  static bool find_variant_in(const Variant& v, const std::vector<Shape>& shapes) {
    if (v.inputs.size() != shapes.size()) return false;
    for (size_t i = 0; i < shapes.size(); ++i) {
      if (!same_shape(v.inputs[i], shapes[i])) return false;
    }
    return true;
  }

  const uint8_t* data_;
  size_t size_;
  std::string* why_;
  vset::VariantSetHeader h_{};
  VariantSet set_;
  std::vector<blob::DType> io_dtypes_;
  size_t num_outputs_ = 0;
};

}  // namespace

bool is_variant_set(const void* data, size_t size) {
  return data != nullptr && size >= sizeof(vset::kMagic) &&
         std::memcmp(data, vset::kMagic, sizeof(vset::kMagic)) == 0;
}

Result<VariantSet> read_variant_set(const void* data, size_t size, std::string* why) {
  return VariantSetReader(static_cast<const uint8_t*>(data), size, why).read();
}

int find_variant(const VariantSet& set, const std::vector<Shape>& shapes) {
  for (size_t v = 0; v < set.variants.size(); ++v) {
    const Variant& variant = set.variants[v];
    bool match = variant.inputs.size() == shapes.size();
    for (size_t i = 0; match && i < shapes.size(); ++i) {
      match = same_shape(variant.inputs[i], shapes[i]);
    }
    if (match) return static_cast<int>(v);
  }
  return -1;
}

std::string describe_shapes(const VariantSet& set) {
  if (set.variants.empty()) return "no shapes";
  std::string out;
  const size_t num_inputs = set.variants[0].inputs.size();
  for (size_t i = 0; i < num_inputs; ++i) {
    const uint32_t rank = set.variants[0].inputs[i].rank;
    out += (i ? "; input " : "input ") + std::to_string(i) + " [";
    for (uint32_t d = 0; d < rank; ++d) {
      int64_t lo = set.variants[0].inputs[i].sizes[d];
      int64_t hi = lo;
      for (const Variant& v : set.variants) {
        const int64_t n = v.inputs[i].rank == rank ? v.inputs[i].sizes[d] : lo;
        lo = n < lo ? n : lo;
        hi = n > hi ? n : hi;
      }
      out += (d ? "," : "") + std::to_string(lo);
      if (hi != lo) out += ".." + std::to_string(hi);
    }
    out += "]";
  }
  return out + " (" + std::to_string(set.variants.size()) + " variants)";
}

}  // namespace kiln::engine
