// Builds engine blobs (format v1) in tests: tensors, ops with their operand layouts, weights, and
// the io table, laid out the way the AOT writer does (header, tensors, ops, operands, io, weights).
// The raw records stay public so reader tests can corrupt any field before build().
#pragma once

#include <cstdint>
#include <cstring>
#include <initializer_list>
#include <vector>

#include "format/blob_format.h"

namespace kiln::engine::testing {

class BlobBuilder {
 public:
  using DType = blob::DType;
  using Sizes = std::vector<int64_t>;

  /// Section offsets of the last build().
  struct Layout {
    uint64_t tensors_offset = 0, ops_offset = 0, operands_offset = 0, io_offset = 0,
             weights_offset = 0, blob_size = 0;
  };

  static int64_t f(double v) {
    int64_t bits;
    std::memcpy(&bits, &v, sizeof(bits));
    return bits;
  }

  static size_t elem_size(DType d) {
    switch (d) {
      case DType::kBool: return 1;
      case DType::kFloat16:
      case DType::kBFloat16: return 2;
      case DType::kInt32:
      case DType::kFloat32: return 4;
      case DType::kInt64: return 8;
    }
    return 0;
  }

  static int64_t numel(const Sizes& sizes) {
    int64_t n = 1;
    for (int64_t s : sizes) n *= s;
    return n;
  }

  int64_t input(DType dtype, const Sizes& sizes) {
    const int64_t id = add(dtype, sizes, blob::Storage::kInput, num_inputs_++);
    inputs_.push_back(static_cast<uint32_t>(id));
    return id;
  }

  int64_t output(DType dtype, const Sizes& sizes) {
    const int64_t id = add(dtype, sizes, blob::Storage::kOutput, num_outputs_++);
    outputs_.push_back(static_cast<uint32_t>(id));
    return id;
  }

  /// An activation in the arena, 256-byte aligned like a planner would place it.
  int64_t arena(DType dtype, const Sizes& sizes) {
    const int64_t id = add(dtype, sizes, blob::Storage::kArena, arena_size_);
    arena_size_ += (tensors[id].nbytes + 255) / 256 * 256;
    return id;
  }

  /// A constant; `data` holds numel elements of `dtype`.
  int64_t weight(DType dtype, const Sizes& sizes, const void* data) {
    const uint64_t offset = (weights.size() + blob::kWeightAlignment - 1) / blob::kWeightAlignment *
                            blob::kWeightAlignment;
    const int64_t id = add(dtype, sizes, blob::Storage::kWeight, offset);
    weights.resize(offset + tensors[id].nbytes);
    if (tensors[id].nbytes > 0) {
      std::memcpy(weights.data() + offset, data, tensors[id].nbytes);
    }
    return id;
  }

  /// Program state starting as `data` (numel elements of `dtype`), stored on its own in the
  /// weights section as the AOT writer stores it.
  int64_t state(DType dtype, const Sizes& sizes, const void* data) {
    const int64_t id = weight(dtype, sizes, data);
    tensors[id].storage = static_cast<uint32_t>(blob::Storage::kState);
    return id;
  }

  /// Another record over the bytes of `base` (a view), with its own shape.
  int64_t view(int64_t base, const Sizes& sizes) {
    const blob::TensorRecord r = tensors[base];
    const int64_t id = add(static_cast<DType>(r.dtype), sizes, static_cast<blob::Storage>(r.storage),
                           r.offset);
    return id;
  }

  void op(blob::Opcode opcode, std::initializer_list<int64_t> list) {
    op(opcode, std::vector<int64_t>(list));
  }

  void op(blob::Opcode opcode, const std::vector<int64_t>& list) {
    ops.push_back(
        {static_cast<uint32_t>(opcode), static_cast<uint32_t>(list.size()), operands.size()});
    operands.insert(operands.end(), list.begin(), list.end());
  }

  // --- One helper per opcode, operands in op table order (format/op_table.def). ---

  void copy(int64_t x, int64_t out, const Sizes& sizes, int64_t in_offset, const Sizes& in_strides,
            int64_t out_offset, const Sizes& out_strides) {
    std::vector<int64_t> v = {x, out, static_cast<int64_t>(sizes.size())};
    append(v, sizes);
    v.push_back(in_offset);
    append(v, in_strides);
    v.push_back(out_offset);
    append(v, out_strides);
    op(blob::Opcode::kCopy, v);
  }

  void binary(blob::BinaryKind kind, int64_t a, int64_t b, int64_t out, double alpha, double scalar,
              const Sizes& sizes, const Sizes& a_strides, const Sizes& b_strides) {
    std::vector<int64_t> v = {static_cast<int64_t>(kind),        a, b, out, f(alpha), f(scalar),
                              static_cast<int64_t>(sizes.size())};
    append(v, sizes);
    append(v, a_strides);
    append(v, b_strides);
    op(blob::Opcode::kBinary, v);
  }

  void unary(blob::UnaryKind kind, int64_t x, int64_t out, double p0 = 0, double p1 = 0) {
    op(blob::Opcode::kUnary, {static_cast<int64_t>(kind), x, out, f(p0), f(p1)});
  }

  void where(int64_t cond, int64_t a, int64_t b, int64_t out, const Sizes& sizes,
             const Sizes& cond_strides, const Sizes& a_strides, const Sizes& b_strides) {
    std::vector<int64_t> v = {cond, a, b, out, static_cast<int64_t>(sizes.size())};
    append(v, sizes);
    append(v, cond_strides);
    append(v, a_strides);
    append(v, b_strides);
    op(blob::Opcode::kWhere, v);
  }

  struct Matmul {
    int64_t a, b, bias = -1, out;
    int64_t batch = 1, m, n, k;
    bool trans_a = false, trans_b = false;
    int64_t a_batch_stride = 0, b_batch_stride = 0;
    int64_t bias_row_stride = 0, bias_col_stride = 1;
    double alpha = 1, beta = 1;
    blob::Epilogue epilogue = blob::Epilogue::kNone;
    int64_t residual = -1;
  };

  void matmul(const Matmul& m) {
    op(blob::Opcode::kMatmul,
       {m.a, m.b, m.bias, m.out, m.batch, m.m, m.n, m.k, m.trans_a, m.trans_b, m.a_batch_stride,
        m.b_batch_stride, m.bias_row_stride, m.bias_col_stride, f(m.alpha), f(m.beta),
        static_cast<int64_t>(m.epilogue), m.residual});
  }

  void softmax(int64_t x, int64_t out, int64_t outer, int64_t dim, int64_t inner, bool is_log) {
    op(blob::Opcode::kSoftmax, {x, out, outer, dim, inner, is_log});
  }

  void layer_norm(int64_t x, int64_t weight, int64_t bias, int64_t out, int64_t rows, int64_t cols,
                  double eps, bool rms = false) {
    op(blob::Opcode::kLayerNorm, {x, weight, bias, out, rows, cols, f(eps), rms});
  }

  void reduce(blob::ReduceKind kind, int64_t x, int64_t out, int64_t outer, int64_t reduce,
              int64_t inner) {
    op(blob::Opcode::kReduce, {static_cast<int64_t>(kind), x, out, outer, reduce, inner});
  }

  void embedding(int64_t weight, int64_t indices, int64_t out, int64_t num_indices, int64_t dim,
                 int64_t vocab) {
    op(blob::Opcode::kEmbedding, {weight, indices, out, num_indices, dim, vocab});
  }

  void fill(int64_t out, double value) { op(blob::Opcode::kFill, {out, f(value)}); }

  void index_put(int64_t values, int64_t positions, int64_t out, int64_t outer, int64_t dim_size,
                 int64_t inner, int64_t num_positions) {
    op(blob::Opcode::kIndexPut, {values, positions, out, outer, dim_size, inner, num_positions});
  }

  void embedding_bag(int64_t weight, int64_t indices, int64_t offsets, int64_t out,
                     blob::BagMode mode, int64_t num_indices, int64_t num_offsets,
                     int64_t num_bags, int64_t dim, int64_t vocab) {
    op(blob::Opcode::kEmbeddingBag, {weight, indices, offsets, out, static_cast<int64_t>(mode),
                                     num_indices, num_offsets, num_bags, dim, vocab});
  }

  void gather(int64_t x, int64_t index, int64_t out, const Sizes& sizes, const Sizes& x_strides,
              const Sizes& index_strides, int64_t index_stride, int64_t dim_size) {
    std::vector<int64_t> v = {x, index, out, static_cast<int64_t>(sizes.size())};
    append(v, sizes);
    append(v, x_strides);
    append(v, index_strides);
    v.push_back(index_stride);
    v.push_back(dim_size);
    op(blob::Opcode::kGather, v);
  }

  // index_strides holds num_indices * rank strides, index k's at [k * rank, (k + 1) * rank).
  void scatter(int64_t values, int64_t out, const Sizes& sizes, const Sizes& out_strides,
               const Sizes& values_strides, const std::vector<int64_t>& indices,
               const Sizes& index_strides, const Sizes& index_out_strides,
               const Sizes& dim_sizes, bool accumulate) {
    std::vector<int64_t> v = {values, out, static_cast<int64_t>(sizes.size())};
    append(v, sizes);
    append(v, out_strides);
    append(v, values_strides);
    v.push_back(static_cast<int64_t>(indices.size()));
    append(v, indices);
    append(v, index_strides);
    append(v, index_out_strides);
    append(v, dim_sizes);
    v.push_back(accumulate ? 1 : 0);
    op(blob::Opcode::kScatter, v);
  }

  void rope(int64_t x, int64_t cos, int64_t sin, int64_t out, const Sizes& sizes,
            int64_t x_offset, const Sizes& x_strides, int64_t cos_offset, const Sizes& cos_strides,
            int64_t sin_offset, const Sizes& sin_strides) {
    std::vector<int64_t> v = {x, cos, sin, out, static_cast<int64_t>(sizes.size())};
    append(v, sizes);
    v.push_back(x_offset);
    append(v, x_strides);
    v.push_back(cos_offset);
    append(v, cos_strides);
    v.push_back(sin_offset);
    append(v, sin_strides);
    op(blob::Opcode::kRope, v);
  }

  /// kQuantMatmul (op_table.def); group_size 0 means K (one scale per output channel).
  struct QuantMatmul {
    int64_t x, weight, scales, bias = -1, out;
    int64_t m, n, k, bits = 8, group_size = 0;
    blob::Epilogue epilogue = blob::Epilogue::kNone;
    int64_t residual = -1;
  };

  void quant_matmul(const QuantMatmul& q) {
    op(blob::Opcode::kQuantMatmul,
       {q.x, q.weight, q.scales, q.bias, q.out, q.m, q.n, q.k, q.bits,
        q.group_size == 0 ? q.k : q.group_size, static_cast<int64_t>(q.epilogue), q.residual});
  }

  /// One kFusedElementwise instruction, as blob_format.h lays it out.
  struct Instr {
    blob::FusedForm form;
    int64_t kind, src0, src1 = -1, src2 = -1;
    double p0 = 0, p1 = 0;
    DType round = DType::kFloat32;
  };

  void fused(int64_t out, const Sizes& sizes, const std::vector<int64_t>& inputs,
             const std::vector<Sizes>& strides, const std::vector<Instr>& program) {
    std::vector<int64_t> v = {out, static_cast<int64_t>(sizes.size())};
    append(v, sizes);
    v.push_back(static_cast<int64_t>(inputs.size()));
    append(v, inputs);
    for (const Sizes& st : strides) append(v, st);
    v.push_back(static_cast<int64_t>(program.size()));
    for (const Instr& in : program) {
      append(v, {static_cast<int64_t>(in.form), in.kind, in.src0, in.src1, in.src2, f(in.p0),
                 f(in.p1), static_cast<int64_t>(in.round)});
    }
    op(blob::Opcode::kFusedElementwise, v);
  }

  /// out = act(inputs[act_input]) * the other input, over dense [rows, cols] inputs `first` and
  /// `second`, each step rounded to `dtype`: a SwiGLU / GeGLU gate as one kFusedElementwise. The
  /// product keeps the inputs' order (the activation's result in the gate's place).
  void gated(int64_t out, int64_t rows, int64_t cols, int64_t first, int64_t second,
             blob::UnaryKind act, int64_t act_input, DType dtype) {
    const int64_t mul_a = act_input == 0 ? 2 : 0, mul_b = act_input == 0 ? 1 : 2;
    fused(out, {rows, cols}, {first, second}, {{cols, 1}, {cols, 1}},
          {Instr{blob::FusedForm::kUnary, static_cast<int64_t>(act), act_input, -1, -1, 0.0, 0.0,
                 dtype},
           Instr{blob::FusedForm::kBinary, static_cast<int64_t>(blob::BinaryKind::kMul), mul_a,
                 mul_b, -1, 1.0, 0.0, dtype}});
  }

  struct Conv2d {
    int64_t x, weight, bias = -1, out;
    int64_t n, c_in, h, w, c_out, kh, kw;
    int64_t stride_h = 1, stride_w = 1, pad_h = 0, pad_w = 0, dil_h = 1, dil_w = 1, groups = 1;
    blob::Epilogue epilogue = blob::Epilogue::kNone;
    int64_t residual = -1;
    bool channels_last = false;
    int64_t h_out() const { return (h + 2 * pad_h - dil_h * (kh - 1) - 1) / stride_h + 1; }
    int64_t w_out() const { return (w + 2 * pad_w - dil_w * (kw - 1) - 1) / stride_w + 1; }
  };

  void conv2d(const Conv2d& c) {
    op(blob::Opcode::kConv2d,
       {c.x,     c.weight, c.bias,  c.out,    c.n,        c.c_in,     c.h,
        c.w,     c.c_out,  c.kh,    c.kw,     c.stride_h, c.stride_w, c.pad_h,
        c.pad_w, c.dil_h,  c.dil_w, c.groups, c.h_out(),  c.w_out(),
        static_cast<int64_t>(c.epilogue), c.residual, c.channels_last});
  }

  struct Pool2d {
    blob::PoolKind kind = blob::PoolKind::kMax;
    int64_t x, out;
    int64_t n, c, h, w, kh, kw;
    int64_t stride_h = 1, stride_w = 1, pad_h = 0, pad_w = 0, dil_h = 1, dil_w = 1;
    bool ceil_mode = false;
    bool count_include_pad = true;
    bool channels_last = false;
    // PyTorch's pooling output size, with ceil_mode folded in.
    static int64_t out_size(int64_t in, int64_t k, int64_t s, int64_t p, int64_t d, bool ceil) {
      const int64_t span = in + 2 * p - d * (k - 1) - 1;
      int64_t out = (ceil ? (span + s - 1) / s : span / s) + 1;
      if (ceil && (out - 1) * s >= in + p) --out;
      return out;
    }
    int64_t h_out() const { return out_size(h, kh, stride_h, pad_h, dil_h, ceil_mode); }
    int64_t w_out() const { return out_size(w, kw, stride_w, pad_w, dil_w, ceil_mode); }
  };

  void pool2d(const Pool2d& p) {
    op(blob::Opcode::kPool2d,
       {static_cast<int64_t>(p.kind), p.x, p.out, p.n, p.c, p.h, p.w, p.kh, p.kw, p.stride_h,
        p.stride_w, p.pad_h, p.pad_w, p.dil_h, p.dil_w, p.h_out(), p.w_out(), p.count_include_pad,
        p.channels_last});
  }

  /// kAttention. Strides default to contiguous [B, H, S, D] q/k/v/out (set() fills them) and a
  /// mask of [B, Hq, Sq, Skv]; -1 strides mean "contiguous".
  struct Attention {
    int64_t q, k, v, mask = -1, out;
    int64_t batch, heads_q, heads_kv, seq_q, seq_kv, head_dim, head_dim_v;
    int64_t q_offset = 0, k_offset = 0, v_offset = 0;
    int64_t q_strides[3] = {-1, -1, -1}, k_strides[3] = {-1, -1, -1},
            v_strides[3] = {-1, -1, -1}, mask_strides[4] = {-1, -1, -1, -1},
            out_strides[3] = {-1, -1, -1};
    bool causal = false;
    double scale = 1.0;
  };

  void attention(Attention a) {
    auto fill3 = [](int64_t* s, int64_t h, int64_t seq, int64_t d) {
      if (s[0] < 0) {
        s[2] = d;
        s[1] = seq * d;
        s[0] = h * seq * d;
      }
    };
    fill3(a.q_strides, a.heads_q, a.seq_q, a.head_dim);
    fill3(a.k_strides, a.heads_kv, a.seq_kv, a.head_dim);
    fill3(a.v_strides, a.heads_kv, a.seq_kv, a.head_dim_v);
    fill3(a.out_strides, a.heads_q, a.seq_q, a.head_dim_v);
    if (a.mask_strides[0] < 0) {
      a.mask_strides[3] = 1;
      a.mask_strides[2] = a.seq_kv;
      a.mask_strides[1] = a.seq_q * a.seq_kv;
      a.mask_strides[0] = a.heads_q * a.seq_q * a.seq_kv;
    }
    op(blob::Opcode::kAttention,
       {a.q, a.k, a.v, a.mask, a.out, a.batch, a.heads_q, a.heads_kv, a.seq_q, a.seq_kv,
        a.head_dim, a.head_dim_v, a.q_offset, a.k_offset, a.v_offset, a.q_strides[0],
        a.q_strides[1], a.q_strides[2], a.k_strides[0],
        a.k_strides[1], a.k_strides[2], a.v_strides[0], a.v_strides[1], a.v_strides[2],
        a.mask_strides[0], a.mask_strides[1], a.mask_strides[2], a.mask_strides[3], a.causal,
        f(a.scale), a.out_strides[0], a.out_strides[1], a.out_strides[2]});
  }

  /// Serialises everything into one blob; layout() then describes where each section went.
  std::vector<uint8_t> build() {
    auto align = [](uint64_t v, uint64_t a) { return (v + a - 1) / a * a; };
    Layout l;
    uint64_t at = blob::kHeaderSize;
    l.tensors_offset = at;
    at += tensors.size() * sizeof(blob::TensorRecord);
    l.ops_offset = at;
    at += ops.size() * sizeof(blob::OpRecord);
    l.operands_offset = at;
    at += operands.size() * sizeof(int64_t);
    l.io_offset = at;
    at += (inputs_.size() + outputs_.size()) * sizeof(uint32_t);
    at = align(at, blob::kWeightAlignment);
    l.weights_offset = at;
    at += weights.size();
    l.blob_size = at;

    blob::Header h{};
    std::memcpy(h.magic, blob::kMagic, sizeof(h.magic));
    h.format_version = blob::kFormatVersion;
    h.header_size = blob::kHeaderSize;
    h.blob_size = l.blob_size;
    h.num_tensors = static_cast<uint32_t>(tensors.size());
    h.num_ops = static_cast<uint32_t>(ops.size());
    h.num_inputs = static_cast<uint32_t>(inputs_.size());
    h.num_outputs = static_cast<uint32_t>(outputs_.size());
    h.tensors_offset = l.tensors_offset;
    h.ops_offset = l.ops_offset;
    h.operands_offset = l.operands_offset;
    h.num_operands = operands.size();
    h.io_offset = l.io_offset;
    h.weights_offset = l.weights_offset;
    h.weights_size = weights.size();
    h.arena_size = arena_size_;
    h.precision = static_cast<uint32_t>(precision);

    std::vector<uint8_t> out(l.blob_size, 0);
    std::memcpy(out.data(), &h, sizeof(h));
    put(out, l.tensors_offset, tensors.data(), tensors.size() * sizeof(blob::TensorRecord));
    put(out, l.ops_offset, ops.data(), ops.size() * sizeof(blob::OpRecord));
    put(out, l.operands_offset, operands.data(), operands.size() * sizeof(int64_t));
    put(out, l.io_offset, inputs_.data(), inputs_.size() * sizeof(uint32_t));
    put(out, l.io_offset + inputs_.size() * sizeof(uint32_t), outputs_.data(),
        outputs_.size() * sizeof(uint32_t));
    put(out, l.weights_offset, weights.data(), weights.size());
    layout_ = l;
    return out;
  }

  const Layout& layout() const { return layout_; }
  uint64_t arena_size() const { return arena_size_; }

  // Public so tests can corrupt them.
  std::vector<blob::TensorRecord> tensors;
  std::vector<blob::OpRecord> ops;
  std::vector<int64_t> operands;
  std::vector<uint8_t> weights;
  blob::Precision precision = blob::Precision::kFp32;

 private:
  int64_t add(DType dtype, const Sizes& sizes, blob::Storage storage, uint64_t offset) {
    blob::TensorRecord r{};
    r.dtype = static_cast<uint32_t>(dtype);
    r.rank = static_cast<uint32_t>(sizes.size());
    for (size_t d = 0; d < sizes.size(); ++d) r.sizes[d] = sizes[d];
    r.storage = static_cast<uint32_t>(storage);
    r.offset = offset;
    r.nbytes = static_cast<uint64_t>(numel(sizes)) * elem_size(dtype);
    tensors.push_back(r);
    return static_cast<int64_t>(tensors.size() - 1);
  }

  static void append(std::vector<int64_t>& v, const Sizes& s) {
    v.insert(v.end(), s.begin(), s.end());
  }

  static void put(std::vector<uint8_t>& out, uint64_t offset, const void* data, size_t n) {
    if (n > 0) std::memcpy(out.data() + offset, data, n);
  }

  std::vector<uint32_t> inputs_, outputs_;
  uint32_t num_inputs_ = 0, num_outputs_ = 0;
  uint64_t arena_size_ = 0;
  Layout layout_;
};

/// Row-major strides of `sizes`.
inline std::vector<int64_t> strides_of(const std::vector<int64_t>& sizes) {
  std::vector<int64_t> s(sizes.size());
  int64_t acc = 1;
  for (size_t d = sizes.size(); d-- > 0;) {
    s[d] = acc;
    acc *= sizes[d];
  }
  return s;
}

}  // namespace kiln::engine::testing
