#include "runtime/engine/kernels/rope_append.cuh"

#include <variant>

#include "format/dtype.h"
#include "format/fail.h"
#include "runtime/engine/kernels/common.cuh"
#include "runtime/engine/kernels/positions.cuh"
#include "runtime/engine/kernels/rope.cuh"
#include "runtime/engine/op_tensors.h"
#include "runtime/engine/env_switch.h"

namespace kiln::engine::kernels {
namespace {

using blob::DType;
using blob::Opcode;
using executorch::runtime::Error;

constexpr size_t kMaxOps = 6;   // a decoder layer has 4: rope q, rope k, write k, write v
constexpr int kMaxRopes = 4;
constexpr int kMaxPuts = 4;

struct RopeTask {
  void* out;             // null: its rows go to put `route` instead
  const void* x;         // x, cos and sin with their offsets applied
  const void* cos;
  const void* sin;
  RopeLoop r;
  int route;             // the put its rows are the values of, or -1
};

struct PutTask {
  const void* values;    // null: a rope's rows (routed)
  const void* positions;
  void* out;
  int64_t outer, num_positions, dim_size, inner;
  int64_t elements;      // outer * num_positions * inner
  bool int64_positions;
  unsigned long long op_plus_one;   // the op the error flag names
};

struct RopeAppendParams {
  RopeTask rope[kMaxRopes];
  PutTask put[kMaxPuts];
  int ropes, puts;
  int64_t total;         // work items: each rope's pairs, then each unrouted put's elements
  DeviceErrorFlag* flag;
};

template <typename T>
__device__ __forceinline__ void put_element(const PutTask& t, int64_t e, T v) {
  const int64_t j = e % t.inner, row = e / t.inner;
  const int64_t i = row % t.num_positions, o = row / t.num_positions;
  const int64_t p = t.int64_positions ? static_cast<const int64_t*>(t.positions)[i]
                                      : static_cast<const int32_t*>(t.positions)[i];
  static_cast<T*>(t.out)[(o * t.dim_size + p) * t.inner + j] = v;
}

// Each thread takes work items in a grid-stride loop; item u is a pair of rotated elements of a
// rope (written to its output, or to the cache rows of the put it is routed to) or one element
// of a put's values. The tasks are walked with constant indices (unrolled), so the parameters
// stay in the constant bank instead of a local copy.
template <typename T>
__global__ void __launch_bounds__(kBlock) rope_append_kernel(const RopeAppendParams p) {
  wait_for_previous_kernel();   // launched overlapped (common.cuh)
  allow_next_kernel();
  bool bad = false;
#pragma unroll
  for (int k = 0; k < kMaxPuts; ++k) {
    const PutTask& t = p.put[k];
    if (k >= p.puts || t.elements == 0) continue;
    bad |= t.int64_positions
               ? flag_bad_positions(static_cast<const int64_t*>(t.positions), t.num_positions,
                                    t.dim_size, p.flag, t.op_plus_one)
               : flag_bad_positions(static_cast<const int32_t*>(t.positions), t.num_positions,
                                    t.dim_size, p.flag, t.op_plus_one);
  }
  // A bad position (or an earlier op's range error) writes no state; the ropes still run.
  const bool write = !__syncthreads_or(bad) && (p.puts == 0 || !run_failed(p.flag));
  for (int64_t e = thread_index(); e < p.total; e += thread_count()) {
    int64_t u = e;
    bool done = false;
#pragma unroll
    for (int k = 0; k < kMaxRopes; ++k) {
      const RopeTask& t = p.rope[k];
      if (done || k >= p.ropes) continue;
      if (u >= t.r.loop.numel) {
        u -= t.r.loop.numel;
        continue;
      }
      done = true;
      int64_t off[4];
      strided_offsets(t.r.loop, u, off);
      T y1, y2;
      rotate_pair(static_cast<const T*>(t.x), static_cast<const T*>(t.cos),
                  static_cast<const T*>(t.sin), off, t.r.half, &y1, &y2);
      if (t.route < 0) {
        static_cast<T*>(t.out)[off[0]] = y1;
        static_cast<T*>(t.out)[off[0] + t.r.half[0]] = y2;
        continue;
      }
      // The rope's output is contiguous, so its element off[0] is element off[0] of the values.
#pragma unroll
      for (int q = 0; q < kMaxPuts; ++q) {
        if (q == t.route && write) {
          put_element(p.put[q], off[0], y1);
          put_element(p.put[q], off[0] + t.r.half[0], y2);
        }
      }
    }
#pragma unroll
    for (int k = 0; k < kMaxPuts; ++k) {
      const PutTask& t = p.put[k];
      if (done || k >= p.puts || t.values == nullptr) continue;
      if (u >= t.elements) {
        u -= t.elements;
        continue;
      }
      done = true;
      if (write) put_element(t, u, static_cast<const T*>(t.values)[u]);
    }
  }
}

// A group of ops as tasks: which rope feeds which put (`route`), from the graph alone.
struct Plan {
  size_t first = 0, count = 0;
  int ropes = 0, puts = 0;
  size_t rope_op[kMaxRopes] = {}, put_op[kMaxPuts] = {};
  int route[kMaxRopes] = {-1, -1, -1, -1};
  bool routed_put[kMaxPuts] = {};
  DType dtype = DType::kFloat32;
};

// Whether rope `r` can hand its rows to put `p` without writing them: p's values are all of r's
// output, which no other op of the group and nothing after it reads.
bool can_route(const Graph& g, const Plan& plan, const RopeArgs& r, const IndexPutArgs& p) {
  const Tensor& out = g.tensors[size_t(r.out)];
  const Tensor& values = g.tensors[size_t(p.values)];
  if (out.storage != blob::Storage::kArena || values.storage != blob::Storage::kArena ||
      out.offset != values.offset || out.nbytes != values.nbytes || out.dtype != values.dtype ||
      out.numel != p.outer * p.num_positions * p.inner) {
    return false;
  }
  int readers = 0;
  for (size_t k = plan.first; k < plan.first + plan.count; ++k) {
    for_each_tensor(g.ops[k], [&](int64_t t, blob::Role role) {
      if (is_read(role) && share_memory(g, t, r.out)) ++readers;
    });
  }
  return readers == 1 && !read_later(g, arena_range(g, r.out), plan.first + plan.count - 1);
}

const char* make_plan(size_t count, const InitContext& ctx, Plan* plan) {
  if (env_is("KILN_ROPE_APPEND", "off")) return "KILN_ROPE_APPEND=off";
  const Graph& g = ctx.graph;
  if (count < 2) return "fewer than two ops";
  if (count > kMaxOps || ctx.op_index + count > g.ops.size()) return "more ops than a step takes";
  plan->first = ctx.op_index;
  plan->count = count;
  for (size_t k = ctx.op_index; k < ctx.op_index + count; ++k) {
    const Op& op = g.ops[k];
    DType dtype;
    if (op.opcode == Opcode::kRope) {
      if (plan->ropes == kMaxRopes) return "more than four ropes";
      plan->rope_op[plan->ropes++] = k;
      dtype = g.tensors[size_t(std::get<RopeArgs>(op.args).x)].dtype;
    } else if (op.opcode == Opcode::kIndexPut) {
      if (plan->puts == kMaxPuts) return "more than four index_puts";
      const auto& a = std::get<IndexPutArgs>(op.args);
      if (a.num_positions > kSelfCheckedPositions) return "an index_put of over 1024 positions";
      plan->put_op[plan->puts++] = k;
      dtype = g.tensors[size_t(a.out)].dtype;
    } else {
      return "not a rope or an index_put";
    }
    if (dtype != DType::kFloat32 && dtype != DType::kFloat16 && dtype != DType::kBFloat16) {
      return "not a float32, float16 or bfloat16 op";
    }
    if (k > ctx.op_index && dtype != plan->dtype) return "ops of different dtypes";
    plan->dtype = dtype;
  }
  for (int r = 0; r < plan->ropes; ++r) {
    const auto& rope = std::get<RopeArgs>(g.ops[plan->rope_op[r]].args);
    for (int q = 0; q < plan->puts && plan->route[r] < 0; ++q) {
      const auto& put = std::get<IndexPutArgs>(g.ops[plan->put_op[q]].args);
      if (plan->put_op[q] > plan->rope_op[r] && !plan->routed_put[q] &&
          can_route(g, *plan, rope, put)) {
        plan->route[r] = q;
        plan->routed_put[q] = true;
      }
    }
  }
  // The ops run in any order, at once: none may read or write what another writes (a routed
  // rope's output is no longer written, and its put no longer reads it).
  auto routed_out = [&](size_t op) {
    for (int r = 0; r < plan->ropes; ++r) {
      if (plan->rope_op[r] == op && plan->route[r] >= 0) return std::get<RopeArgs>(g.ops[op].args).out;
    }
    return kNoTensor;
  };
  auto routed_values = [&](size_t op) {
    for (int q = 0; q < plan->puts; ++q) {
      if (plan->put_op[q] == op && plan->routed_put[q]) return std::get<IndexPutArgs>(g.ops[op].args).values;
    }
    return kNoTensor;
  };
  bool clash = false;
  for (size_t a = ctx.op_index; a < ctx.op_index + count; ++a) {
    for_each_tensor(g.ops[a], [&](int64_t w, blob::Role role) {
      if (is_read(role) || w == routed_out(a)) return;
      for (size_t b = ctx.op_index; b < ctx.op_index + count; ++b) {
        if (b == a) continue;
        for_each_tensor(g.ops[b], [&](int64_t t, blob::Role) {
          if (t != routed_values(b) && share_memory(g, w, t)) clash = true;
        });
      }
    });
  }
  if (clash) return "an op reads or writes what another op of the group writes";
  return nullptr;
}

class RopeAppendStep final : public Step {
 public:
  RopeAppendStep(const Plan& plan, const Graph& g) : plan_(plan) {
    p_.ropes = plan.ropes;
    p_.puts = plan.puts;
    p_.total = 0;
    for (int r = 0; r < plan.ropes; ++r) {
      rope_[r] = std::get<RopeArgs>(g.ops[plan.rope_op[r]].args);
      p_.rope[r].r = rope_loop(rope_[r]);
      p_.rope[r].route = plan.route[r];
      p_.total += p_.rope[r].r.loop.numel;
    }
    for (int q = 0; q < plan.puts; ++q) {
      put_[q] = std::get<IndexPutArgs>(g.ops[plan.put_op[q]].args);
      PutTask& t = p_.put[q];
      t.outer = put_[q].outer;
      t.num_positions = put_[q].num_positions;
      t.dim_size = put_[q].dim_size;
      t.inner = put_[q].inner;
      t.elements = t.outer * t.num_positions * t.inner;
      t.int64_positions = g.tensors[size_t(put_[q].positions)].dtype == DType::kInt64;
      if (!plan.routed_put[q]) p_.total += t.elements;
    }
    element_ = element_size(plan.dtype);
  }

  Error enqueue(const RunContext& ctx) override {
    RopeAppendParams p = p_;
    auto at = [&](int64_t tensor, int64_t offset) {
      return static_cast<const char*>(ctx.ptr(tensor)) + offset * int64_t(element_);
    };
    for (int r = 0; r < p.ropes; ++r) {
      const RopeArgs& a = rope_[r];
      p.rope[r].out = plan_.route[r] < 0 ? ctx.ptr(a.out) : nullptr;
      p.rope[r].x = at(a.x, a.x_offset);
      p.rope[r].cos = at(a.cos, a.cos_offset);
      p.rope[r].sin = at(a.sin, a.sin_offset);
    }
    for (int q = 0; q < p.puts; ++q) {
      p.put[q].values = plan_.routed_put[q] ? nullptr : ctx.ptr(put_[q].values);
      p.put[q].positions = ctx.ptr(put_[q].positions);
      p.put[q].out = ctx.ptr(put_[q].out);
      p.put[q].op_plus_one = static_cast<unsigned long long>(plan_.put_op[q]) + 1;
    }
    p.flag = ctx.error_flag;
    if (p.total == 0) return Error::Ok;
    const unsigned blocks = blocks_for(p.total, kBlock, ctx.max_blocks);
    visit_floating(plan_.dtype, [&](auto tag) {
      using T = typename decltype(tag)::type;
      launch_overlapped(rope_append_kernel<T>, blocks, kBlock, 0, ctx.stream, p);
    });
    return Error::Ok;
  }

 private:
  Plan plan_;
  RopeAppendParams p_{};
  RopeArgs rope_[kMaxRopes] = {};
  IndexPutArgs put_[kMaxPuts] = {};
  size_t element_ = 4;
};

}  // namespace

const char* rope_append_unsupported(size_t count, const InitContext& ctx) {
  Plan plan;
  return make_plan(count, ctx, &plan);
}

size_t rope_append_length(const InitContext& ctx) {
  const Opcode first = ctx.graph.ops[ctx.op_index].opcode;
  if (first != Opcode::kRope && first != Opcode::kIndexPut) return 0;
  for (size_t count = kMaxOps; count >= 2; --count) {
    if (rope_append_unsupported(count, ctx) == nullptr) return count;
  }
  return 0;
}

StepResult make_rope_append_step(size_t count, const InitContext& ctx) {
  Plan plan;
  if (const char* why = make_plan(count, ctx, &plan)) {
    return fail(nullptr, Error::Internal, "Kiln engine: op %zu: ops %zu..%zu cannot run as one "
                "rope-and-append step (%s)", ctx.op_index, ctx.op_index, ctx.op_index + count - 1,
                why);
  }
  return std::unique_ptr<Step>(new RopeAppendStep(plan, ctx.graph));
}

}  // namespace kiln::engine::kernels
