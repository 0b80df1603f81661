#include "runtime/engine/kernels/rope.cuh"

#include "runtime/engine/kernels/common.cuh"
#include "runtime/engine/strided.h"

namespace kiln::engine::kernels {
namespace {

using executorch::runtime::Error;

// Operands of the loop: 0 out, 1 x, 2 cos, 3 sin, over `sizes` with the last size halved; `half`
// holds each operand's step from element d to element d + h.
struct Halves {
  int64_t step[4];
};

template <typename T, typename Index>
__global__ void rope_kernel(T* __restrict__ out, const T* __restrict__ x, const T* __restrict__ cos,
                            const T* __restrict__ sin, const StridedLoop<4> loop,
                            const Halves half) {
  wait_for_previous_kernel();   // launched overlapped (common.cuh)
  allow_next_kernel();
  for (int64_t i = thread_index(); i < loop.numel; i += thread_count()) {
    int64_t off[4];
    strided_offsets(loop, static_cast<Index>(i), off);
    const float x1 = to_float(x[off[1]]);
    const float x2 = to_float(x[off[1] + half.step[1]]);
    const float c1 = to_float(cos[off[2]]);
    const float c2 = to_float(cos[off[2] + half.step[2]]);
    const float s1 = to_float(sin[off[3]]);
    const float s2 = to_float(sin[off[3] + half.step[3]]);
    out[off[0]] = from_float<T>(x1 * c1 - x2 * s1);
    out[off[0] + half.step[0]] = from_float<T>(x2 * c2 + x1 * s2);
  }
}

class RopeStep final : public Step {
 public:
  RopeStep(const RopeArgs& a, const Graph& graph) : a_(a), dtype_(graph.tensors[a.x].dtype) {
    int64_t out_strides[blob::kMaxRank];
    contiguous_strides(a.rank, a.sizes, out_strides);
    const uint32_t last = a.rank - 1;
    const int64_t h = a.sizes[last] / 2;
    int64_t sizes[blob::kMaxRank];
    for (uint32_t d = 0; d < a.rank; ++d) sizes[d] = a.sizes[d];
    sizes[last] = h;
    const int64_t* strides[4] = {out_strides, a.x_strides, a.cos_strides, a.sin_strides};
    for (int k = 0; k < 4; ++k) half_.step[k] = h * strides[k][last];
    loop_ = collapse<4>(a.rank, sizes, strides);
  }

  Error enqueue(const RunContext& ctx) override {
    if (loop_.numel == 0) {
      return Error::Ok;
    }
    visit_floating(dtype_, [&](auto tag) {
      using T = typename decltype(tag)::type;
      T* out = static_cast<T*>(ctx.ptr(a_.out));
      const T* x = static_cast<const T*>(ctx.ptr(a_.x)) + a_.x_offset;
      const T* cos = static_cast<const T*>(ctx.ptr(a_.cos)) + a_.cos_offset;
      const T* sin = static_cast<const T*>(ctx.ptr(a_.sin)) + a_.sin_offset;
      const unsigned blocks = blocks_for(loop_.numel, kBlock, ctx.max_blocks);
      if (loop_.numel < (int64_t{1} << 31)) {
        launch_overlapped(rope_kernel<T, uint32_t>, blocks, kBlock, 0, ctx.stream, out, x, cos, sin,
                          loop_, half_);
      } else {
        launch_overlapped(rope_kernel<T, int64_t>, blocks, kBlock, 0, ctx.stream, out, x, cos, sin,
                          loop_, half_);
      }
    });
    return Error::Ok;
  }

 private:
  RopeArgs a_;
  blob::DType dtype_;
  Halves half_{};
  StridedLoop<4> loop_;
};

}  // namespace

StepResult make_rope_step(const RopeArgs& args, const InitContext& ctx) {
  return std::unique_ptr<Step>(new RopeStep(args, ctx.graph));
}

}  // namespace kiln::engine::kernels
