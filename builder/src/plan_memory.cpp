// Liveness-based arena planning.
#include <algorithm>
#include <tuple>
#include <unordered_map>

#include "builder/src/passes.h"
#include "kiln/builder.h"

namespace kiln::builder {

namespace {
uint64_t align_up(uint64_t n, uint64_t a) { return (n + a - 1) / a * a; }
}  // namespace

// A tensor lives from the first op that writes it to the last op that reads it or any view of it,
// both inclusive, so an op's output never shares bytes with its inputs. Largest tensors are placed
// first, each in the smallest gap that fits among the tensors whose lifetimes overlap its own.
void plan_memory(Graph& g) {
  std::unordered_map<int64_t, size_t> first, last;
  for (size_t i = 0; i < g.ops.size(); ++i) {
    int64_t root = g.root(g.ops[i].out());
    first.emplace(root, i);
    last[root] = i;
    for (int64_t t : g.ops[i].reads()) last[g.root(t)] = i;
  }
  std::vector<Tensor*> roots;
  for (Tensor& t : g.tensors) {
    if (t.alias_of != kNoTensor || t.storage != blob::Storage::kArena) continue;
    if (!first.count(t.id)) {
      fail(KILN_BUILDER_BUILD_FAILED, "arena tensor %lld (%s) is never written", (long long)t.id,
           t.name.c_str());
    }
    roots.push_back(&t);
  }
  std::stable_sort(roots.begin(), roots.end(), [&](const Tensor* a, const Tensor* b) {
    return std::make_tuple(-int64_t(a->nbytes()), first[a->id]) <
           std::make_tuple(-int64_t(b->nbytes()), first[b->id]);
  });
  struct Placed {
    int64_t id;
    uint64_t offset, size;
  };
  std::vector<Placed> placed;
  for (Tensor* t : roots) {
    uint64_t size = align_up(t->nbytes(), kArenaAlignment);
    std::vector<std::pair<uint64_t, uint64_t>> busy;
    for (const Placed& p : placed) {
      if (first[p.id] <= last[t->id] && first[t->id] <= last[p.id]) {
        busy.emplace_back(p.offset, p.offset + p.size);
      }
    }
    std::sort(busy.begin(), busy.end());
    bool found = false;
    uint64_t best = 0, best_gap = 0, cursor = 0;
    for (auto [start, end] : busy) {
      // A gap is only there when the next busy range starts past the cursor.
      if (start >= cursor) {
        uint64_t gap = start - cursor;
        if (gap >= size && (!found || gap < best_gap)) {
          best = cursor;
          best_gap = gap;
          found = true;
        }
      }
      cursor = std::max(cursor, end);
    }
    t->offset = found ? best : cursor;
    placed.push_back({t->id, t->offset, size});
  }
  g.arena_size = 0;
  for (const Placed& p : placed) g.arena_size = std::max(g.arena_size, p.offset + p.size);
}

}  // namespace kiln::builder
