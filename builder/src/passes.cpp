// The small structural passes: dead ops, matmul and conv epilogues, output binding, compaction.
#include <algorithm>
#include <set>
#include <unordered_map>
#include <unordered_set>

#include "builder/src/passes.h"
#include "kiln/builder.h"

namespace kiln::builder {

std::vector<const Op*> readers(const Graph& g, int64_t root) {
  std::vector<const Op*> out;
  for (const Op& op : g.ops) {
    for (int64_t t : op.reads()) {
      if (g.root(t) == root) {
        out.push_back(&op);
        break;
      }
    }
  }
  return out;
}

const Op* sole_reader(const Graph& g, const Op& op,
                      const std::unordered_set<int64_t>& output_roots) {
  const int64_t root = g.root(op.out());
  if (output_roots.count(root)) return nullptr;
  auto rs = readers(g, root);
  return rs.size() == 1 ? rs[0] : nullptr;
}

Op flat_copy(const Graph& g, int64_t x, int64_t out) {
  int64_t n = g.tensors[size_t(out)].numel();
  return make_op(blob::Opcode::kCopy, {{x}, {out}, {1}, {n}, {0}, {1}, {0}, {1}});
}

void eliminate_dead_ops(Graph& g) {
  // State is needed even when no output reads it: the next run does.
  std::unordered_set<int64_t> needed;
  for (int64_t t : g.outputs) needed.insert(g.root(t));
  for (const Tensor& t : g.tensors) {
    if (t.storage == blob::Storage::kState) needed.insert(t.id);
  }
  std::vector<Op> live;
  for (auto it = g.ops.rbegin(); it != g.ops.rend(); ++it) {
    if (needed.count(g.root(it->out()))) {
      for (int64_t t : it->reads()) needed.insert(g.root(t));
      live.push_back(std::move(*it));
    }
  }
  std::reverse(live.begin(), live.end());
  g.ops = std::move(live);
}

bool dense_strides(const std::vector<int64_t>& sizes, const std::vector<int64_t>& strides) {
  int64_t expected = 1;
  for (size_t d = sizes.size(); d-- > 0;) {
    if (sizes[d] != 1 && strides[d] != expected) return false;
    expected *= sizes[d];
  }
  return true;
}

namespace {

// An op with an epilogue (kMatmul, kConv2d) whose result only an add reads (y = op + r, r of the
// same shape and dtype) takes r as its residual (cuBLASLt adds it as C with beta 1; the conv's
// epilogue adds it in fp32). The fused op moves to the add's place, where r exists; that is safe
// unless an op in between writes something the op reads (state).
void fuse_residuals(Graph& g, blob::Opcode opcode,
                    const std::unordered_set<int64_t>& output_roots) {
  for (size_t i = 0; i < g.ops.size(); ++i) {
    Op& mm = g.ops[i];
    if (mm.opcode != opcode || mm.at("epilogue") != int64_t(blob::Epilogue::kNone) ||
        mm.at("residual") != kNoTensor) {
      continue;
    }
    const int64_t root = g.root(mm.out());
    const Op* add = sole_reader(g, mm, output_roots);
    if (add == nullptr || add->opcode != blob::Opcode::kBinary ||
        add->at("kind") != int64_t(blob::BinaryKind::kAdd) || add->real("alpha") != 1.0 ||
        add->at("b") == kNoTensor) {
      continue;
    }
    const bool mm_is_a = g.root(add->at("a")) == root;
    if (mm_is_a == (g.root(add->at("b")) == root)) continue;   // x + x, or not read directly
    const int64_t residual = mm_is_a ? add->at("b") : add->at("a");
    const Tensor& out = g.tensors[size_t(root)];
    const Tensor& r = g.tensors[size_t(residual)];
    const Tensor& sum = g.tensors[size_t(add->out())];
    if (r.dtype != out.dtype || sum.dtype != out.dtype || r.numel() != out.numel() ||
        sum.numel() != out.numel() || !dense_strides(add->list("sizes"), add->list("a_strides")) ||
        !dense_strides(add->list("sizes"), add->list("b_strides"))) {
      continue;
    }
    const size_t j = size_t(add - g.ops.data());
    std::unordered_set<int64_t> read_roots;
    for (int64_t t : mm.reads()) read_roots.insert(g.root(t));
    bool clobbered = false;
    for (size_t k = i + 1; k < j; ++k) clobbered |= read_roots.count(g.root(g.ops[k].out())) > 0;
    if (j < i || clobbered) continue;
    g.tensors[size_t(add->out())].alias_of = root;
    mm.at("residual") = residual;
    g.ops[j] = std::move(mm);
    g.ops.erase(g.ops.begin() + std::ptrdiff_t(i));
    --i;
  }
}

// relu and the gelus: the epilogues cuBLASLt runs in its own kernel (or kNone).
blob::Epilogue gemm_activation(const Op& act) {
  switch (static_cast<blob::UnaryKind>(act.at("kind"))) {
    case blob::UnaryKind::kRelu: return blob::Epilogue::kRelu;
    case blob::UnaryKind::kGeluErf: return blob::Epilogue::kGeluErf;
    case blob::UnaryKind::kGeluTanh: return blob::Epilogue::kGeluTanh;
    default: return blob::Epilogue::kNone;
  }
}

// The epilogue a kConv2d runs for kUnary `act` (the conv nets' activations too: relu6 as
// hardtanh(0, 6) or clamp(0, 6), silu, hardswish, sigmoid), or kNone.
blob::Epilogue conv_activation(const Op& act) {
  switch (static_cast<blob::UnaryKind>(act.at("kind"))) {
    case blob::UnaryKind::kClamp:
      return act.real("p0") == 0.0 && act.real("p1") == 6.0 ? blob::Epilogue::kRelu6
                                                             : blob::Epilogue::kNone;
    case blob::UnaryKind::kSilu: return blob::Epilogue::kSilu;
    case blob::UnaryKind::kHardswish: return blob::Epilogue::kHardswish;
    case blob::UnaryKind::kSigmoid: return blob::Epilogue::kSigmoid;
    default: return gemm_activation(act);
  }
}

// An op of `opcode` followed by an activation that `activation(op, act)` maps to a kind as the
// only reader of its result: the activation runs in the op's epilogue and its result becomes a
// view of the op's.
template <typename Activation>
void fuse_activations(Graph& g, blob::Opcode opcode, Activation activation,
                      const std::unordered_set<int64_t>& output_roots) {
  for (size_t i = 0; i < g.ops.size(); ++i) {
    Op& op = g.ops[i];
    if (op.opcode != opcode || op.at("epilogue") != int64_t(blob::Epilogue::kNone)) {
      continue;
    }
    const int64_t root = g.root(op.out());
    const Op* act = sole_reader(g, op, output_roots);
    if (act == nullptr || act->opcode != blob::Opcode::kUnary) continue;
    const blob::Epilogue epilogue = activation(op, *act);
    if (epilogue == blob::Epilogue::kNone) continue;
    if (g.tensors[size_t(act->out())].dtype != g.tensors[size_t(root)].dtype) continue;
    op.at("epilogue") = int64_t(epilogue);
    g.tensors[size_t(act->out())].alias_of = root;
    size_t j = size_t(act - g.ops.data());
    g.ops.erase(g.ops.begin() + std::ptrdiff_t(j));
    if (j < i) --i;
  }
}

}  // namespace

void fuse_silu(Graph& g) {
  std::unordered_set<int64_t> output_roots;
  for (int64_t t : g.outputs) output_roots.insert(g.root(t));
  for (size_t i = 0; i < g.ops.size(); ++i) {
    const Op& sig = g.ops[i];
    if (sig.opcode != blob::Opcode::kUnary ||
        sig.at("kind") != int64_t(blob::UnaryKind::kSigmoid)) {
      continue;
    }
    const int64_t x = sig.at("x");
    const Op* mul = sole_reader(g, sig, output_roots);
    if (mul == nullptr || mul->opcode != blob::Opcode::kBinary ||
        mul->at("kind") != int64_t(blob::BinaryKind::kMul) || mul->at("b") == kNoTensor) {
      continue;
    }
    // x * sigmoid(x) in either order, both read densely over the whole result.
    const int64_t a = mul->at("a"), b = mul->at("b");
    const bool sig_is_b = g.root(b) == g.root(sig.out()) && a == x;
    const bool sig_is_a = g.root(a) == g.root(sig.out()) && b == x;
    const Tensor& xt = g.tensors[size_t(x)];
    const Tensor& out = g.tensors[size_t(mul->out())];
    const auto& sizes = mul->list("sizes");
    if (sig_is_a == sig_is_b || xt.dtype != out.dtype ||
        g.tensors[size_t(sig.out())].dtype != out.dtype || xt.numel() != out.numel() ||
        !dense_strides(sizes, mul->list("a_strides")) ||
        !dense_strides(sizes, mul->list("b_strides"))) {
      continue;
    }
    // The silu writes the product where the multiply stood (x exists there; nothing else read the
    // sigmoid).
    const size_t j = size_t(mul - g.ops.data());
    g.ops[j] = make_op(blob::Opcode::kUnary, {{int64_t(blob::UnaryKind::kSilu)}, {x},
                                              {mul->out()}, {double_bits(0.0)}, {double_bits(0.0)}});
    g.ops.erase(g.ops.begin() + std::ptrdiff_t(i));
    --i;
  }
}

void fuse_matmul_epilogues(Graph& g) {
  std::unordered_set<int64_t> output_roots;
  for (int64_t t : g.outputs) output_roots.insert(g.root(t));
  fuse_residuals(g, blob::Opcode::kMatmul, output_roots);
  // What cuBLASLt fuses, so that silu and the rest stay elementwise ops the fusion pass can merge
  // with their readers (a Llama MLP's silu(gate) * up is one kernel). Matmuls of at most 8 rows
  // run on the engine's GEMV, which applies any epilogue in its pass: those take the conv nets'
  // activations too (a squeeze-excitation's silu and sigmoid).
  const auto matmul_activation = [](const Op& op, const Op& act) {
    return op.at("batch") == 1 && op.at("M") <= 8 ? conv_activation(act) : gemm_activation(act);
  };
  fuse_activations(g, blob::Opcode::kMatmul, matmul_activation, output_roots);
  fuse_residuals(g, blob::Opcode::kQuantMatmul, output_roots);
  fuse_activations(g, blob::Opcode::kQuantMatmul,
                   [](const Op&, const Op& act) { return gemm_activation(act); }, output_roots);
}

void fuse_conv_epilogues(Graph& g) {
  std::unordered_set<int64_t> output_roots;
  for (int64_t t : g.outputs) output_roots.insert(g.root(t));
  fuse_residuals(g, blob::Opcode::kConv2d, output_roots);
  fuse_activations(g, blob::Opcode::kConv2d,
                   [](const Op&, const Op& act) { return conv_activation(act); }, output_roots);
}

void bind_outputs(Graph& g) {
  std::unordered_set<int64_t> written;
  for (const Op& op : g.ops) written.insert(g.root(op.out()));
  std::unordered_set<int64_t> bound;
  for (size_t i = 0; i < g.outputs.size(); ++i) {
    int64_t tid = g.outputs[i];
    int64_t root = g.root(tid);
    // An input, a weight, or a tensor already bound to another output cannot also live in this
    // output's memory: copy it there.
    if (bound.count(root) || !written.count(root) ||
        g.tensors[size_t(root)].storage != blob::Storage::kArena) {
      const Tensor& t = g.tensors[size_t(tid)];
      int64_t copy = g.add_tensor(t.dtype, t.shape, t.name);
      g.outputs[i] = copy;
      g.ops.push_back(flat_copy(g, tid, copy));
      root = copy;
    }
    g.tensors[size_t(root)].storage = blob::Storage::kOutput;
    g.tensors[size_t(root)].offset = i;
    bound.insert(root);
  }
}

void compact(Graph& g) {
  std::vector<bool> keep(g.tensors.size(), false);
  for (int64_t t : g.inputs) keep[size_t(t)] = true;
  for (int64_t t : g.outputs) keep[size_t(t)] = true;
  for (const Op& op : g.ops) {
    for (int64_t t : op.reads()) keep[size_t(t)] = true;
    keep[size_t(op.out())] = true;
  }
  for (size_t i = 0; i < g.tensors.size(); ++i) {
    if (!keep[i]) continue;
    for (int64_t t = int64_t(i); g.tensors[size_t(t)].alias_of != kNoTensor;) {
      t = g.tensors[size_t(t)].alias_of;
      keep[size_t(t)] = true;
    }
  }
  std::vector<int64_t> new_id(g.tensors.size(), kNoTensor);
  std::vector<Tensor> tensors;
  for (size_t i = 0; i < g.tensors.size(); ++i) {
    if (!keep[i]) continue;
    new_id[i] = int64_t(tensors.size());
    tensors.push_back(std::move(g.tensors[i]));
  }
  for (Tensor& t : tensors) {
    t.id = new_id[size_t(t.id)];
    if (t.alias_of != kNoTensor) t.alias_of = new_id[size_t(t.alias_of)];
  }
  for (Op& op : g.ops) {
    op.for_each_tensor([&](int64_t& id) {
      if (id >= 0) id = new_id[size_t(id)];
    });
  }
  g.tensors = std::move(tensors);
  for (int64_t& t : g.inputs) t = new_id[size_t(t)];
  for (int64_t& t : g.outputs) t = new_id[size_t(t)];
}

}  // namespace kiln::builder
