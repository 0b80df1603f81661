// RMSNorm fusion: LLaMA-style decoders (HF's LlamaRMSNorm, Qwen, Mistral, Gemma) write their norm
// as x * rsqrt(mean(x^2, -1) + eps) * weight, five or six ops that each make a pass over the
// activations. kLayerNorm with rms set computes it in one pass with the row in registers.
#include <unordered_set>

#include "builder/src/passes.h"

namespace kiln::builder {
namespace {

// Whether `strides` read one value per column: every dimension but the last broadcast.
bool per_column(const std::vector<int64_t>& sizes, const std::vector<int64_t>& strides,
                int64_t cols) {
  if (sizes.empty() || sizes.back() != cols || (cols != 1 && strides.back() != 1)) return false;
  for (size_t d = 0; d + 1 < sizes.size(); ++d) {
    if (sizes[d] != 1 && strides[d] != 0) return false;
  }
  return true;
}

// The weight of y * w (either order), w a floating tensor of `cols` values read per column;
// kNoTensor when `op` is not that.
int64_t column_weight(const Graph& g, const Op& op, int64_t y, int64_t cols) {
  if (op.opcode != blob::Opcode::kBinary || op.at("kind") != int64_t(blob::BinaryKind::kMul) ||
      op.at("b") == kNoTensor) {
    return kNoTensor;
  }
  const bool y_is_a = op.at("a") == y, y_is_b = op.at("b") == y;
  if (y_is_a == y_is_b) return kNoTensor;
  const int64_t w = op.at(y_is_a ? "b" : "a");
  const Tensor& wt = g.tensors[size_t(w)];
  const auto& sizes = op.list("sizes");
  if (!is_floating(wt.dtype) || wt.numel() != cols ||
      g.tensors[size_t(op.out())].numel() != g.tensors[size_t(y)].numel() ||
      !dense_strides(sizes, op.list(y_is_a ? "a_strides" : "b_strides")) ||
      !per_column(sizes, op.list(y_is_a ? "b_strides" : "a_strides"), cols)) {
    return kNoTensor;
  }
  return w;
}

class RmsMatcher {
 public:
  explicit RmsMatcher(const Graph& g) : g_(g) {
    for (int64_t t : g.outputs) output_roots_.insert(g.root(t));
  }

  // The chain that starts at op `pow` (a kUnary x^2), as the kLayerNorm that replaces it, and
  // the ops it covers; false when the ops there are not that chain.
  bool match(size_t pow, Op* replacement, std::vector<size_t>* covered) const {
    const Op& p = g_.ops[pow];
    if (!is_unary(p, blob::UnaryKind::kPowScalar) || p.real("p0") != 2.0) return false;
    const int64_t x = p.at("x");
    const Tensor& xt = g_.tensors[size_t(x)];
    if (xt.shape.empty() || xt.shape.back() == 0 || !is_floating(xt.dtype)) return false;
    const int64_t cols = xt.shape.back(), rows = xt.numel() / cols;

    const Op* mean = sole_reader(p);
    if (mean == nullptr || mean->opcode != blob::Opcode::kReduce ||
        mean->at("kind") != int64_t(blob::ReduceKind::kMean) || mean->at("inner") != 1 ||
        mean->at("reduce") != cols || mean->at("outer") != rows) {
      return false;
    }
    const Op* add = sole_reader(*mean);
    if (add == nullptr || add->opcode != blob::Opcode::kBinary ||
        add->at("kind") != int64_t(blob::BinaryKind::kAdd) || add->at("b") != kNoTensor ||
        g_.root(add->at("a")) != g_.root(mean->out()) ||
        !dense_strides(add->list("sizes"), add->list("a_strides"))) {
      return false;
    }
    const double eps = add->real("alpha") * add->real("scalar");
    const Op* rsqrt = sole_reader(*add);
    if (rsqrt == nullptr || !is_unary(*rsqrt, blob::UnaryKind::kRsqrt)) return false;
    const Op* scale = sole_reader(*rsqrt);
    if (scale == nullptr || !is_row_scale(*scale, x, rsqrt->out(), cols)) return false;

    const Op* last = scale;
    int64_t weight = kNoTensor;
    if (const Op* mul = sole_reader(*scale); mul != nullptr) {
      weight = column_weight(g_, *mul, scale->out(), cols);
      if (weight != kNoTensor) last = mul;
    }
    if (g_.tensors[size_t(last->out())].dtype != xt.dtype) return false;
    *replacement = make_op(blob::Opcode::kLayerNorm,
                           {{x}, {weight}, {kNoTensor}, {last->out()}, {rows}, {cols},
                            {double_bits(eps)}, {1}});
    *covered = {pow, index(mean), index(add), index(rsqrt), index(scale)};
    if (last != scale) covered->push_back(index(last));
    return true;
  }

 private:
  static bool is_unary(const Op& op, blob::UnaryKind kind) {
    return op.opcode == blob::Opcode::kUnary && op.at("kind") == int64_t(kind);
  }

  size_t index(const Op* op) const { return size_t(op - g_.ops.data()); }

  // The one op reading `op`'s result, which must disappear into the fused op.
  const Op* sole_reader(const Op& op) const {
    return kiln::builder::sole_reader(g_, op, output_roots_);
  }

  // Whether `strides` (over `sizes`, whose last is `cols`) read one value per row of a dense
  // [rows] tensor: the last dimension broadcast, the others row-major.
  static bool per_row(const std::vector<int64_t>& sizes, const std::vector<int64_t>& strides,
                      int64_t cols) {
    if (sizes.empty() || sizes.back() != cols) return false;
    std::vector<int64_t> outer(sizes.begin(), sizes.end() - 1);
    std::vector<int64_t> outer_strides(strides.begin(), strides.end() - 1);
    return (cols == 1 || strides.back() == 0) && dense_strides(outer, outer_strides);
  }

  // x * rstd (either order), x read densely and rstd one value per row.
  bool is_row_scale(const Op& op, int64_t x, int64_t rstd, int64_t cols) const {
    if (op.opcode != blob::Opcode::kBinary || op.at("kind") != int64_t(blob::BinaryKind::kMul) ||
        op.at("b") == kNoTensor) {
      return false;
    }
    const auto& sizes = op.list("sizes");
    const bool x_is_a = g_.root(op.at("a")) == g_.root(x) && g_.root(op.at("b")) == g_.root(rstd);
    const bool x_is_b = g_.root(op.at("b")) == g_.root(x) && g_.root(op.at("a")) == g_.root(rstd);
    if (x_is_a == x_is_b || op.at(x_is_a ? "a" : "b") != x ||
        g_.tensors[size_t(x)].numel() != g_.tensors[size_t(op.out())].numel()) {
      return false;
    }
    return dense_strides(sizes, op.list(x_is_a ? "a_strides" : "b_strides")) &&
           per_row(sizes, op.list(x_is_a ? "b_strides" : "a_strides"), cols);
  }

  const Graph& g_;
  std::unordered_set<int64_t> output_roots_;
};

}  // namespace

void fold_norm_weights(Graph& g) {
  std::unordered_set<int64_t> output_roots;
  for (int64_t t : g.outputs) output_roots.insert(g.root(t));
  for (size_t i = 0; i < g.ops.size(); ++i) {
    Op& norm = g.ops[i];
    if (norm.opcode != blob::Opcode::kLayerNorm || norm.at("weight") != kNoTensor ||
        norm.at("bias") != kNoTensor) {
      continue;
    }
    const Op* mul = sole_reader(g, norm, output_roots);
    if (mul == nullptr || mul->opcode != blob::Opcode::kBinary || mul->at("b") == kNoTensor) {
      continue;
    }
    // The multiply may read the norm's result through a view (a cast drop_identity_ops removed).
    const int64_t root = g.root(norm.out());
    const int64_t y = g.root(mul->at("a")) == root ? mul->at("a") : mul->at("b");
    const int64_t w = column_weight(g, *mul, y, norm.at("cols"));
    const int64_t result = mul->out();
    const Tensor& r = g.tensors[size_t(result)];
    if (w == kNoTensor || g.root(w) == root ||
        g.tensors[size_t(w)].storage != blob::Storage::kWeight || r.alias_of != kNoTensor ||
        r.storage != blob::Storage::kArena || r.dtype != g.tensors[size_t(norm.out())].dtype) {
      continue;
    }
    // The norm writes the product where it stands: the weight is a constant and the result a
    // tensor only the multiply wrote, so nothing in between sees a difference.
    const size_t j = size_t(mul - g.ops.data());
    norm.at("weight") = w;
    norm.at("out") = result;
    g.ops.erase(g.ops.begin() + std::ptrdiff_t(j));
    if (j < i) --i;
  }
}

void fuse_rms_norms(Graph& g) {
  const RmsMatcher matcher(g);
  for (size_t i = 0; i < g.ops.size();) {
    Op norm;
    std::vector<size_t> covered;
    if (!matcher.match(i, &norm, &covered)) {
      ++i;
      continue;
    }
    // The norm takes the place of the chain's last op, where its weight exists; the chain's
    // inputs (x, the weight) were all written before it.
    const size_t last = covered.back();
    g.ops[last] = std::move(norm);
    covered.pop_back();
    std::unordered_set<size_t> drop(covered.begin(), covered.end());
    std::vector<Op> kept;
    kept.reserve(g.ops.size() - drop.size());
    for (size_t k = 0; k < g.ops.size(); ++k) {
      if (!drop.count(k)) kept.push_back(std::move(g.ops[k]));
    }
    g.ops = std::move(kept);  // the op now at i is the one after the chain's first
  }
}

}  // namespace kiln::builder
