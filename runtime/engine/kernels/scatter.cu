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

template <typename T, bool kAccumulate>
__global__ void scatter_kernel(T* __restrict__ out, const T* __restrict__ values,
                               const StridedLoop<kOperands> loop, const IndexSet ix,
                               DeviceErrorFlag* __restrict__ flag, unsigned long long op_plus_one) {
  for (int64_t i = thread_index(); i < loop.numel; i += thread_count()) {
    int64_t off[kOperands];
    strided_offsets(loop, i, off);
    int64_t at = off[0];
    bool in_range = true;
    for (uint32_t k = 0; k < ix.count; ++k) {
      const int64_t raw = (ix.int64_mask >> k) & 1u
                              ? static_cast<const int64_t*>(ix.data[k])[off[2 + k]]
                              : static_cast<const int32_t*>(ix.data[k])[off[2 + k]];
      const int64_t p = raw < 0 ? raw + ix.dim_size[k] : raw;
      if (p < 0 || p >= ix.dim_size[k]) {
        if (atomicCAS(&flag->op_plus_one, 0ull, op_plus_one) == 0ull) {
          flag->index = static_cast<long long>(raw);
          flag->position = off[2 + k];
          flag->tensor = k;
        }
        in_range = false;
        break;
      }
      at += p * ix.out_stride[k];
    }
    if (!in_range) {
      continue;
    }
    if constexpr (kAccumulate) {
      atomic_accumulate(out + at, values[off[1]]);
    } else {
      out[at] = values[off[1]];
    }
  }
}

class ScatterStep final : public Step {
 public:
  ScatterStep(const ScatterArgs& a, const Graph& graph)
      : a_(a), dtype_(graph.tensors[a.out].dtype) {
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
      if (a_.accumulate != 0) {
        scatter_kernel<T, true><<<blocks, kBlock, 0, ctx.stream>>>(
            static_cast<T*>(out), static_cast<const T*>(values), loop_, ix, ctx.error_flag, op);
      } else {
        scatter_kernel<T, false><<<blocks, kBlock, 0, ctx.stream>>>(
            static_cast<T*>(out), static_cast<const T*>(values), loop_, ix, ctx.error_flag, op);
      }
    });
    return Error::Ok;
  }

 private:
  ScatterArgs a_;
  DType dtype_;
  IndexSet ix_;
  StridedLoop<kOperands> loop_;
};

}  // namespace

StepResult make_scatter_step(const ScatterArgs& args, const InitContext& ctx) {
  return std::unique_ptr<Step>(new ScatterStep(args, ctx.graph));
}

}  // namespace kiln::engine::kernels
