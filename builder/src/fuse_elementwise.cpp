// Elementwise-chain fusion: kUnary / kBinary / kWhere chains into one kFusedElementwise op.
//
// An op joins its reader's program when its result (not a delegate output, not state) is read by
// that op only, elementwise (same numel, contiguous), and the merged program still fits the
// format's limits. Runs after precision conversion: each instruction rounds to the dtype its op's
// result had, which keeps results bit-identical to the unfused ops; and before memory planning,
// so the intermediates disappear from the arena.
#include <algorithm>
#include <initializer_list>
#include <map>
#include <optional>
#include <set>
#include <unordered_map>
#include <unordered_set>

#include "builder/src/passes.h"
#include "kiln/builder.h"

namespace kiln::builder {
namespace {

using Sizes = std::vector<int64_t>;

struct Access {
  int64_t tid;
  Sizes sizes;
  Sizes strides;
};

Sizes contiguous_strides(const Sizes& shape) {
  Sizes strides(shape.size());
  int64_t acc = 1;
  for (size_t d = shape.size(); d-- > 0;) {
    strides[d] = acc;
    acc *= shape[d];
  }
  return strides;
}

bool fusable_binary(int64_t kind) {
  using K = blob::BinaryKind;
  switch (static_cast<K>(kind)) {
    case K::kAdd: case K::kSub: case K::kMul: case K::kDiv: case K::kPow: case K::kMaximum:
    case K::kMinimum: case K::kFloorDiv: case K::kRemainder: return true;
    default: return false;
  }
}

// Sizes of an op's index space that a fused program can use: positive, multiplying to the
// output's element count. Anything else is a malformed op (the blob reader names it); checking
// here keeps the index arithmetic below from overflowing on it.
bool sane_sizes(const Sizes& sizes, int64_t numel) {
  int64_t n = 1;
  for (int64_t s : sizes) {
    if (s <= 0 || __builtin_mul_overflow(n, s, &n)) return false;
  }
  return n == numel;
}

// Every tensor `op` reads over the op's own index space; nullopt when the op cannot join a fused
// program (kinds or dtypes outside fp32 math, or state).
std::optional<std::vector<Access>> accesses(const Graph& g, const Op& op) {
  auto dtype = [&](int64_t t) { return g.tensors[size_t(t)].dtype; };
  if (op.opcode != blob::Opcode::kUnary && op.opcode != blob::Opcode::kBinary &&
      op.opcode != blob::Opcode::kWhere) {
    return std::nullopt;
  }
  // A required operand given as kNoTensor is malformed: leave the op alone, the blob reader
  // names it when the blob is checked.
  auto missing = [&](std::initializer_list<const char*> names) {
    for (const char* n : names) {
      if (op.at(n) < 0) return true;
    }
    return false;
  };
  if (op.opcode == blob::Opcode::kUnary    ? missing({"x"})
      : op.opcode == blob::Opcode::kBinary ? missing({"a"})
                                           : missing({"cond", "a", "b"})) {
    return std::nullopt;
  }
  if (!is_floating(dtype(op.out()))) return std::nullopt;
  for (int64_t t : op.reads()) {
    if (g.tensors[size_t(g.root(t))].storage == blob::Storage::kState) return std::nullopt;
  }
  std::vector<Access> out;
  if (op.opcode == blob::Opcode::kUnary) {
    if (op.at("kind") == int64_t(blob::UnaryKind::kLogicalNot) || !is_floating(dtype(op.at("x")))) {
      return std::nullopt;
    }
    int64_t n = g.tensors[size_t(op.out())].numel();
    out.push_back({op.at("x"), {n}, {1}});
    return out;
  }
  if (op.opcode == blob::Opcode::kBinary) {
    int64_t b = op.at("b");
    if (!fusable_binary(op.at("kind")) || !is_floating(dtype(op.at("a"))) ||
        (b >= 0 && !is_floating(dtype(b)))) {
      return std::nullopt;
    }
    if (!sane_sizes(op.list("sizes"), g.tensors[size_t(op.out())].numel())) return std::nullopt;
    out.push_back({op.at("a"), op.list("sizes"), op.list("a_strides")});
    if (b >= 0) out.push_back({b, op.list("sizes"), op.list("b_strides")});
    return out;
  }
  if (dtype(op.at("cond")) != blob::DType::kBool || !is_floating(dtype(op.at("a"))) ||
      !is_floating(dtype(op.at("b")))) {
    return std::nullopt;
  }
  if (!sane_sizes(op.list("sizes"), g.tensors[size_t(op.out())].numel())) return std::nullopt;
  for (const char* k : {"cond", "a", "b"}) {
    out.push_back({op.at(k), op.list("sizes"), op.list((std::string(k) + "_strides").c_str())});
  }
  return out;
}

Sizes suffix_products(const Sizes& sizes) {
  Sizes out{1};
  int64_t acc = 1;
  for (size_t d = sizes.size(); d-- > 0;) {
    acc *= sizes[d];
    out.push_back(acc);
  }
  return out;
}

// The coarsest shape whose every dim lies inside one dim of each of `all`, as its suffix
// products, largest first; nullopt when there is none.
std::optional<Sizes> refine(const std::vector<const Sizes*>& all) {
  std::set<int64_t> products;
  for (const Sizes* sizes : all) {
    for (int64_t p : suffix_products(*sizes)) products.insert(p);
  }
  Sizes bounds(products.rbegin(), products.rend());
  for (size_t i = 0; i + 1 < bounds.size(); ++i) {
    if (bounds[i + 1] == 0 || bounds[i] % bounds[i + 1] != 0) return std::nullopt;
  }
  return bounds;
}

// Strides of an access given over `sizes`, re-expressed over the refined shape.
std::optional<Sizes> restride(const Sizes& bounds, const Sizes& sizes, const Sizes& strides) {
  Sizes inner(sizes.size());   // inner[d] = prod(sizes[d + 1:])
  int64_t acc = 1;
  for (size_t d = sizes.size(); d-- > 0;) {
    inner[d] = acc;
    acc *= sizes[d];
  }
  Sizes out;
  for (size_t i = 1; i < bounds.size(); ++i) {
    int64_t q = bounds[i];
    size_t d = 0;
    while (d < sizes.size() && !(inner[d] <= q && q < inner[d] * sizes[d])) ++d;
    int64_t stride;
    if (d == sizes.size() || __builtin_mul_overflow(strides[d], q / inner[d], &stride)) {
      return std::nullopt;
    }
    out.push_back(stride);
  }
  return out;
}

// Drops size-1 dims and merges dims every stride list walks as one.
void coalesce(const Sizes& sizes, const std::vector<Sizes>& strides, Sizes* out_sizes,
              std::vector<Sizes>* out_strides) {
  std::vector<std::pair<int64_t, Sizes>> dims;
  for (size_t d = 0; d < sizes.size(); ++d) {
    int64_t n = sizes[d];
    if (n == 1) continue;
    Sizes st;
    for (const Sizes& s : strides) st.push_back(s[d]);
    bool merge = !dims.empty();
    for (size_t i = 0; merge && i < st.size(); ++i) {
      int64_t outer;
      merge = !__builtin_mul_overflow(st[i], n, &outer) && dims.back().second[i] == outer;
    }
    if (merge) {
      dims.back() = {dims.back().first * n, st};
    } else {
      dims.emplace_back(n, st);
    }
  }
  out_sizes->clear();
  for (auto& d : dims) out_sizes->push_back(d.first);
  out_strides->assign(strides.size(), Sizes());
  for (size_t i = 0; i < strides.size(); ++i) {
    for (auto& d : dims) (*out_strides)[i].push_back(d.second[i]);
  }
}

// The kFusedElementwise op computing `ops` (program order, the last one the result), or nullopt
// when they do not fit one.
std::optional<Op> fused_op(const Graph& g, const std::vector<const Op*>& ops) {
  std::unordered_map<int64_t, const Op*> produced;
  for (const Op* op : ops) produced[g.root(op->out())] = op;
  std::vector<std::vector<Access>> acc;
  int64_t numel = g.tensors[size_t(ops.back()->out())].numel();
  if (numel == 0) return std::nullopt;
  for (const Op* op : ops) {
    auto a = accesses(g, *op);
    if (!a || g.tensors[size_t(op->out())].numel() != numel) return std::nullopt;
    acc.push_back(std::move(*a));
  }
  std::vector<const Sizes*> all_sizes;
  for (auto& a : acc) {
    for (auto& x : a) all_sizes.push_back(&x.sizes);
  }
  auto bounds = refine(all_sizes);
  if (!bounds || bounds->size() - 1 > blob::kMaxRank) return std::nullopt;
  Sizes refined;
  for (size_t i = 0; i + 1 < bounds->size(); ++i) refined.push_back((*bounds)[i] / (*bounds)[i + 1]);

  // A source is an input index (>= 0), kNoSource, or an instruction's register (kReg + j).
  constexpr int64_t kNoSource = -1;
  constexpr int64_t kReg = int64_t(1) << 40;
  std::vector<std::pair<int64_t, Sizes>> inputs;
  std::unordered_map<int64_t, int64_t> regs;
  std::vector<std::vector<int64_t>> program;
  for (size_t k = 0; k < ops.size(); ++k) {
    const Op& op = *ops[k];
    std::vector<int64_t> srcs;
    for (const Access& a : acc[k]) {
      int64_t root = g.root(a.tid);
      auto p = produced.find(root);
      if (p != produced.end() && p->second != &op) {
        auto r = regs.find(root);
        if (a.strides != contiguous_strides(a.sizes) ||
            g.tensors[size_t(root)].numel() != numel || r == regs.end()) {
          return std::nullopt;
        }
        srcs.push_back(r->second);
        continue;
      }
      auto st = restride(*bounds, a.sizes, a.strides);
      if (!st) return std::nullopt;
      std::pair<int64_t, Sizes> key{a.tid, *st};
      auto it = std::find(inputs.begin(), inputs.end(), key);
      if (it == inputs.end()) it = inputs.insert(inputs.end(), key);
      srcs.push_back(int64_t(it - inputs.begin()));
    }
    int64_t rnd = int64_t(g.tensors[size_t(op.out())].dtype);
    if (op.opcode == blob::Opcode::kUnary) {
      program.push_back({int64_t(blob::FusedForm::kUnary), op.at("kind"), srcs[0], kNoSource,
                         kNoSource, op.at("p0"), op.at("p1"), rnd});
    } else if (op.opcode == blob::Opcode::kBinary) {
      int64_t s1 = op.at("b") >= 0 ? srcs[1] : kNoSource;
      program.push_back({int64_t(blob::FusedForm::kBinary), op.at("kind"), srcs[0], s1, kNoSource,
                         op.at("alpha"), op.at("scalar"), rnd});
    } else {
      program.push_back({int64_t(blob::FusedForm::kWhere), 0, srcs[0], srcs[1], srcs[2],
                         double_bits(0.0), double_bits(0.0), rnd});
    }
    regs[g.root(op.out())] = kReg + int64_t(program.size()) - 1;
  }
  if (inputs.size() > blob::kMaxFusedInputs || program.size() > blob::kMaxFusedInstrs) {
    return std::nullopt;
  }
  // Registers: inputs first, then one per instruction.
  std::vector<int64_t> flat;
  for (auto& instr : program) {
    for (size_t i = 2; i < 5; ++i) {
      if (instr[i] >= kReg) instr[i] = int64_t(inputs.size()) + instr[i] - kReg;
    }
    flat.insert(flat.end(), instr.begin(), instr.end());
  }
  std::vector<Sizes> strides;
  for (auto& in : inputs) strides.push_back(in.second);
  strides.push_back(contiguous_strides(refined));
  Sizes sizes;
  std::vector<Sizes> coalesced;
  coalesce(refined, strides, &sizes, &coalesced);
  std::vector<int64_t> ids, flat_strides;
  for (size_t i = 0; i < inputs.size(); ++i) {
    ids.push_back(inputs[i].first);
    flat_strides.insert(flat_strides.end(), coalesced[i].begin(), coalesced[i].end());
  }
  return make_op(blob::Opcode::kFusedElementwise,
                 {{ops.back()->out()}, {int64_t(sizes.size())}, sizes, {int64_t(inputs.size())},
                  ids, flat_strides, {int64_t(program.size())}, flat});
}

}  // namespace

void fuse_elementwise(Graph& g) {
  std::unordered_set<int64_t> output_roots;
  for (int64_t t : g.outputs) output_roots.insert(g.root(t));
  std::unordered_map<int64_t, std::vector<const Op*>> readers_of;
  for (const Op& op : g.ops) {
    std::unordered_set<int64_t> seen;
    for (int64_t t : op.reads()) {
      int64_t r = g.root(t);
      if (seen.insert(r).second) readers_of[r].push_back(&op);
    }
  }
  std::unordered_map<const Op*, size_t> position;
  for (size_t i = 0; i < g.ops.size(); ++i) position[&g.ops[i]] = i;
  std::unordered_map<int64_t, const Op*> producer;
  // The ops of the program each op currently ends, in op order; empty once merged into a reader.
  std::vector<std::vector<const Op*>> group(g.ops.size());
  for (size_t i = 0; i < g.ops.size(); ++i) {
    const Op& op = g.ops[i];
    group[i] = {&op};
    if (accesses(g, op)) {
      std::vector<int64_t> roots;
      for (int64_t t : op.reads()) {
        int64_t r = g.root(t);
        if (std::find(roots.begin(), roots.end(), r) == roots.end()) roots.push_back(r);
      }
      for (int64_t root : roots) {
        auto p = producer.find(root);
        if (p == producer.end() || output_roots.count(root) || readers_of[root].size() != 1 ||
            g.tensors[size_t(root)].alias_of != kNoTensor || p->second->out() != root) {
          continue;
        }
        size_t pi = position[p->second];
        if (group[pi].empty()) continue;
        std::vector<const Op*> merged = group[pi];
        merged.insert(merged.end(), group[i].begin(), group[i].end());
        std::stable_sort(merged.begin(), merged.end(),
                         [&](const Op* a, const Op* b) { return position[a] < position[b]; });
        if (fused_op(g, merged)) {
          group[i] = std::move(merged);
          group[pi].clear();
        }
      }
    }
    if (op.out() == g.root(op.out())) producer[op.out()] = &op;
  }
  std::vector<Op> ops;
  for (size_t i = 0; i < g.ops.size(); ++i) {
    if (group[i].empty()) continue;
    if (group[i].size() == 1) {
      ops.push_back(g.ops[i]);
    } else {
      ops.push_back(*fused_op(g, group[i]));
    }
  }
  g.ops = std::move(ops);
}

}  // namespace kiln::builder
