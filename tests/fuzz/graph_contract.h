// The promise graph.h makes about every Graph that read_blob returns, re-checked independently of
// the reader: every tensor id is valid, every strided access an op describes stays inside its
// tensor, and every extent stays inside the buffer it lives in. Used by the libFuzzer target (a
// violation is a crash) and by the g++ corpus replay test (a violation is a failure), so a blob
// that the reader wrongly accepts is caught the same way as one that crashes it.
//
// The arithmetic here is deliberately different from the reader's: 128-bit integers instead of
// overflow builtins, and a brute-force walk of small iteration spaces instead of corner analysis.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <initializer_list>
#include <string>
#include <variant>
#include <vector>

#include "format/graph.h"
#include "runtime/engine/strided.h"

namespace kiln::engine::fuzz {

__extension__ typedef __int128 i128;  // GCC and Clang; __extension__ keeps -Wpedantic quiet

/// Collects the first violation; later checks are skipped.
class ContractCheck {
 public:
  explicit ContractCheck(const Graph& g) : g_(g) {}

  bool ok() const { return problem_.empty(); }
  const std::string& problem() const { return problem_; }

  void violated(const char* what, long long a = 0, long long b = 0) {
    if (ok()) {
      char buffer[256];
      std::snprintf(buffer, sizeof(buffer), "op %zu: %s (%lld, %lld)", op_, what, a, b);
      problem_ = buffer;
    }
  }

  void at_op(size_t op) { op_ = op; }

  bool id(int64_t t, bool optional = false) {
    if (optional && t == kNoTensor) return true;
    if (t < 0 || static_cast<uint64_t>(t) >= g_.tensors.size()) {
      violated("tensor id out of range", t, static_cast<long long>(g_.tensors.size()));
      return false;
    }
    return true;
  }

  const Tensor& t(int64_t id) const { return g_.tensors[static_cast<size_t>(id)]; }

  void numel(int64_t id, i128 expected, const char* what) {
    if (ok() && this->id(id) && i128{t(id).numel} != expected) {
      violated(what, t(id).numel, static_cast<long long>(expected));
    }
  }

  // Every offset base + sum idx_d * strides[d] for idx in sizes lies in [0, numel(id)).
  void extent(int64_t id, uint32_t rank, const int64_t* sizes, i128 base, const int64_t* strides,
              const char* what) {
    if (!ok() || !this->id(id)) return;
    i128 lo = base, hi = base;
    for (uint32_t d = 0; d < rank; ++d) {
      if (sizes[d] <= 0) {
        if (sizes[d] < 0) violated("negative size", sizes[d]);
        return;
      }
      const i128 span = static_cast<i128>(sizes[d] - 1) * strides[d];  // |span| < 2^126
      if (__builtin_add_overflow(span < 0 ? lo : hi, span, span < 0 ? &lo : &hi)) {
        violated(what, d);
        return;
      }
    }
    if (lo < 0 || hi >= t(id).numel) {
      violated(what, static_cast<long long>(lo), static_cast<long long>(hi));
    }
  }

  // Only index_put writes State (in place), and it writes nothing else.
  void writable(int64_t id, bool writes_state) {
    if (!ok() || !this->id(id)) return;
    const blob::Storage s = t(id).storage;
    if (writes_state ? s != blob::Storage::kState
                     : s != blob::Storage::kArena && s != blob::Storage::kOutput) {
      violated("op writes a tensor its opcode may not write", id);
    }
  }

 private:
  const Graph& g_;
  size_t op_ = 0;
  std::string problem_;
};

inline i128 wide(uint64_t v) { return static_cast<i128>(v); }

// Products saturate at kHuge (far beyond any int64 element count) instead of overflowing, so the
// oracle stays defined even on a graph the reader should never have accepted.
constexpr i128 kHuge = static_cast<i128>(1) << 120;

inline i128 product(uint32_t rank, const int64_t* sizes) {
  i128 p = 1;
  for (uint32_t d = 0; d < rank; ++d) {
    if (__builtin_mul_overflow(p, static_cast<i128>(sizes[d]), &p) || p > kHuge || p < -kHuge) {
      return kHuge;
    }
  }
  return p;
}

inline i128 product(std::initializer_list<int64_t> v) {
  return product(static_cast<uint32_t>(v.size()), v.begin());
}

// Offsets visited by one operand's strided walk in row-major order; empty when the walk has more
// than `limit` elements (too many to enumerate on every fuzzer input).
inline std::vector<int64_t> walk(uint32_t rank, const int64_t* sizes, const int64_t* strides, int64_t limit) {
  std::vector<int64_t> offsets;
  if (product(rank, sizes) > limit) return offsets;
  int64_t idx[blob::kMaxRank] = {};
  const int64_t n = static_cast<int64_t>(product(rank, sizes));
  for (int64_t i = 0; i < n; ++i) {
    int64_t off = 0;
    for (uint32_t d = 0; d < rank; ++d) off += idx[d] * strides[d];
    offsets.push_back(off);
    for (uint32_t d = rank; d-- > 0;) {
      if (++idx[d] < sizes[d]) break;
      idx[d] = 0;
    }
  }
  return offsets;
}

// The host-side planning the executor does before launching copy / binary / where kernels
// (strided.h): collapse() must keep the element count and pair up exactly the same offsets of every
// operand, and widen() must describe the same bytes in wider words. Walks are compared in full
// when they are small enough to enumerate.
template <int kOperands>
void check_strided_plan(ContractCheck& c, uint32_t rank, const int64_t* sizes,
                        const int64_t* const (&strides)[kOperands]) {
  constexpr int64_t kWalkLimit = 4096;
  const StridedLoop<kOperands> loop = collapse<kOperands>(rank, sizes, strides);
  if (i128{loop.numel} != product(rank, sizes) || loop.rank < 0 ||
      static_cast<uint32_t>(loop.rank) > rank) {
    c.violated("collapse changed the element count or grew the rank", loop.numel, loop.rank);
    return;
  }
  if (loop.numel == 0) return;
  if (product(static_cast<uint32_t>(loop.rank), loop.sizes) != i128{loop.numel}) {
    c.violated("collapsed sizes do not multiply to numel", loop.numel);
    return;
  }
  for (int k = 0; k < kOperands && c.ok(); ++k) {
    const auto before = walk(rank, sizes, strides[k], kWalkLimit);
    const auto after = walk(static_cast<uint32_t>(loop.rank), loop.sizes,
                                       loop.strides[k], kWalkLimit);
    if (before != after) c.violated("collapse changed the offsets of operand", k);
  }
  for (int64_t factor : {2, 4, 8}) {
    StridedLoop<kOperands> wide = loop;
    const int64_t offsets[kOperands] = {};
    if (!widen(wide, offsets, factor)) continue;
    if (i128{wide.numel} * factor != i128{loop.numel}) {
      c.violated("widen lost elements", wide.numel, factor);
      return;
    }
    for (int k = 0; k < kOperands && c.ok(); ++k) {
      const auto narrow = walk(static_cast<uint32_t>(loop.rank), loop.sizes,
                                          loop.strides[k], kWalkLimit);
      auto words = walk(static_cast<uint32_t>(wide.rank), wide.sizes, wide.strides[k],
                                   kWalkLimit);
      if (narrow.empty() || words.empty()) continue;
      std::vector<int64_t> expanded;
      for (int64_t w : words) {
        for (int64_t e = 0; e < factor; ++e) expanded.push_back(w * factor + e);
      }
      if (expanded != narrow) c.violated("widen changed the offsets of operand", k, factor);
    }
  }
}

// The tensors each op reads (kNoTensor where an optional operand is absent): its input and
// optional-input tensor fields, from the op table (format/op_table.def).
#define KILN_READS_ROLE_kInput(m) ids.push_back(a.m);
#define KILN_READS_ROLE_kOptionalInput(m) ids.push_back(a.m);
#define KILN_READS_ROLE_kOutput(m)
#define KILN_READS_ROLE_kStateOutput(m)
#define KILN_READS_T(member, wire, role) KILN_READS_ROLE_##role(member)
#define KILN_READS_NONE(...)
#define KILN_READS_table(Name)                                                              \
  inline std::vector<int64_t> reads([[maybe_unused]] const Name##Args& a) {                 \
    std::vector<int64_t> ids;                                                               \
    KILN_FIELDS_##Name(KILN_READS_T, KILN_READS_NONE, KILN_READS_NONE, KILN_READS_NONE,     \
                       KILN_READS_NONE, KILN_READS_NONE)                                    \
    return ids;                                                                             \
  }
#define KILN_READS_custom(Name)
#define KILN_READS(Name, code, snake, how) KILN_READS_##how(Name)
KILN_OPCODES(KILN_READS)
#undef KILN_READS
#undef KILN_READS_custom
#undef KILN_READS_table
#undef KILN_READS_NONE
#undef KILN_READS_T
#undef KILN_READS_ROLE_kInput
#undef KILN_READS_ROLE_kOptionalInput
#undef KILN_READS_ROLE_kOutput
#undef KILN_READS_ROLE_kStateOutput
inline std::vector<int64_t> reads(const FusedElementwiseArgs& a) {
  return {a.inputs, a.inputs + (a.num_inputs < blob::kMaxFusedInputs ? a.num_inputs
                                                                     : blob::kMaxFusedInputs)};
}
inline std::vector<int64_t> reads(const ScatterArgs& a) {
  std::vector<int64_t> ids = {a.values};
  ids.insert(ids.end(), a.indices, a.indices + (a.num_indices < blob::kMaxScatterIndices
                                                    ? a.num_indices
                                                    : blob::kMaxScatterIndices));
  return ids;
}

/// Empty when `g` (returned by read_blob for the `size` bytes at `data`) keeps graph.h's promise;
/// otherwise one sentence naming the first violation.
///
/// The strided planning check runs only for graphs whose every buffer is below 2^62 bytes: the
/// executor allocates the arena and each argument's staging buffer before it plans a step, so a
/// larger graph never reaches planning (the allocation fails with MemoryAllocationFailed), and only
/// such sizes could overflow int64 inside collapse().
inline std::string check_graph_contract(const Graph& g, const uint8_t* data, size_t size) {
  ContractCheck c(g);
  constexpr uint64_t kPlannable = uint64_t{1} << 62;
  bool plannable = g.arena_size < kPlannable;

  // Tensors: sizes, byte counts and where the bytes live.
  if (g.weights_size > 0 &&
      (g.weights < data || g.weights > data + size ||
       g.weights_size > static_cast<uint64_t>(data + size - g.weights))) {
    c.violated("the weights section is not inside the blob");
  }
  for (size_t i = 0; i < g.tensors.size() && c.ok(); ++i) {
    const Tensor& t = g.tensors[i];
    if (t.rank > blob::kMaxRank) c.violated("rank above kMaxRank", static_cast<long long>(i), t.rank);
    i128 numel = 1;
    for (uint32_t d = 0; d < t.rank && d < blob::kMaxRank; ++d) {
      if (t.sizes[d] < 0) c.violated("negative size", static_cast<long long>(i), t.sizes[d]);
      numel *= t.sizes[d];
    }
    if (numel != t.numel || numel * wide(element_size(t.dtype)) != wide(t.nbytes)) {
      c.violated("numel or nbytes disagree with the sizes", static_cast<long long>(i));
    }
    const i128 end = wide(t.offset) + wide(t.nbytes);
    switch (t.storage) {
      case blob::Storage::kArena:
        if (t.nbytes > 0 && end > wide(g.arena_size)) {
          c.violated("arena tensor past arena_size", static_cast<long long>(i));
        }
        break;
      case blob::Storage::kWeight:
      case blob::Storage::kState:
        if (t.nbytes > 0 && end > wide(g.weights_size)) {
          c.violated("weight tensor past the weights section", static_cast<long long>(i));
        }
        break;
      case blob::Storage::kInput:
      case blob::Storage::kOutput: {
        const auto& args = t.storage == blob::Storage::kInput ? g.inputs : g.outputs;
        if (t.offset >= args.size()) {
          c.violated("argument index out of range", static_cast<long long>(i));
        } else if (!c.id(args[t.offset]) || t.nbytes > c.t(args[t.offset]).nbytes) {
          c.violated("argument view larger than its argument", static_cast<long long>(i));
        } else if (c.t(args[t.offset]).nbytes >= kPlannable) {
          plannable = false;
        }
        break;
      }
      default: c.violated("unknown storage", static_cast<long long>(i));
    }
  }
  for (size_t k = 0; k < g.inputs.size() && c.ok(); ++k) {
    if (c.id(g.inputs[k]) && (c.t(g.inputs[k]).storage != blob::Storage::kInput ||
                              c.t(g.inputs[k]).offset != k)) {
      c.violated("input table entry is not its argument", static_cast<long long>(k));
    }
  }
  for (size_t k = 0; k < g.outputs.size() && c.ok(); ++k) {
    if (c.id(g.outputs[k]) && (c.t(g.outputs[k]).storage != blob::Storage::kOutput ||
                               c.t(g.outputs[k]).offset != k)) {
      c.violated("output table entry is not its argument", static_cast<long long>(k));
    }
  }

  std::vector<bool> written(g.outputs.size(), false);
  for (size_t i = 0; i < g.ops.size() && c.ok(); ++i) {
    c.at_op(i);
    const Op& op = g.ops[i];
    if (op.opcode != static_cast<blob::Opcode>(op.args.index() + 1)) {
      c.violated("opcode does not match its decoded arguments",
                 static_cast<long long>(op.opcode), static_cast<long long>(op.args.index()));
      break;
    }
    const int64_t out = std::visit([](const auto& a) { return a.out; }, op.args);
    const blob::OpDesc& desc = *blob::find_op(static_cast<uint32_t>(op.opcode));
    c.writable(out, desc.fields[blob::field_index(desc.fields, desc.num_fields, "out")].role ==
                        blob::Role::kStateOutput);
    if (c.ok() && c.t(out).storage == blob::Storage::kOutput) written[c.t(out).offset] = true;

    if (const auto* a = std::get_if<CopyArgs>(&op.args)) {
      if (a->rank > blob::kMaxRank) { c.violated("copy rank", a->rank); break; }
      c.extent(a->x, a->rank, a->sizes, a->in_offset, a->in_strides, "copy reads x out of range");
      c.extent(a->out, a->rank, a->sizes, a->out_offset, a->out_strides,
               "copy writes out of range");
      const int64_t* strides[2] = {a->out_strides, a->in_strides};
      if (c.ok() && plannable) check_strided_plan<2>(c, a->rank, a->sizes, strides);
    } else if (const auto* a = std::get_if<BinaryArgs>(&op.args)) {
      if (a->rank > blob::kMaxRank) { c.violated("binary rank", a->rank); break; }
      c.numel(a->out, product(a->rank, a->sizes), "binary out numel");
      c.extent(a->a, a->rank, a->sizes, 0, a->a_strides, "binary reads a out of range");
      if (c.id(a->b, true) && a->b != kNoTensor) {
        c.extent(a->b, a->rank, a->sizes, 0, a->b_strides, "binary reads b out of range");
      }
      int64_t out_strides[blob::kMaxRank];
      const int64_t zero[blob::kMaxRank] = {};
      contiguous_strides(a->rank, a->sizes, out_strides);
      const int64_t* strides[3] = {out_strides, a->a_strides,
                                   a->b == kNoTensor ? zero : a->b_strides};
      if (c.ok() && plannable) check_strided_plan<3>(c, a->rank, a->sizes, strides);
    } else if (const auto* a = std::get_if<UnaryArgs>(&op.args)) {
      if (c.id(a->x)) c.numel(a->out, c.t(a->x).numel, "unary out numel");
    } else if (const auto* a = std::get_if<WhereArgs>(&op.args)) {
      if (a->rank > blob::kMaxRank) { c.violated("where rank", a->rank); break; }
      c.numel(a->out, product(a->rank, a->sizes), "where out numel");
      c.extent(a->cond, a->rank, a->sizes, 0, a->cond_strides, "where reads cond out of range");
      c.extent(a->a, a->rank, a->sizes, 0, a->a_strides, "where reads a out of range");
      c.extent(a->b, a->rank, a->sizes, 0, a->b_strides, "where reads b out of range");
      int64_t out_strides[blob::kMaxRank];
      contiguous_strides(a->rank, a->sizes, out_strides);
      const int64_t* strides[4] = {out_strides, a->cond_strides, a->a_strides, a->b_strides};
      if (c.ok() && plannable) check_strided_plan<4>(c, a->rank, a->sizes, strides);
    } else if (const auto* a = std::get_if<FusedElementwiseArgs>(&op.args)) {
      if (a->rank > blob::kMaxRank || a->num_inputs > blob::kMaxFusedInputs ||
          a->num_instrs < 1 || a->num_instrs > blob::kMaxFusedInstrs) {
        c.violated("fused rank, input or instruction count", a->rank, a->num_inputs);
        break;
      }
      c.numel(a->out, product(a->rank, a->sizes), "fused out numel");
      for (uint32_t k = 0; k < a->num_inputs && c.ok(); ++k) {
        c.extent(a->inputs[k], a->rank, a->sizes, 0, a->strides[k],
                 "fused reads an input out of range");
      }
      for (uint32_t j = 0; j < a->num_instrs && c.ok(); ++j) {
        const FusedInstr& in = a->instrs[j];
        const int64_t defined = int64_t{a->num_inputs} + j;
        const int needed = in.form == blob::FusedForm::kUnary ? 1
                           : in.form == blob::FusedForm::kBinary ? 2 : 3;
        for (int s = 0; s < 3; ++s) {
          const bool absent_ok = s >= needed || (in.form == blob::FusedForm::kBinary && s == 1);
          const bool written = s < needed && in.src[s] >= 0 && in.src[s] < defined;
          if (!(in.src[s] == -1 && absent_ok) && !written) {
            c.violated("fused instruction reads a register not yet written", j, in.src[s]);
          }
        }
      }
      int64_t out_strides[blob::kMaxRank];
      contiguous_strides(a->rank, a->sizes, out_strides);
      const int64_t zero[blob::kMaxRank] = {};
      const int64_t* strides[1 + blob::kMaxFusedInputs];
      strides[0] = out_strides;
      for (uint32_t k = 0; k < blob::kMaxFusedInputs; ++k) {
        strides[1 + k] = k < a->num_inputs ? a->strides[k] : zero;
      }
      if (c.ok() && plannable) {
        check_strided_plan<1 + blob::kMaxFusedInputs>(c, a->rank, a->sizes, strides);
      }
    } else if (const auto* a = std::get_if<MatmulArgs>(&op.args)) {
      c.numel(a->out, product({a->batch, a->m, a->n}), "matmul out numel");
      const i128 a_matrix = product({a->m, a->k}), b_matrix = product({a->k, a->n});
      if (a_matrix > INT64_MAX || b_matrix > INT64_MAX) {
        c.violated("matmul matrix size overflows");
        break;
      }
      const int64_t one = 1;
      const int64_t as[2] = {a->batch, static_cast<int64_t>(a_matrix)};
      const int64_t bs[2] = {a->batch, static_cast<int64_t>(b_matrix)};
      const int64_t ast[2] = {a->a_batch_stride, one}, bst[2] = {a->b_batch_stride, one};
      c.extent(a->a, 2, as, 0, ast, "matmul reads a out of range");
      c.extent(a->b, 2, bs, 0, bst, "matmul reads b out of range");
      if (c.id(a->bias, true) && a->bias != kNoTensor) {
        const int64_t s[3] = {a->batch, a->m, a->n};
        const int64_t st[3] = {0, a->bias_row_stride, a->bias_col_stride};
        c.extent(a->bias, 3, s, 0, st, "matmul reads bias out of range");
      }
      if (c.id(a->residual, true) && a->residual != kNoTensor) {
        c.numel(a->residual, product({a->batch, a->m, a->n}), "matmul residual numel");
      }
    } else if (const auto* a = std::get_if<SoftmaxArgs>(&op.args)) {
      c.numel(a->x, product({a->outer, a->dim, a->inner}), "softmax x numel");
      c.numel(a->out, product({a->outer, a->dim, a->inner}), "softmax out numel");
    } else if (const auto* a = std::get_if<LayerNormArgs>(&op.args)) {
      c.numel(a->x, product({a->rows, a->cols}), "layer_norm x numel");
      c.numel(a->out, product({a->rows, a->cols}), "layer_norm out numel");
      if (c.id(a->weight, true) && a->weight != kNoTensor) c.numel(a->weight, a->cols, "weight");
      if (c.id(a->bias, true) && a->bias != kNoTensor) c.numel(a->bias, a->cols, "bias");
    } else if (const auto* a = std::get_if<ReduceArgs>(&op.args)) {
      c.numel(a->x, product({a->outer, a->reduce, a->inner}), "reduce x numel");
      c.numel(a->out, product({a->outer, a->inner}), "reduce out numel");
    } else if (const auto* a = std::get_if<EmbeddingArgs>(&op.args)) {
      c.numel(a->weight, product({a->vocab, a->dim}), "embedding weight numel");
      c.numel(a->indices, a->num_indices, "embedding indices numel");
      c.numel(a->out, product({a->num_indices, a->dim}), "embedding out numel");
      if (c.ok() && c.t(a->indices).dtype != blob::DType::kInt64 &&
          c.t(a->indices).dtype != blob::DType::kInt32) {
        c.violated("embedding indices are not integers");
      }
    } else if (const auto* a = std::get_if<Conv2dArgs>(&op.args)) {
      if (a->groups <= 0 || a->stride_h <= 0 || a->stride_w <= 0 || a->c_in % a->groups != 0 ||
          a->c_out % a->groups != 0) {
        c.violated("conv2d groups or strides");
        break;
      }
      c.numel(a->x, product({a->n, a->c_in, a->h, a->w}), "conv2d x numel");
      c.numel(a->weight, product({a->c_out, a->c_in / a->groups, a->kh, a->kw}), "conv2d weight");
      c.numel(a->out, product({a->n, a->c_out, a->h_out, a->w_out}), "conv2d out numel");
      if (c.id(a->bias, true) && a->bias != kNoTensor) c.numel(a->bias, a->c_out, "conv2d bias");
      const i128 h = i128{a->h} + 2 * i128{a->pad_h} - i128{a->dil_h} * (i128{a->kh} - 1) - 1;
      const i128 w = i128{a->w} + 2 * i128{a->pad_w} - i128{a->dil_w} * (i128{a->kw} - 1) - 1;
      if (h < 0 || w < 0 || h / a->stride_h + 1 != a->h_out || w / a->stride_w + 1 != a->w_out) {
        c.violated("conv2d output size", a->h_out, a->w_out);
      }
    } else if (const auto* a = std::get_if<IndexPutArgs>(&op.args)) {
      c.numel(a->out, product({a->outer, a->dim_size, a->inner}), "index_put out numel");
      c.numel(a->values, product({a->outer, a->num_positions, a->inner}), "index_put values numel");
      c.numel(a->positions, product({a->num_positions}), "index_put positions numel");
    } else if (const auto* a = std::get_if<ScatterArgs>(&op.args)) {
      if (a->rank > blob::kMaxRank || a->num_indices < 1 ||
          a->num_indices > blob::kMaxScatterIndices) {
        c.violated("scatter rank or index count", a->rank, a->num_indices);
        break;
      }
      c.extent(a->values, a->rank, a->sizes, 0, a->values_strides,
               "scatter reads values out of range");
      int64_t sizes[blob::kMaxRank + blob::kMaxScatterIndices];
      int64_t strides[blob::kMaxRank + blob::kMaxScatterIndices];
      for (uint32_t d = 0; d < a->rank; ++d) {
        sizes[d] = a->sizes[d];
        strides[d] = a->out_strides[d];
      }
      for (uint32_t k = 0; k < a->num_indices && c.ok(); ++k) {
        c.extent(a->indices[k], a->rank, a->sizes, 0, a->index_strides[k],
                 "scatter reads an index out of range");
        if (c.ok() && c.t(a->indices[k]).dtype != blob::DType::kInt64 &&
            c.t(a->indices[k]).dtype != blob::DType::kInt32) {
          c.violated("scatter indices are not integers");
        }
        sizes[a->rank + k] = a->dim_sizes[k];
        strides[a->rank + k] = a->index_out_strides[k];
      }
      c.extent(a->out, a->rank + a->num_indices, sizes, 0, strides, "scatter writes out of range");
    } else if (const auto* a = std::get_if<Pool2dArgs>(&op.args)) {
      c.numel(a->x, product({a->n, a->c, a->h, a->w}), "pool2d x numel");
      c.numel(a->out, product({a->n, a->c, a->h_out, a->w_out}), "pool2d out numel");
      if (a->stride_h <= 0 || a->stride_w <= 0 || a->h_out < 1 || a->w_out < 1) {
        c.violated("pool2d strides or output size", a->h_out, a->w_out);
      }
    }
    // Ops never write what they read: no read tensor may share bytes with the output.
    if (c.ok()) {
      const Tensor& o = c.t(out);
      std::visit(
          [&](const auto& a) {
            for (int64_t r : reads(a)) {
              if (r == kNoTensor || !c.id(r)) continue;
              const Tensor& in = c.t(r);
              if (r == out) {
                c.violated("op reads its own output", r);
              } else if (o.nbytes > 0 && in.nbytes > 0 && o.storage == in.storage) {
                const bool same_argument = (o.storage == blob::Storage::kInput ||
                                            o.storage == blob::Storage::kOutput) &&
                                           o.offset == in.offset;
                const bool bytes_overlap =
                    (o.storage == blob::Storage::kArena || o.storage == blob::Storage::kWeight ||
                     o.storage == blob::Storage::kState) &&
                    wide(o.offset) < wide(in.offset) + wide(in.nbytes) &&
                    wide(in.offset) < wide(o.offset) + wide(o.nbytes);
                if (same_argument || bytes_overlap) c.violated("output overlaps an input", r, out);
              }
            }
          },
          op.args);
    }
  }
  for (size_t k = 0; k < g.outputs.size() && c.ok(); ++k) {
    if (!written[k] && c.id(g.outputs[k]) && c.t(g.outputs[k]).nbytes > 0) {
      c.violated("an output is never written", static_cast<long long>(k));
    }
  }
  return c.problem();
}

}  // namespace kiln::engine::fuzz
