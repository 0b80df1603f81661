#include "format/blob_reader.h"

#include <cstdarg>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <iterator>
#include <limits>
#include <variant>

#include "format/fail.h"
#include "format/op_decoder.h"

namespace kiln::engine {
namespace {

using executorch::runtime::Error;
using executorch::runtime::Result;

using ull = unsigned long long;
using ll = long long;

bool known_dtype(uint32_t v) {
  switch (static_cast<blob::DType>(v)) {
    case blob::DType::kInt32:
    case blob::DType::kInt64:
    case blob::DType::kFloat16:
    case blob::DType::kFloat32:
    case blob::DType::kBool:
    case blob::DType::kBFloat16: return true;
  }
  return false;
}

// [offset, offset + length) lies inside [0, limit); written so that nothing can overflow.
bool extent_inside(uint64_t offset, uint64_t length, uint64_t limit) {
  return offset <= limit && length <= limit - offset;
}

// "[offset, end)" for a message, also when offset + length does not fit in 64 bits.
std::string extent_text(uint64_t offset, uint64_t length) {
  char buffer[96];
  uint64_t end;
  if (__builtin_add_overflow(offset, length, &end)) {
    std::snprintf(buffer, sizeof(buffer), "[%llu, %llu + %llu, which overflows)", ull(offset),
                  ull(offset), ull(length));
  } else {
    std::snprintf(buffer, sizeof(buffer), "[%llu, %llu)", ull(offset), ull(end));
  }
  return buffer;
}

class BlobReader {
 public:
  BlobReader(const uint8_t* data, size_t size, std::string* why, const WeightsView* external)
      : data_(data), size_(size), why_(why), external_(external) {}

  Result<Graph> read() {
    Error err = check_header();
    if (err == Error::Ok) err = check_sections();
    if (err == Error::Ok) err = read_tensors();
    if (err == Error::Ok) err = read_io();
    if (err == Error::Ok) err = read_ops();
    if (err != Error::Ok) {
      return err;
    }
    graph_.arena_size = header_.arena_size;
    graph_.precision = static_cast<blob::Precision>(header_.precision);
    if (external_weights()) {
      graph_.weights = external_->size > 0 ? external_->data : nullptr;
      graph_.weights_size = external_->size;
    } else {
      graph_.weights = header_.weights_size > 0 ? data_ + header_.weights_offset : nullptr;
      graph_.weights_size = header_.weights_size;
    }
    return std::move(graph_);
  }

 private:
  Error fail(Error code, const char* format, ...) __attribute__((format(printf, 3, 4))) {
    va_list args;
    va_start(args, format);
    const std::string detail = vformat(format, args);
    va_end(args);
    return engine::fail(why_, code, "%s", detail.c_str());
  }

  bool external_weights() const { return (header_.flags & blob::kFlagExternalWeights) != 0; }

  Error check_header() {
    if (data_ == nullptr) {
      return fail(Error::InvalidProgram, "not a Kiln engine blob: the data pointer is null");
    }
    if (size_ < sizeof(blob::kMagic) ||
        std::memcmp(data_, blob::kMagic, sizeof(blob::kMagic)) != 0) {
      return fail(Error::InvalidProgram,
                  "not a Kiln engine blob: the %zu-byte buffer does not start with the magic "
                  "'KILNBLOB'",
                  size_);
    }
    uint32_t version = 0;
    if (size_ >= offsetof(blob::Header, format_version) + sizeof(version)) {
      std::memcpy(&version, data_ + offsetof(blob::Header, format_version), sizeof(version));
      if (version != blob::kFormatVersion) {
        return fail(Error::DelegateInvalidCompatibility,
                    "Kiln blob: format_version is %u, but this Kiln engine reads format version "
                    "%u; re-export the model with the installed Kiln so the blob and the runtime "
                    "match",
                    version, blob::kFormatVersion);
      }
    }
    if (size_ < sizeof(blob::Header)) {
      return fail(Error::InvalidProgram,
                  "Kiln blob: truncated: %zu bytes is smaller than the %u-byte header", size_,
                  blob::kHeaderSize);
    }
    std::memcpy(&header_, data_, sizeof(header_));
    const blob::Header& h = header_;
    if (h.header_size != blob::kHeaderSize) {
      return fail(Error::InvalidProgram,
                  "Kiln blob: header_size is %u, format version %u has a %u-byte header",
                  h.header_size, blob::kFormatVersion, blob::kHeaderSize);
    }
    if (h.blob_size != size_) {
      return fail(Error::InvalidProgram,
                  "Kiln blob: blob_size is %llu bytes but the buffer holds %zu bytes (truncated "
                  "or padded blob)",
                  ull(h.blob_size), size_);
    }
    if ((h.flags & ~blob::kFlagExternalWeights) != 0) {
      return fail(Error::InvalidProgram,
                  "Kiln blob: flags is 0x%x, but format version %u defines only bit 0 (external "
                  "weights)",
                  h.flags, blob::kFormatVersion);
    }
    if (external_weights()) {
      if (h.weights_size != 0) {
        return fail(Error::InvalidProgram,
                    "Kiln blob: the external-weights flag is set but weights_size is %llu (must "
                    "be 0)",
                    ull(h.weights_size));
      }
      if (external_ == nullptr || (external_->data == nullptr && external_->size != 0)) {
        return fail(Error::InvalidProgram,
                    "Kiln blob: its weights are external (flags bit 0) but none were given; such "
                    "a blob is only valid inside the variant set that holds its weights");
      }
    }
    for (size_t i = 0; i < sizeof(h.reserved); ++i) {
      if (h.reserved[i] != 0) {
        return fail(Error::InvalidProgram, "Kiln blob: reserved[%zu] is %u, must be 0", i,
                    h.reserved[i]);
      }
    }
    if (h.precision > static_cast<uint32_t>(blob::Precision::kBf16)) {
      return fail(Error::InvalidProgram, "Kiln blob: precision is %u, not a known Precision (0..3)",
                  h.precision);
    }
    return Error::Ok;
  }

  Error check_sections() {
    const blob::Header& h = header_;
    if (h.num_operands > std::numeric_limits<uint64_t>::max() / sizeof(int64_t)) {
      return fail(Error::InvalidProgram, "Kiln blob: num_operands (%llu) is impossibly large",
                  ull(h.num_operands));
    }
    struct Section {
      const char* name;
      const char* offset_field;
      uint64_t offset;
      uint64_t length;
      uint64_t alignment;
    };
    const Section sections[] = {
        {"tensors", "tensors_offset", h.tensors_offset,
         uint64_t{h.num_tensors} * sizeof(blob::TensorRecord), 8},
        {"ops", "ops_offset", h.ops_offset, uint64_t{h.num_ops} * sizeof(blob::OpRecord), 8},
        {"operands", "operands_offset", h.operands_offset, h.num_operands * sizeof(int64_t), 8},
        {"io", "io_offset", h.io_offset,
         (uint64_t{h.num_inputs} + h.num_outputs) * sizeof(uint32_t), 4},
        {"weights", "weights_offset", h.weights_offset, h.weights_size, blob::kWeightAlignment},
    };
    for (const Section& s : sections) {
      if (s.length == 0) {
        if (s.offset > size_) {
          return fail(Error::InvalidProgram,
                      "Kiln blob: %s (%llu) is past the end of the %zu-byte blob", s.offset_field,
                      ull(s.offset), size_);
        }
        continue;
      }
      if (!extent_inside(s.offset, s.length, size_)) {
        return fail(Error::InvalidProgram,
                    "Kiln blob: %s (%llu) plus the %llu bytes of the %s section is past the end "
                    "of the %zu-byte blob",
                    s.offset_field, ull(s.offset), ull(s.length), s.name, size_);
      }
      if (s.offset < blob::kHeaderSize) {
        return fail(Error::InvalidProgram,
                    "Kiln blob: %s (%llu) puts the %s section inside the %u-byte header",
                    s.offset_field, ull(s.offset), s.name, blob::kHeaderSize);
      }
      if (s.offset % s.alignment != 0) {
        return fail(Error::InvalidProgram, "Kiln blob: %s (%llu) is not %llu-byte aligned",
                    s.offset_field, ull(s.offset), ull(s.alignment));
      }
    }
    for (size_t i = 0; i < std::size(sections); ++i) {
      for (size_t j = i + 1; j < std::size(sections); ++j) {
        const Section& a = sections[i];
        const Section& b = sections[j];
        if (a.length != 0 && b.length != 0 && a.offset < b.offset + b.length &&
            b.offset < a.offset + a.length) {
          return fail(Error::InvalidProgram,
                      "Kiln blob: the %s section [%llu, %llu) (%s) and the %s section [%llu, "
                      "%llu) (%s) overlap",
                      a.name, ull(a.offset), ull(a.offset + a.length), a.offset_field, b.name,
                      ull(b.offset), ull(b.offset + b.length), b.offset_field);
        }
      }
    }
    return Error::Ok;
  }

  Error read_tensors() {
    const blob::Header& h = header_;
    graph_.tensors.resize(h.num_tensors);
    for (uint32_t i = 0; i < h.num_tensors; ++i) {
      blob::TensorRecord r;
      std::memcpy(&r, data_ + h.tensors_offset + uint64_t{i} * sizeof(r), sizeof(r));
      if (!known_dtype(r.dtype)) {
        return fail(Error::InvalidProgram,
                    "Kiln blob: tensor %u: dtype %u is not a known DType (Int32=3, Int64=4, "
                    "Float16=5, Float32=6, Bool=11, BFloat16=15)",
                    i, r.dtype);
      }
      if (r.rank > blob::kMaxRank) {
        return fail(Error::InvalidProgram, "Kiln blob: tensor %u: rank %u is above the maximum %u",
                    i, r.rank, blob::kMaxRank);
      }
      int64_t numel = 1;
      for (uint32_t d = 0; d < blob::kMaxRank; ++d) {
        if (d < r.rank && r.sizes[d] < 0) {
          return fail(Error::InvalidProgram,
                      "Kiln blob: tensor %u: sizes[%u] is %lld, must be >= 0", i, d,
                      ll(r.sizes[d]));
        }
        if (d >= r.rank && r.sizes[d] != 0) {
          return fail(Error::InvalidProgram,
                      "Kiln blob: tensor %u: sizes[%u] is %lld beyond its rank %u, must be 0", i, d,
                      ll(r.sizes[d]), r.rank);
        }
        if (d < r.rank && __builtin_mul_overflow(numel, r.sizes[d], &numel)) {
          return fail(Error::InvalidProgram, "Kiln blob: tensor %u: the element count overflows",
                      i);
        }
      }
      const blob::DType dtype = static_cast<blob::DType>(r.dtype);
      uint64_t expected_bytes;
      if (__builtin_mul_overflow(static_cast<uint64_t>(numel), element_size(dtype),
                                 &expected_bytes)) {
        return fail(Error::InvalidProgram, "Kiln blob: tensor %u: the byte size overflows", i);
      }
      if (r.nbytes != expected_bytes) {
        return fail(Error::InvalidProgram,
                    "Kiln blob: tensor %u: nbytes is %llu, but %lld elements of %s take %llu bytes",
                    i, ull(r.nbytes), ll(numel), dtype_name(dtype), ull(expected_bytes));
      }
      if (r.storage > static_cast<uint32_t>(blob::Storage::kState)) {
        return fail(Error::InvalidProgram,
                    "Kiln blob: tensor %u: storage %u is not a known Storage (Arena=0, Weight=1, "
                    "Input=2, Output=3, State=4)",
                    i, r.storage);
      }
      if (r.reserved != 0) {
        return fail(Error::InvalidProgram, "Kiln blob: tensor %u: reserved is %u, must be 0", i,
                    r.reserved);
      }
      const blob::Storage storage = static_cast<blob::Storage>(r.storage);
      Error err = check_storage(i, storage, r.offset, r.nbytes);
      if (err != Error::Ok) {
        return err;
      }
      Tensor& t = graph_.tensors[i];
      t.dtype = dtype;
      t.rank = r.rank;
      std::memcpy(t.sizes, r.sizes, sizeof(t.sizes));
      t.storage = storage;
      t.offset = r.offset;
      t.nbytes = r.nbytes;
      t.numel = numel;
    }
    return check_states();
  }

  // Records with one offset are views of one state and share its size; states at different
  // offsets get separate device buffers, so their initial values may not overlap.
  Error check_states() {
    const std::vector<Tensor>& ts = graph_.tensors;
    for (size_t i = 0; i < ts.size(); ++i) {
      if (ts[i].storage != blob::Storage::kState) continue;
      for (size_t j = 0; j < i; ++j) {
        if (ts[j].storage != blob::Storage::kState) continue;
        const Tensor& a = ts[j];
        const Tensor& b = ts[i];
        if (a.offset == b.offset ? a.nbytes != b.nbytes
                                 : a.offset < b.offset + b.nbytes && b.offset < a.offset + a.nbytes) {
          return fail(Error::InvalidProgram,
                      "Kiln blob: state tensors %zu (weights bytes %s) and %zu (weights bytes %s) "
                      "overlap without being the same state (same offset and size)",
                      j, extent_text(a.offset, a.nbytes).c_str(), i,
                      extent_text(b.offset, b.nbytes).c_str());
        }
      }
    }
    return Error::Ok;
  }

  Error check_storage(uint32_t i, blob::Storage storage, uint64_t offset, uint64_t nbytes) {
    const blob::Header& h = header_;
    switch (storage) {
      case blob::Storage::kWeight:
      case blob::Storage::kState: {  // a state's initial value lives in the weights section
        const uint64_t limit = external_weights() ? external_->size : h.weights_size;
        if (!extent_inside(offset, nbytes, limit)) {
          return fail(Error::InvalidProgram,
                      "Kiln blob: tensor %u extent %s is past the %sweights section (%llu bytes)",
                      i, extent_text(offset, nbytes).c_str(),
                      external_weights() ? "external " : "", ull(limit));
        }
        if (offset % blob::kWeightAlignment != 0) {
          return fail(Error::InvalidProgram,
                      "Kiln blob: tensor %u: weights offset %llu is not %u-byte aligned", i,
                      ull(offset), blob::kWeightAlignment);
        }
        return Error::Ok;
      }
      case blob::Storage::kArena:
        if (!extent_inside(offset, nbytes, h.arena_size)) {
          return fail(Error::InvalidProgram,
                      "Kiln blob: tensor %u extent %s is past the arena (arena_size %llu bytes)", i,
                      extent_text(offset, nbytes).c_str(), ull(h.arena_size));
        }
        return Error::Ok;
      case blob::Storage::kInput:
        if (offset >= h.num_inputs) {
          return fail(Error::InvalidProgram,
                      "Kiln blob: tensor %u: storage Input with index %llu, but the blob has %u "
                      "inputs",
                      i, ull(offset), h.num_inputs);
        }
        return Error::Ok;
      case blob::Storage::kOutput:
        if (offset >= h.num_outputs) {
          return fail(Error::InvalidProgram,
                      "Kiln blob: tensor %u: storage Output with index %llu, but the blob has %u "
                      "outputs",
                      i, ull(offset), h.num_outputs);
        }
        return Error::Ok;
    }
    return Error::Ok;
  }

  Error read_io() {
    const blob::Header& h = header_;
    const uint64_t total = uint64_t{h.num_inputs} + h.num_outputs;
    for (uint64_t e = 0; e < total; ++e) {
      uint32_t id;
      std::memcpy(&id, data_ + h.io_offset + e * sizeof(id), sizeof(id));
      const bool is_input = e < h.num_inputs;
      const uint32_t index = static_cast<uint32_t>(is_input ? e : e - h.num_inputs);
      const char* role = is_input ? "input" : "output";
      const blob::Storage want = is_input ? blob::Storage::kInput : blob::Storage::kOutput;
      if (id >= graph_.tensors.size()) {
        return fail(Error::InvalidProgram,
                    "Kiln blob: io table entry %llu (%s %u) is tensor id %u, but the blob has %zu "
                    "tensors",
                    ull(e), role, index, id, graph_.tensors.size());
      }
      const Tensor& t = graph_.tensors[id];
      if (t.storage != want || t.offset != index) {
        return fail(
            Error::InvalidProgram,
            "Kiln blob: io table entry %llu (%s %u) is tensor %u, whose storage is %s %llu; "
            "expected %s %u",
            ull(e), role, index, id, storage_name(t.storage), ull(t.offset), storage_name(want),
            index);
      }
      (is_input ? graph_.inputs : graph_.outputs).push_back(id);
    }
    // Other tensors bound to the same argument are views of it and must fit inside it.
    for (size_t i = 0; i < graph_.tensors.size(); ++i) {
      const Tensor& t = graph_.tensors[i];
      if (t.storage != blob::Storage::kInput && t.storage != blob::Storage::kOutput) {
        continue;
      }
      const bool is_input = t.storage == blob::Storage::kInput;
      const int64_t owner = (is_input ? graph_.inputs : graph_.outputs)[t.offset];
      if (t.nbytes > graph_.tensors[owner].nbytes) {
        return fail(Error::InvalidProgram,
                    "Kiln blob: tensor %zu views %s %llu with %llu bytes, but that argument "
                    "(tensor %lld) has only %llu bytes",
                    i, is_input ? "input" : "output", ull(t.offset), ull(t.nbytes), ll(owner),
                    ull(graph_.tensors[owner].nbytes));
      }
    }
    return Error::Ok;
  }

  Error read_ops() {
    const blob::Header& h = header_;
    std::vector<int64_t> operands(h.num_operands);
    if (h.num_operands > 0) {
      std::memcpy(operands.data(), data_ + h.operands_offset, h.num_operands * sizeof(int64_t));
    }
    graph_.ops.reserve(h.num_ops);
    for (uint32_t i = 0; i < h.num_ops; ++i) {
      blob::OpRecord r;
      std::memcpy(&r, data_ + h.ops_offset + uint64_t{i} * sizeof(r), sizeof(r));
      if (blob::find_op(r.opcode) == nullptr) {
        return fail(Error::InvalidProgram,
                    "Kiln blob: op %u: opcode %u is not a known Opcode (1..%u)", i, r.opcode,
                    blob::kMaxOpcode);
      }
      if (!extent_inside(r.first_operand, r.num_operands, h.num_operands)) {
        return fail(Error::InvalidProgram,
                    "Kiln blob: op %u (%s): operands [first_operand %llu, + num_operands %u) are "
                    "past the operand pool (num_operands %llu)",
                    i, opcode_name(static_cast<blob::Opcode>(r.opcode)), ull(r.first_operand),
                    r.num_operands, ull(h.num_operands));
      }
      const blob::Opcode opcode = static_cast<blob::Opcode>(r.opcode);
      auto op =
          decode_op(graph_, i, opcode, operands.data() + r.first_operand, r.num_operands, why_);
      if (!op.ok()) {
        return op.error();
      }
      graph_.ops.push_back(std::move(op.get()));
    }
    // An output no op writes would hand the caller whatever its buffer held before.
    std::vector<bool> written(graph_.outputs.size(), false);
    for (const Op& op : graph_.ops) {
      const Tensor& out = graph_.tensors[std::visit([](const auto& a) { return a.out; }, op.args)];
      if (out.storage == blob::Storage::kOutput) {
        written[out.offset] = true;
      }
    }
    for (size_t o = 0; o < graph_.outputs.size(); ++o) {
      if (!written[o] && graph_.tensors[graph_.outputs[o]].nbytes > 0) {
        return fail(Error::InvalidProgram,
                    "Kiln blob: output %zu (tensor %lld) is never written by any op", o,
                    ll(graph_.outputs[o]));
      }
    }
    return Error::Ok;
  }

  const uint8_t* data_;
  size_t size_;
  std::string* why_;
  const WeightsView* external_;
  blob::Header header_{};
  Graph graph_;
};

}  // namespace

Result<Graph> read_blob(const void* data, size_t size, std::string* why,
                        const WeightsView* external_weights) {
  return BlobReader(static_cast<const uint8_t*>(data), size, why, external_weights).read();
}

}  // namespace kiln::engine
