// The channels-last pass: conv nets keep their activations NHWC in memory between convolutions.
//
// Every kConv2d becomes channels_last (its weight permuted to KRSC); a kPool2d whose input is NHWC
// does too. The layout then spreads forward through the ops that can follow it without a copy:
//   - kBinary / kWhere with a 4-D result reading an NHWC tensor of that shape: the iteration
//     order becomes N, H, W, C (each operand's strides permuted), so the result is NHWC;
//   - kUnary of an NHWC tensor (elementwise and contiguous: the same layout in, the same out);
//   - kCopy of an NHWC tensor: its read strides are rewritten (a copy is fully strided);
//   - kReduce over H * W of [N, C, H, W] (global average pooling) becomes [N, H * W, C].
// Every other reader of an NHWC tensor (a view of another shape, a matmul, softmax, a delegate
// output, ...) reads one NCHW copy of it, made right after its producer; a convolution's input or
// residual that is not NHWC (a delegate input, a matmul result) gets one NHWC copy before it.
// Tensors' logical shapes never change: only their memory order does.
#include <algorithm>
#include <optional>
#include <unordered_map>
#include <unordered_set>

#include "builder/src/passes.h"

namespace kiln::builder {
namespace {

using Shape = std::vector<int64_t>;

Shape nchw_strides(const Shape& s) { return {s[1] * s[2] * s[3], s[2] * s[3], s[3], 1}; }
// Strides, per logical N, C, H, W index, of an [N, C, H, W] tensor stored NHWC.
Shape nhwc_strides(const Shape& s) { return {s[2] * s[3] * s[1], 1, s[3] * s[1], s[1]}; }

// The per-logical-dimension strides of an operand that an elementwise op reads with (possibly
// coalesced) `sizes` / `strides` over a result of logical shape `shape`; nullopt when the
// coalesced dimensions do not split back into the logical ones.
std::optional<Shape> expand_strides(const Shape& shape, const Shape& sizes, const Shape& strides) {
  Shape out(shape.size(), 0);
  int64_t k = int64_t(shape.size()) - 1;
  for (size_t d = sizes.size(); d-- > 0;) {
    int64_t prod = 1;
    while (prod < sizes[d]) {
      if (k < 0) return std::nullopt;
      if (shape[size_t(k)] != 1) {
        out[size_t(k)] = strides[d] * prod;
        prod *= shape[size_t(k)];
      }
      --k;
    }
    if (prod != sizes[d]) return std::nullopt;
  }
  for (; k >= 0; --k) {
    if (shape[size_t(k)] != 1) return std::nullopt;
  }
  return out;
}

bool is_dense(const Shape& shape, const Shape& strides) {
  const Shape dense = nchw_strides(shape);
  for (size_t k = 0; k < 4; ++k) {
    if (shape[k] != 1 && strides[k] != dense[k]) return false;
  }
  return true;
}

// Rewrites a copy's read of an [N, C, H, W] NCHW layout (in_offset, sizes, in_strides,
// out_strides) into the same read of its NHWC layout: each copy dimension must step along one
// logical dimension without carrying into the next, or cover a run of logical dimensions exactly
// with the innermost one's stride (then it is split into them). False: not expressible.
bool rewrite_copy_read(Op& op, const Shape& shape) {
  const Shape from = nchw_strides(shape), to = nhwc_strides(shape);
  int64_t offset = op.at("in_offset");
  if (offset < 0) return false;
  int64_t new_offset = 0;
  for (size_t k = 0; k < 4; ++k) {
    new_offset += offset / from[k] * to[k];
    offset %= from[k];
  }
  Shape sizes, in_strides, out_strides;
  const Shape& s = op.list("sizes");
  const Shape& is = op.list("in_strides");
  const Shape& os = op.list("out_strides");
  for (size_t d = 0; d < s.size(); ++d) {
    if (s[d] == 1 || is[d] == 0) {
      sizes.push_back(s[d]);
      in_strides.push_back(0);
      out_strides.push_back(os[d]);
      continue;
    }
    bool mapped = false;
    for (size_t k = 0; k < 4 && !mapped; ++k) {
      if (is[d] <= 0 || is[d] % from[k] != 0) continue;
      const int64_t step = is[d] / from[k];
      if (step * (s[d] - 1) < shape[k]) {
        sizes.push_back(s[d]);
        in_strides.push_back(step * to[k]);
        out_strides.push_back(os[d]);
        mapped = true;
      }
    }
    // A run k0..k1 of logical dimensions, contiguous in NCHW and covered exactly.
    for (size_t k1 = 0; k1 < 4 && !mapped; ++k1) {
      if (is[d] != from[k1]) continue;
      int64_t prod = 1;
      size_t k0 = k1 + 1;
      while (k0 > 0 && prod < s[d]) prod *= shape[--k0];
      if (prod != s[d]) continue;
      int64_t inner = 1;
      std::vector<int64_t> split_sizes, split_in, split_out;
      for (size_t k = k1 + 1; k-- > k0;) {
        split_sizes.insert(split_sizes.begin(), shape[k]);
        split_in.insert(split_in.begin(), to[k]);
        split_out.insert(split_out.begin(), os[d] * inner);
        inner *= shape[k];
      }
      sizes.insert(sizes.end(), split_sizes.begin(), split_sizes.end());
      in_strides.insert(in_strides.end(), split_in.begin(), split_in.end());
      out_strides.insert(out_strides.end(), split_out.begin(), split_out.end());
      mapped = true;
    }
    if (!mapped) return false;
  }
  if (sizes.size() > blob::kMaxRank) return false;
  op.at("rank") = int64_t(sizes.size());
  op.list("sizes") = sizes;
  op.list("in_strides") = in_strides;
  op.list("out_strides") = out_strides;
  op.at("in_offset") = new_offset;
  return true;
}

// A kCopy of 4-D `x` (logical [N, C, H, W]) into `out`, reading `in_strides` and writing
// `out_strides` per logical dimension.
Op layout_copy(const Tensor& x, int64_t out, const Shape& in_strides, const Shape& out_strides) {
  return make_op(blob::Opcode::kCopy,
                 {{x.id}, {out}, {4}, x.shape, {0}, in_strides, {0}, out_strides});
}

class Layout {
 public:
  explicit Layout(Graph& g) : g_(g) {}

  void run() {
    // Every view names its root directly: a view of a view (a 1-D convolution's [N, C, 1, L] view
    // of a fused activation's [N, C, L] result, itself a view of the convolution before) must
    // keep reading the root when an intermediate view is redirected to an NCHW copy below.
    for (Tensor& t : g_.tensors) {
      if (t.alias_of != kNoTensor) t.alias_of = g_.root(t.alias_of);
    }
    std::vector<Op> ops = std::move(g_.ops);
    g_.ops.clear();
    std::vector<std::vector<Op>> before(ops.size());
    for (size_t i = 0; i < ops.size(); ++i) visit(ops[i], before[i]);
    // NCHW copies of the NHWC tensors other readers need, right after each one's producer.
    std::vector<Op> result;
    for (size_t i = 0; i < ops.size(); ++i) {
      for (Op& op : before[i]) result.push_back(std::move(op));
      const int64_t root = g_.root(ops[i].out());
      result.push_back(std::move(ops[i]));
      auto it = nchw_copy_.find(root);
      if (it != nchw_copy_.end() && !emitted_.count(root)) {
        emitted_.insert(root);
        const Tensor& t = g_.tensors[size_t(root)];
        result.push_back(layout_copy(t, it->second, nhwc_strides(t.shape), nchw_strides(t.shape)));
      }
    }
    g_.ops = std::move(result);
    // Views of another shape, and delegate outputs, see the NCHW copy.
    const size_t count = g_.tensors.size();   // nchw() adds tensors: index, never iterate
    for (size_t i = 0; i < count; ++i) {
      if (g_.tensors[i].alias_of == kNoTensor) continue;
      const int64_t root = g_.root(int64_t(i));
      if (nhwc_.count(root) && g_.tensors[i].shape != g_.tensors[size_t(root)].shape) {
        const int64_t copy = nchw(root);
        g_.tensors[i].alias_of = copy;
      }
    }
    for (int64_t& out : g_.outputs) {
      if (nhwc_.count(g_.root(out))) out = nchw(g_.root(out));
    }
    // (An output's NCHW copy is made by nchw() above after the op list was assembled: place it.)
    place_late_copies();
    merge_entry_casts();
  }

 private:
  // Whether reading tensor `t` reads NHWC memory in its own logical shape (t is an NHWC tensor,
  // or a same-shaped view of one, such as a fused activation's result).
  bool nhwc_read(int64_t t) const {
    const int64_t root = g_.root(t);
    return nhwc_.count(root) && g_.tensors[size_t(t)].shape == g_.tensors[size_t(root)].shape;
  }

  // The NCHW copy of NHWC root `root` (made once).
  int64_t nchw(int64_t root) {
    auto it = nchw_copy_.find(root);
    if (it != nchw_copy_.end()) return it->second;
    const Tensor t = g_.tensors[size_t(root)];   // a copy: add_tensor may move the tensors
    const int64_t copy = g_.add_tensor(t.dtype, t.shape, t.name + "_nchw");
    nchw_copy_[root] = copy;
    return copy;
  }

  // Tensor id `t` as an operand of an op that wants NCHW: its NCHW copy when it is NHWC.
  int64_t as_nchw(int64_t t) { return nhwc_read(t) ? nchw(g_.root(t)) : t; }

  // An NHWC copy of `t` (logical [N, C, H, W]) made before the current op; one per tensor.
  int64_t as_nhwc(int64_t t, std::vector<Op>& before) {
    if (nhwc_read(t)) return t;
    auto it = nhwc_copy_.find(t);
    if (it != nhwc_copy_.end()) return it->second;
    const Tensor x = g_.tensors[size_t(t)];
    const int64_t copy = g_.add_tensor(x.dtype, x.shape, x.name + "_nhwc");
    Op op = layout_copy(x, copy, nchw_strides(x.shape), nhwc_strides(x.shape));
    op.at("x") = t;
    before.push_back(std::move(op));
    nhwc_copy_[t] = copy;
    nhwc_.insert(copy);
    return copy;
  }

  // `t` as a view of `like`'s logical shape when its own differs (a 1-D convolution's [N, C, L]
  // residual for its [N, C, 1, L] result): the layout copies index 4-D shapes.
  int64_t logical_view(int64_t t, int64_t like) {
    const Shape shape = g_.tensors[size_t(like)].shape;
    if (g_.tensors[size_t(t)].shape == shape) return t;
    const Tensor src = g_.tensors[size_t(t)];   // a copy: add_tensor may move the tensors
    const int64_t view = g_.add_tensor(src.dtype, shape, src.name + "_view");
    g_.tensors[size_t(view)].alias_of = g_.root(t);
    return view;
  }

  // The conv's weight [K, C / groups, kH, kW] in KRSC order: a permuted copy of a weight's bytes,
  // or a permuting kCopy before the op for a computed one.
  int64_t krsc_weight(int64_t w, std::vector<Op>& before) {
    auto it = krsc_.find(w);
    if (it != krsc_.end()) return it->second;
    const Tensor src = g_.tensors[size_t(w)];
    const Shape& s = src.shape;
    const int64_t id = g_.add_tensor(src.dtype, {s[0], s[2], s[3], s[1]}, src.name + "_krsc");
    Tensor& t = g_.tensors[size_t(id)];
    if (src.storage == blob::Storage::kWeight && src.has_data && src.alias_of == kNoTensor) {
      const size_t elem = element_size(src.dtype);
      t.storage = blob::Storage::kWeight;
      t.has_data = true;
      t.data.resize(src.data.size());
      int64_t i = 0;
      for (int64_t k = 0; k < s[0]; ++k)
        for (int64_t c = 0; c < s[1]; ++c)
          for (int64_t r = 0; r < s[2]; ++r)
            for (int64_t q = 0; q < s[3]; ++q, ++i) {
              const int64_t j = ((k * s[2] + r) * s[3] + q) * s[1] + c;
              std::copy_n(src.data.begin() + i * int64_t(elem), elem,
                          t.data.begin() + j * int64_t(elem));
            }
    } else {
      before.push_back(layout_copy(src, id, nchw_strides(s), nhwc_strides(s)));
    }
    krsc_[w] = id;
    return id;
  }

  void visit(Op& op, std::vector<Op>& before) {
    switch (op.opcode) {
      case blob::Opcode::kConv2d: {
        op.at("x") = as_nhwc(op.at("x"), before);
        if (op.at("residual") != kNoTensor) {
          op.at("residual") = as_nhwc(logical_view(op.at("residual"), op.out()), before);
        }
        op.at("weight") = krsc_weight(op.at("weight"), before);
        op.at("channels_last") = 1;
        nhwc_.insert(g_.root(op.out()));
        return;
      }
      case blob::Opcode::kPool2d:
        if (nhwc_read(op.at("x"))) {
          op.at("channels_last") = 1;
          nhwc_.insert(g_.root(op.out()));
          return;
        }
        break;
      case blob::Opcode::kUnary:
        if (nhwc_read(op.at("x")) &&
            g_.tensors[size_t(op.out())].shape == g_.tensors[size_t(op.at("x"))].shape) {
          nhwc_.insert(g_.root(op.out()));
          return;
        }
        break;
      case blob::Opcode::kBinary:
        if (elementwise(op, {{"a", "a_strides"}, {"b", "b_strides"}})) return;
        break;
      case blob::Opcode::kWhere:
        if (elementwise(op, {{"cond", "cond_strides"}, {"a", "a_strides"}, {"b", "b_strides"}})) {
          return;
        }
        break;
      case blob::Opcode::kCopy:
        if (nhwc_read(op.at("x")) && g_.tensors[size_t(op.at("x"))].shape.size() == 4) {
          Op rewritten = op;
          if (rewrite_copy_read(rewritten, g_.tensors[size_t(op.at("x"))].shape)) {
            op = std::move(rewritten);
            return;
          }
        }
        break;
      case blob::Opcode::kReduce:
        if (nhwc_read(op.at("x"))) {
          const Shape& s = g_.tensors[size_t(op.at("x"))].shape;
          // [N, H*W, C]: the reduce kernel splits a long axis over column tiles and chunks
          // (efficientnet's 112x112 squeeze-excitation pools over 32 channels included).
          if (s.size() == 4 && op.at("outer") == s[0] * s[1] && op.at("reduce") == s[2] * s[3] &&
              op.at("inner") == 1) {
            op.at("outer") = s[0];
            op.at("inner") = s[1];
            return;
          }
        }
        break;
      default: break;
    }
    // Anything else reads NCHW.
    op.for_each_tensor([&](int64_t& id) {
      if (id >= 0 && id != op.out()) id = as_nchw(id);
    });
  }

  // kBinary / kWhere: with a 4-D result and an NHWC operand of its shape read densely, iterate
  // N, H, W, C (the result NHWC). False when the op does not qualify (nothing changed).
  bool elementwise(Op& op, std::vector<std::pair<const char*, const char*>> operands) {
    const Tensor& out = g_.tensors[size_t(op.out())];
    if (out.shape.size() != 4 || out.alias_of != kNoTensor) return false;
    bool any = false;
    std::vector<Shape> expanded;
    for (auto [name, strides] : operands) {
      const int64_t t = op.at(name);
      std::optional<Shape> e = expand_strides(out.shape, op.list("sizes"), op.list(strides));
      if (!e) return false;
      if (t != kNoTensor && nhwc_read(t)) {
        if (g_.tensors[size_t(t)].shape != out.shape || !is_dense(out.shape, *e)) return false;
        *e = nhwc_strides(out.shape);
        any = true;
      }
      expanded.push_back(*e);
    }
    if (!any) return false;
    const Shape& s = out.shape;
    op.at("rank") = 4;
    op.list("sizes") = {s[0], s[2], s[3], s[1]};
    for (size_t i = 0; i < operands.size(); ++i) {
      const Shape& e = expanded[i];
      op.list(operands[i].second) = {e[0], e[2], e[3], e[1]};
    }
    nhwc_.insert(op.out());
    return true;
  }

  // NCHW copies asked for only after the op list was built (outputs): after their producer.
  void place_late_copies() {
    for (auto& [root, copy] : nchw_copy_) {
      if (emitted_.count(root)) continue;
      size_t at = 0;
      for (size_t i = 0; i < g_.ops.size(); ++i) {
        if (g_.root(g_.ops[i].out()) == root) at = i + 1;
      }
      const Tensor& t = g_.tensors[size_t(root)];
      g_.ops.insert(g_.ops.begin() + std::ptrdiff_t(at),
                    layout_copy(t, copy, nhwc_strides(t.shape), nchw_strides(t.shape)));
      emitted_.insert(root);
    }
  }

  // A layout copy into NHWC whose source is only a flat dense cast copy of another tensor (the
  // bf16 / fp16 cast of a delegate input) reads that tensor instead: one copy casts and permutes
  // (with the same rounding), and the cast goes away.
  void merge_entry_casts() {
    for (const auto& [src, copy] : nhwc_copy_) {
      (void)copy;
      const int64_t t = src;
      if (g_.tensors[size_t(t)].alias_of != kNoTensor || g_.tensors[size_t(t)].shape.size() != 4) {
        continue;
      }
      const std::vector<const Op*> rs = readers(g_, t);
      if (rs.size() != 1 || std::find(g_.outputs.begin(), g_.outputs.end(), t) != g_.outputs.end()) {
        continue;
      }
      size_t writer = g_.ops.size();
      size_t writers = 0;
      for (size_t i = 0; i < g_.ops.size(); ++i) {
        if (g_.root(g_.ops[i].out()) == t) writer = i, ++writers;
      }
      if (writers != 1) continue;
      const Op& a = g_.ops[writer];
      const int64_t n = g_.tensors[size_t(t)].numel();
      if (a.opcode != blob::Opcode::kCopy || a.out() != t || a.at("rank") != 1 ||
          a.list("sizes") != std::vector<int64_t>{n} || a.at("in_offset") != 0 ||
          a.list("in_strides") != std::vector<int64_t>{1} || a.at("out_offset") != 0 ||
          a.list("out_strides") != std::vector<int64_t>{1} ||
          g_.tensors[size_t(a.at("x"))].numel() != n) {
        continue;
      }
      const int64_t source = a.at("x");
      for (Op& op : g_.ops) {
        if (&op != &a && op.opcode == blob::Opcode::kCopy && op.at("x") == t) op.at("x") = source;
      }
      g_.ops.erase(g_.ops.begin() + std::ptrdiff_t(writer));
    }
  }

  Graph& g_;
  std::unordered_set<int64_t> nhwc_;                   // roots stored NHWC
  std::unordered_map<int64_t, int64_t> nchw_copy_;     // NHWC root -> its NCHW copy
  std::unordered_map<int64_t, int64_t> nhwc_copy_;     // tensor -> its NHWC copy
  std::unordered_map<int64_t, int64_t> krsc_;          // conv weight -> its KRSC form
  std::unordered_set<int64_t> emitted_;
};

}  // namespace

void convert_to_channels_last(Graph& g) {
  // Depthwise convolutions run on Kiln's own kernel in either layout, and the dense ones fuse
  // their epilogues only NHWC (cuDNN's graph), so every conv net goes channels-last.
  for (const Op& op : g.ops) {
    if (op.opcode == blob::Opcode::kConv2d) {
      Layout(g).run();
      return;
    }
  }
}

}  // namespace kiln::builder
