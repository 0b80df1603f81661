// Copies that move bytes for nothing.
//  - Identity ops: after precision conversion a decoder's casts (x.to(float32) ... .to(bfloat16)
//    around every RMSNorm, the rotary tables, the logits) copy bf16 into bf16, and a norm weight
//    of ones folds to a multiply by 1. Their results become views of their operands.
//  - Copy chains: a copy reading what another copy alone wrote (ViT's patch embedding: the
//    convolution's NHWC result copied to NCHW, flattened and transposed to [196, 768], then
//    copied into the token sequence after the class token) reads the first copy's source through
//    composed strides, and the first copy goes when nothing else reads it.
//  - Contiguous blocks: a copy of one contiguous run of an arena tensor's elements (a decoder
//    token's gate and up, or q / k / v, out of one merged projection) becomes a view that starts
//    inside it (view_contiguous_copies, after the fusion passes).
#include <unordered_set>

#include "builder/src/passes.h"

namespace kiln::builder {
namespace {

int64_t product(const std::vector<int64_t>& sizes) {
  int64_t n = 1;
  for (int64_t s : sizes) n *= s;
  return n;
}

// The operand whose values `op` writes unchanged into the whole of its result, or kNoTensor: a
// kCopy from offset 0 of a dense tensor into offset 0 of a dense one of the same dtype and
// element count, or a kBinary multiply of a dense tensor by the scalar 1.
int64_t identity_source(const Graph& g, const Op& op) {
  int64_t x = kNoTensor;
  std::vector<int64_t> sizes;
  if (op.opcode == blob::Opcode::kCopy) {
    sizes = op.list("sizes");
    if (op.at("in_offset") != 0 || op.at("out_offset") != 0 ||
        !dense_strides(sizes, op.list("in_strides")) ||
        !dense_strides(sizes, op.list("out_strides"))) {
      return kNoTensor;
    }
    x = op.at("x");
  } else if (op.opcode == blob::Opcode::kBinary) {
    sizes = op.list("sizes");
    if (op.at("kind") != int64_t(blob::BinaryKind::kMul) || op.at("b") != kNoTensor ||
        op.real("scalar") != 1.0 || !dense_strides(sizes, op.list("a_strides"))) {
      return kNoTensor;
    }
    x = op.at("a");
  } else {
    return kNoTensor;
  }
  const Tensor& in = g.tensors[size_t(x)];
  const Tensor& out = g.tensors[size_t(op.out())];
  if (in.dtype != out.dtype || in.numel() != out.numel() || product(sizes) != out.numel()) {
    return kNoTensor;
  }
  return x;
}

// c1 writes all of its result densely (row-major over its sizes) from `x` through in_offset /
// in_strides; c2 reads that result at in_offset2 / strides2 over sizes2. The strides c2 would
// read c1's source with, and the offset (false when c2's reads cross a boundary of c1's
// dimensions that the source's strides do not continue across).
bool compose_reads(const Op& c1, int64_t in_offset2, const std::vector<int64_t>& sizes2,
                   const std::vector<int64_t>& strides2, int64_t* offset,
                   std::vector<int64_t>* strides) {
  // c1's dimensions, merged where its source strides continue (and size-1 ones dropped).
  std::vector<int64_t> n, t;
  const auto& sizes1 = c1.list("sizes");
  const auto& strides1 = c1.list("in_strides");
  for (size_t e = 0; e < sizes1.size(); ++e) {
    if (sizes1[e] == 1) continue;
    if (!n.empty() && t.back() == sizes1[e] * strides1[e]) {
      n.back() *= sizes1[e];
      t.back() = strides1[e];
    } else {
      n.push_back(sizes1[e]);
      t.push_back(strides1[e]);
    }
  }
  std::vector<int64_t> dense(n.size(), 1);   // c1's result strides per merged dimension
  for (size_t e = n.size(); e-- > 1;) dense[e - 1] = dense[e] * n[e];
  const int64_t numel = n.empty() ? 1 : dense[0] * n[0];
  if (in_offset2 < 0 || in_offset2 >= numel) return false;
  // The digits c2's first element sits at, and how far each of c2's dimensions moves them.
  std::vector<int64_t> digit(n.size()), reach(n.size(), 0);
  for (size_t e = 0, rest = size_t(in_offset2); e < n.size(); ++e) {
    digit[e] = int64_t(rest) / dense[e];
    rest -= size_t(digit[e] * dense[e]);
  }
  strides->assign(sizes2.size(), 0);
  for (size_t d = 0; d < sizes2.size(); ++d) {
    if (sizes2[d] == 1 || strides2[d] == 0) continue;
    if (strides2[d] < 0) return false;
    size_t e = 0;
    while (e < n.size() && strides2[d] < dense[e]) ++e;
    if (e == n.size() || strides2[d] % dense[e] != 0) return false;
    const int64_t k = strides2[d] / dense[e];
    reach[e] += k * (sizes2[d] - 1);
    (*strides)[d] = k * t[e];
  }
  *offset = c1.at("in_offset");
  for (size_t e = 0; e < n.size(); ++e) {
    if (digit[e] + reach[e] >= n[e]) return false;   // a carry into the next dimension
    *offset += digit[e] * t[e];
  }
  return true;
}

// Whether `op` is a kCopy writing all of its result densely from offset 0.
bool writes_whole_result(const Graph& g, const Op& op) {
  if (op.opcode != blob::Opcode::kCopy || op.at("out_offset") != 0) return false;
  const auto& sizes = op.list("sizes");
  return dense_strides(sizes, op.list("out_strides")) &&
         product(sizes) == g.tensors[size_t(op.out())].numel();
}

// Whether op i alone writes `out` and nothing writes x's storage after it: only then may `out`
// become a view of x (it would otherwise read other values than the copy held).
bool may_become_view(const Graph& g, size_t i, int64_t x, int64_t out) {
  const int64_t source_root = g.root(x);
  for (size_t k = 0; k < g.ops.size(); ++k) {
    const int64_t written = g.root(g.ops[k].out());
    if ((k != i && written == out) || (k > i && written == source_root)) return false;
  }
  return true;
}

}  // namespace

void compose_copies(Graph& g) {
  std::unordered_set<int64_t> output_roots;
  for (int64_t t : g.outputs) output_roots.insert(g.root(t));
  for (size_t j = 0; j < g.ops.size(); ++j) {
    if (g.ops[j].opcode != blob::Opcode::kCopy) continue;
    const int64_t mid = g.root(g.ops[j].at("x"));
    // The one op writing `mid`, a whole-result copy before j.
    size_t i = g.ops.size();
    bool single = true;
    for (size_t k = 0; k < g.ops.size(); ++k) {
      if (g.root(g.ops[k].out()) != mid) continue;
      single = single && i == g.ops.size();
      i = k;
    }
    if (!single || i >= j || !writes_whole_result(g, g.ops[i]) || output_roots.count(mid) ||
        g.tensors[size_t(mid)].storage != blob::Storage::kArena) {
      continue;
    }
    const Op& c1 = g.ops[i];
    Op& c2 = g.ops[j];
    const int64_t source = c1.at("x");
    // A cast then another cast would round twice; one composed copy rounds once.
    const blob::DType s = g.tensors[size_t(source)].dtype, m = g.tensors[size_t(mid)].dtype,
                      o = g.tensors[size_t(c2.out())].dtype;
    if (s != m && m != o) continue;
    bool clobbered = false;
    for (size_t k = i + 1; k < j; ++k) clobbered |= g.root(g.ops[k].out()) == g.root(source);
    int64_t offset = 0;
    std::vector<int64_t> strides;
    if (clobbered || !compose_reads(c1, c2.at("in_offset"), c2.list("sizes"),
                                    c2.list("in_strides"), &offset, &strides)) {
      continue;
    }
    c2.at("x") = source;
    c2.at("in_offset") = offset;
    c2.list("in_strides") = strides;
    if (readers(g, mid).empty()) {
      g.ops.erase(g.ops.begin() + std::ptrdiff_t(i));
      --j;
    }
  }
}

void view_contiguous_copies(Graph& g) {
  std::unordered_set<int64_t> output_roots;
  for (int64_t t : g.outputs) output_roots.insert(g.root(t));
  for (size_t i = 0; i < g.ops.size();) {
    const Op& op = g.ops[i];
    bool ok = op.opcode == blob::Opcode::kCopy && op.at("out_offset") == 0 &&
              op.at("in_offset") >= 0;
    int64_t x = kNoTensor, out = kNoTensor;
    if (ok) {
      const auto& sizes = op.list("sizes");
      x = op.at("x");
      out = op.out();
      const Tensor& in = g.tensors[size_t(x)];
      const Tensor& o = g.tensors[size_t(out)];
      ok = dense_strides(sizes, op.list("in_strides")) &&
           dense_strides(sizes, op.list("out_strides")) && in.dtype == o.dtype &&
           product(sizes) == o.numel() && op.at("in_offset") + o.numel() <= in.numel() &&
           o.alias_of == kNoTensor && o.storage == blob::Storage::kArena &&
           !output_roots.count(out) &&
           g.tensors[size_t(g.root(x))].storage == blob::Storage::kArena;
    }
    if (!ok || !may_become_view(g, i, x, out)) {
      ++i;
      continue;
    }
    Tensor& view = g.tensors[size_t(out)];
    view.alias_of = x;
    view.view_bytes = uint64_t(op.at("in_offset")) * element_size(view.dtype);
    g.ops.erase(g.ops.begin() + std::ptrdiff_t(i));
  }
}

void drop_identity_ops(Graph& g) {
  std::unordered_set<int64_t> output_roots;
  for (int64_t t : g.outputs) output_roots.insert(g.root(t));
  for (size_t i = 0; i < g.ops.size();) {
    const Op& op = g.ops[i];
    const int64_t x = identity_source(g, op);
    const int64_t out = op.out();
    const Tensor& o = g.tensors[size_t(out)];
    // The result must be a plain arena tensor this op alone writes, and the operand's storage
    // must not change after this op (a state the step updates, a buffer filled in pieces), or the
    // view would read other values than the copy held.
    const bool ok = x != kNoTensor && o.alias_of == kNoTensor &&
                    o.storage == blob::Storage::kArena && !output_roots.count(out);
    if (!ok || !may_become_view(g, i, x, out)) {
      ++i;
      continue;
    }
    g.tensors[size_t(out)].alias_of = x;
    g.ops.erase(g.ops.begin() + std::ptrdiff_t(i));
  }
}

}  // namespace kiln::builder
