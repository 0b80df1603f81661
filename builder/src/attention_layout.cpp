// Attention writes in its reader's layout: models transpose the [B, H, S, D] result back to
// [B, S, H, D] before the output projection (a kCopy over every element). kAttention takes out
// strides, so that copy folds into the attention op, which then writes the copy's result itself.
#include <unordered_set>

#include "builder/src/passes.h"

namespace kiln::builder {
namespace {

// The out strides with which `attention` writes what `copy` (its result's sole reader) makes of
// it, or false when the copy is not a permutation of whole [B, H, S, D] dimensions into a dense
// result of the same dtype.
bool permuted_out_strides(const Graph& g, const Op& attention, const Op& copy, int64_t os[3]) {
  const int64_t root = g.root(attention.out());
  if (g.root(copy.at("x")) != root || copy.at("in_offset") != 0 || copy.at("out_offset") != 0) {
    return false;
  }
  const Tensor& out = g.tensors[size_t(copy.out())];
  if (out.dtype != g.tensors[size_t(root)].dtype) return false;
  const int64_t b = attention.at("batch"), h = attention.at("heads_q");
  const int64_t s = attention.at("seq_q"), d = attention.at("head_dim_v");
  const int64_t sizes[4] = {b, h, s, d};
  const int64_t strides[4] = {attention.at("out_stride_b"), attention.at("out_stride_h"),
                              attention.at("out_stride_s"), 1};
  if (strides[0] != h * s * d || strides[1] != s * d || strides[2] != d) return false;
  const auto& csizes = copy.list("sizes");
  const auto& cin = copy.list("in_strides");
  const auto& cout = copy.list("out_strides");
  if (!dense_strides(csizes, cout) || out.numel() != b * h * s * d) return false;
  // Each copy dimension of more than one element is one attention dimension (same size, read
  // with that dimension's stride); its out stride is then where the attention writes it.
  int64_t found[4] = {0, 0, 0, 0};
  bool used[4] = {false, false, false, false};
  for (size_t k = 0; k < csizes.size(); ++k) {
    if (csizes[k] == 1) continue;
    int j = 0;
    while (j < 4 && (used[j] || sizes[j] != csizes[k] || strides[j] != cin[k])) ++j;
    if (j == 4) return false;
    used[j] = true;
    found[j] = cout[k];
  }
  for (int j = 0; j < 4; ++j) {
    if (sizes[j] > 1 && !used[j]) return false;
    // A dimension of one element is never stepped: give it the whole tensor's stride, as torch
    // does for a leading size-1 dimension (0 would read as a broadcast to cuDNN).
    if (!used[j]) found[j] = b * h * s * d;
  }
  if (d > 1 && found[3] != 1) return false;  // the head dim stays contiguous
  for (int j = 0; j < 3; ++j) os[j] = found[j];
  return true;
}

}  // namespace

void fold_attention_transposes(Graph& g) {
  std::unordered_set<int64_t> output_roots;
  for (int64_t t : g.outputs) output_roots.insert(g.root(t));
  std::vector<bool> dropped(g.ops.size(), false);
  for (Op& attention : g.ops) {
    if (attention.opcode != blob::Opcode::kAttention) continue;
    const Op* copy = sole_reader(g, attention, output_roots);
    int64_t os[3];
    if (copy == nullptr || copy->opcode != blob::Opcode::kCopy ||
        !permuted_out_strides(g, attention, *copy, os)) {
      continue;
    }
    attention.at("out") = copy->out();
    attention.at("out_stride_b") = os[0];
    attention.at("out_stride_h") = os[1];
    attention.at("out_stride_s") = os[2];
    dropped[size_t(copy - g.ops.data())] = true;
  }
  std::vector<Op> kept;
  for (size_t i = 0; i < g.ops.size(); ++i) {
    if (!dropped[i]) kept.push_back(std::move(g.ops[i]));
  }
  g.ops = std::move(kept);
}

}  // namespace kiln::builder
