#include "runtime/engine/kernels/rope.cuh"

#include "runtime/engine/kernels/common.cuh"
#include "runtime/engine/strided.h"

namespace kiln::engine::kernels {
namespace {

using executorch::runtime::Error;

template <typename T, typename Index>
__global__ void rope_kernel(T* __restrict__ out, const T* __restrict__ x, const T* __restrict__ cos,
                            const T* __restrict__ sin, const RopeLoop r) {
  wait_for_previous_kernel();   // launched overlapped (common.cuh)
  allow_next_kernel();
  for (int64_t i = thread_index(); i < r.loop.numel; i += thread_count()) {
    int64_t off[4];
    strided_offsets(r.loop, static_cast<Index>(i), off);
    rotate_pair(x, cos, sin, off, r.half, &out[off[0]], &out[off[0] + r.half[0]]);
  }
}

class RopeStep final : public Step {
 public:
  RopeStep(const RopeArgs& a, const Graph& graph)
      : a_(a), dtype_(graph.tensors[a.x].dtype), r_(rope_loop(a)) {}

  Error enqueue(const RunContext& ctx) override {
    if (r_.loop.numel == 0) {
      return Error::Ok;
    }
    visit_floating(dtype_, [&](auto tag) {
      using T = typename decltype(tag)::type;
      T* out = static_cast<T*>(ctx.ptr(a_.out));
      const T* x = static_cast<const T*>(ctx.ptr(a_.x)) + a_.x_offset;
      const T* cos = static_cast<const T*>(ctx.ptr(a_.cos)) + a_.cos_offset;
      const T* sin = static_cast<const T*>(ctx.ptr(a_.sin)) + a_.sin_offset;
      const unsigned blocks = blocks_for(r_.loop.numel, kBlock, ctx.max_blocks);
      if (r_.loop.numel < (int64_t{1} << 31)) {
        launch_overlapped(rope_kernel<T, uint32_t>, blocks, kBlock, 0, ctx.stream, out, x, cos, sin,
                          r_);
      } else {
        launch_overlapped(rope_kernel<T, int64_t>, blocks, kBlock, 0, ctx.stream, out, x, cos, sin,
                          r_);
      }
    });
    return Error::Ok;
  }

 private:
  RopeArgs a_;
  blob::DType dtype_;
  RopeLoop r_;
};

}  // namespace

RopeLoop rope_loop(const RopeArgs& a) {
  int64_t out_strides[blob::kMaxRank];
  contiguous_strides(a.rank, a.sizes, out_strides);
  const uint32_t last = a.rank - 1;
  const int64_t h = a.sizes[last] / 2;
  int64_t sizes[blob::kMaxRank];
  for (uint32_t d = 0; d < a.rank; ++d) sizes[d] = a.sizes[d];
  sizes[last] = h;
  const int64_t* strides[4] = {out_strides, a.x_strides, a.cos_strides, a.sin_strides};
  RopeLoop r;
  for (int k = 0; k < 4; ++k) r.half[k] = h * strides[k][last];
  r.loop = collapse<4>(a.rank, sizes, strides);
  return r;
}

StepResult make_rope_step(const RopeArgs& args, const InitContext& ctx) {
  return std::unique_ptr<Step>(new RopeStep(args, ctx.graph));
}

}  // namespace kiln::engine::kernels
