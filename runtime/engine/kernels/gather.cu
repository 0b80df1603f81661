#include "runtime/engine/kernels/gather.cuh"

#include "runtime/engine/kernels/common.cuh"
#include "runtime/engine/strided.h"

namespace kiln::engine::kernels {
namespace {

using blob::DType;
using executorch::runtime::Error;

// Operand 0 of the loop is out (contiguous), 1 is x, 2 is the index tensor.
template <typename Word, typename Index>
__global__ void gather_kernel(Word* __restrict__ out, const Word* __restrict__ x,
                              const Index* __restrict__ index, const StridedLoop<3> loop,
                              int64_t index_stride, int64_t dim_size,
                              DeviceErrorFlag* __restrict__ flag, unsigned long long op_plus_one) {
  for (int64_t i = thread_index(); i < loop.numel; i += thread_count()) {
    int64_t off[3];
    strided_offsets(loop, i, off);
    int64_t at = static_cast<int64_t>(index[off[2]]);
    if (at < 0) {
      at += dim_size;
    }
    if (at >= 0 && at < dim_size) {
      out[off[0]] = x[off[1] + at * index_stride];
    } else {
      out[off[0]] = Word{};
      if (atomicCAS(&flag->op_plus_one, 0ull, op_plus_one) == 0ull) {
        flag->index = static_cast<long long>(index[off[2]]);
        flag->position = off[2];
      }
    }
  }
}

template <typename Word>
void launch(void* out, const void* x, const void* index, bool int64_index,
            const StridedLoop<3>& loop, int64_t index_stride, int64_t dim_size,
            const RunContext& ctx) {
  const unsigned blocks = blocks_for(loop.numel, kBlock, ctx.max_blocks);
  const auto op = static_cast<unsigned long long>(ctx.op_index) + 1;
  if (int64_index) {
    gather_kernel<Word, int64_t><<<blocks, kBlock, 0, ctx.stream>>>(
        static_cast<Word*>(out), static_cast<const Word*>(x), static_cast<const int64_t*>(index),
        loop, index_stride, dim_size, ctx.error_flag, op);
  } else {
    gather_kernel<Word, int32_t><<<blocks, kBlock, 0, ctx.stream>>>(
        static_cast<Word*>(out), static_cast<const Word*>(x), static_cast<const int32_t*>(index),
        loop, index_stride, dim_size, ctx.error_flag, op);
  }
}

class GatherStep final : public Step {
 public:
  GatherStep(const GatherArgs& a, const Graph& graph)
      : a_(a),
        element_(element_size(graph.tensors[a.x].dtype)),
        int64_index_(graph.tensors[a.index].dtype == DType::kInt64) {
    int64_t out_strides[blob::kMaxRank];
    contiguous_strides(a.rank, a.sizes, out_strides);
    const int64_t* strides[3] = {out_strides, a.x_strides, a.index_strides};
    loop_ = collapse<3>(a.rank, a.sizes, strides);
  }

  Error enqueue(const RunContext& ctx) override {
    if (loop_.numel == 0) {
      return Error::Ok;
    }
    void* out = ctx.ptr(a_.out);
    const void* x = ctx.ptr(a_.x);
    const void* index = ctx.ptr(a_.index);
    switch (element_) {
      case 1:
        launch<uint8_t>(out, x, index, int64_index_, loop_, a_.index_stride, a_.dim_size, ctx);
        break;
      case 2:
        launch<uint16_t>(out, x, index, int64_index_, loop_, a_.index_stride, a_.dim_size, ctx);
        break;
      case 4:
        launch<uint32_t>(out, x, index, int64_index_, loop_, a_.index_stride, a_.dim_size, ctx);
        break;
      default:
        launch<uint64_t>(out, x, index, int64_index_, loop_, a_.index_stride, a_.dim_size, ctx);
        break;
    }
    return Error::Ok;
  }

 private:
  GatherArgs a_;
  size_t element_;
  bool int64_index_;
  StridedLoop<3> loop_;
};

}  // namespace

StepResult make_gather_step(const GatherArgs& args, const InitContext& ctx) {
  return std::unique_ptr<Step>(new GatherStep(args, ctx.graph));
}

}  // namespace kiln::engine::kernels
