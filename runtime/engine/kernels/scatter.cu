#include "runtime/engine/kernels/scatter.cuh"

#include "runtime/engine/kernels/common.cuh"
#include "runtime/engine/strided.h"

namespace kiln::engine::kernels {
namespace {

using blob::DType;
using blob::kMaxScatterIndices;
using executorch::runtime::Error;

// Loop operand 0 is out's base position, 1 is values, 2 + k is index tensor k.
constexpr int kOperands = 2 + static_cast<int>(kMaxScatterIndices);

struct IndexSet {
  const void* data[kMaxScatterIndices];
  int64_t out_stride[kMaxScatterIndices];
  int64_t dim_size[kMaxScatterIndices];
  uint32_t int64_mask;  // bit k: index k is Int64 (else Int32)
  uint32_t count;
};

// Adds v to *p in one atomic step. Bool adds as logical or (torch's accumulate on Bool).
template <typename T>
__device__ __forceinline__ void atomic_accumulate(T* p, T v) {
  if constexpr (std::is_same_v<T, int64_t>) {
    atomicAdd(reinterpret_cast<unsigned long long*>(p), static_cast<unsigned long long>(v));
  } else if constexpr (std::is_same_v<T, uint8_t>) {
    if (v != 0) {
      *p = 1;  // every writer stores the same byte: no read-modify-write is needed
    }
  } else {
    atomicAdd(p, v);  // float, int32_t, __half, __nv_bfloat16 (sm_80+)
  }
}

// The element's position in out for iteration index i, or -1 when one of its indices is out of
// range (recorded in the flag when kReport: one pass over the elements reports).
template <bool kReport>
__device__ __forceinline__ int64_t position(const StridedLoop<kOperands>& loop, const IndexSet& ix,
                                            int64_t i, int64_t (&off)[kOperands],
                                            DeviceErrorFlag* flag, unsigned long long op_plus_one) {
  strided_offsets(loop, i, off);
  int64_t at = off[0];
  for (uint32_t k = 0; k < ix.count; ++k) {
    const int64_t raw = (ix.int64_mask >> k) & 1u
                            ? static_cast<const int64_t*>(ix.data[k])[off[2 + k]]
                            : static_cast<const int32_t*>(ix.data[k])[off[2 + k]];
    const int64_t p = raw < 0 ? raw + ix.dim_size[k] : raw;
    if (p < 0 || p >= ix.dim_size[k]) {
      if (kReport && atomicCAS(&flag->op_plus_one, 0ull, op_plus_one) == 0ull) {
        flag->index = static_cast<long long>(raw);
        flag->position = off[2 + k];
        flag->tensor = k;
      }
      return -1;
    }
    at += p * ix.out_stride[k];
  }
  return at;
}

template <typename T>
__global__ void accumulate_kernel(T* __restrict__ out, const T* __restrict__ values,
                                  const StridedLoop<kOperands> loop, const IndexSet ix,
                                  DeviceErrorFlag* __restrict__ flag,
                                  unsigned long long op_plus_one) {
  for (int64_t i = thread_index(); i < loop.numel; i += thread_count()) {
    int64_t off[kOperands];
    const int64_t at = position<true>(loop, ix, i, off, flag, op_plus_one);
    if (at >= 0) {
      atomic_accumulate(out + at, values[off[1]]);
    }
  }
}

// Replacing writes take three passes so that of duplicate positions the element latest in
// iteration order wins, as in torch's CPU kernel (not whichever thread stores last): each written
// position's slot of `winner` (one per element of out, in the workspace) is cleared, every
// element raises it to its iteration index + 1, and the element that holds it writes.
template <typename W>
__global__ void clear_kernel(W* __restrict__ winner, const StridedLoop<kOperands> loop,
                             const IndexSet ix, DeviceErrorFlag* __restrict__ flag,
                             unsigned long long op_plus_one) {
  for (int64_t i = thread_index(); i < loop.numel; i += thread_count()) {
    int64_t off[kOperands];
    const int64_t at = position<true>(loop, ix, i, off, flag, op_plus_one);
    if (at >= 0) {
      winner[at] = 0;
    }
  }
}

template <typename W>
__global__ void elect_kernel(W* __restrict__ winner, const StridedLoop<kOperands> loop,
                             const IndexSet ix) {
  for (int64_t i = thread_index(); i < loop.numel; i += thread_count()) {
    int64_t off[kOperands];
    const int64_t at = position<false>(loop, ix, i, off, nullptr, 0);
    if (at >= 0) {
      atomicMax(winner + at, static_cast<W>(i + 1));
    }
  }
}

template <typename T, typename W>
__global__ void write_kernel(T* __restrict__ out, const T* __restrict__ values,
                             const W* __restrict__ winner, const StridedLoop<kOperands> loop,
                             const IndexSet ix) {
  for (int64_t i = thread_index(); i < loop.numel; i += thread_count()) {
    int64_t off[kOperands];
    const int64_t at = position<false>(loop, ix, i, off, nullptr, 0);
    if (at >= 0 && winner[at] == static_cast<W>(i + 1)) {
      out[at] = values[off[1]];
    }
  }
}

template <typename T, typename W>
void launch_replace(T* out, const T* values, void* workspace, const StridedLoop<kOperands>& loop,
                    const IndexSet& ix, unsigned blocks, const RunContext& ctx,
                    unsigned long long op) {
  W* winner = static_cast<W*>(workspace);
  clear_kernel<W><<<blocks, kBlock, 0, ctx.stream>>>(winner, loop, ix, ctx.error_flag, op);
  elect_kernel<W><<<blocks, kBlock, 0, ctx.stream>>>(winner, loop, ix);
  write_kernel<T, W><<<blocks, kBlock, 0, ctx.stream>>>(out, values, winner, loop, ix);
}

class ScatterStep final : public Step {
 public:
  ScatterStep(const ScatterArgs& a, const Graph& graph)
      : a_(a), dtype_(graph.tensors[a.out].dtype), out_numel_(graph.tensors[a.out].numel) {
    int64_t unused[blob::kMaxRank] = {};  // the loop operands of absent index tensors
    const int64_t* strides[kOperands];
    strides[0] = a.out_strides;
    strides[1] = a.values_strides;
    ix_.int64_mask = 0;
    ix_.count = a.num_indices;
    for (uint32_t k = 0; k < kMaxScatterIndices; ++k) {
      strides[2 + k] = k < a.num_indices ? a.index_strides[k] : unused;
      ix_.data[k] = nullptr;
      ix_.out_stride[k] = k < a.num_indices ? a.index_out_strides[k] : 0;
      ix_.dim_size[k] = k < a.num_indices ? a.dim_sizes[k] : 0;
      if (k < a.num_indices && graph.tensors[a.indices[k]].dtype == DType::kInt64) {
        ix_.int64_mask |= 1u << k;
      }
    }
    loop_ = collapse<kOperands>(a.rank, a.sizes, strides);
    wide_winner_ = loop_.numel >= int64_t{0xFFFFFFFF};  // iteration index + 1 in 32 bits?
  }

  Error enqueue(const RunContext& ctx) override {
    if (loop_.numel == 0) {
      return Error::Ok;
    }
    IndexSet ix = ix_;
    for (uint32_t k = 0; k < a_.num_indices; ++k) {
      ix.data[k] = ctx.ptr(a_.indices[k]);
    }
    const unsigned blocks = blocks_for(loop_.numel, kBlock, ctx.max_blocks);
    const auto op = static_cast<unsigned long long>(ctx.op_index) + 1;
    void* out = ctx.ptr(a_.out);
    const void* values = ctx.ptr(a_.values);
    visit_dtype(dtype_, [&](auto tag) {
      using T = typename decltype(tag)::type;
      T* o = static_cast<T*>(out);
      const T* v = static_cast<const T*>(values);
      if (a_.accumulate != 0) {
        accumulate_kernel<T><<<blocks, kBlock, 0, ctx.stream>>>(o, v, loop_, ix, ctx.error_flag,
                                                                 op);
      } else if (wide_winner_) {
        launch_replace<T, unsigned long long>(o, v, ctx.workspace, loop_, ix, blocks, ctx, op);
      } else {
        launch_replace<T, unsigned int>(o, v, ctx.workspace, loop_, ix, blocks, ctx, op);
      }
    });
    return Error::Ok;
  }

  size_t workspace_bytes() const override {
    if (a_.accumulate != 0 || loop_.numel == 0) {
      return 0;
    }
    return static_cast<size_t>(out_numel_) *
           (wide_winner_ ? sizeof(unsigned long long) : sizeof(unsigned int));
  }

 private:
  ScatterArgs a_;
  DType dtype_;
  int64_t out_numel_;
  bool wide_winner_ = false;
  IndexSet ix_;
  StridedLoop<kOperands> loop_;
};

}  // namespace

StepResult make_scatter_step(const ScatterArgs& args, const InitContext& ctx) {
  return std::unique_ptr<Step>(new ScatterStep(args, ctx.graph));
}

}  // namespace kiln::engine::kernels
