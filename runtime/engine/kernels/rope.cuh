// kRope: rotary position embedding in its rotate-half form, one pass that reads x in place
// (through the view the model wrote, e.g. before its head transpose) and writes the rotated heads
// contiguous. Each thread rotates one pair (d, d + head_dim / 2) of one row.
#pragma once

#include "runtime/engine/kernels/common.cuh"
#include "runtime/engine/step.h"
#include "runtime/engine/strided.h"

namespace kiln::engine::kernels {

/// A rope's iteration space: the pairs (d, d + h) of its rows, over its sizes with the last one
/// halved. Operands: 0 out (contiguous), 1 x, 2 cos, 3 sin; half[k] is operand k's step from
/// element d to element d + h. The rope-and-append step (rope_append.cuh) walks it too.
struct RopeLoop {
  StridedLoop<4> loop;
  int64_t half[4];
};

RopeLoop rope_loop(const RopeArgs& args);

/// The rotated pair at offsets `off` (from strided_offsets over the loop): x * cos + rotate_half(x)
/// * sin in fp32, each rounded once to T.
template <typename T>
__device__ __forceinline__ void rotate_pair(const T* __restrict__ x, const T* __restrict__ cos,
                                            const T* __restrict__ sin, const int64_t (&off)[4],
                                            const int64_t (&half)[4], T* y1, T* y2) {
  const float x1 = to_float(x[off[1]]);
  const float x2 = to_float(x[off[1] + half[1]]);
  const float c1 = to_float(cos[off[2]]);
  const float c2 = to_float(cos[off[2] + half[2]]);
  const float s1 = to_float(sin[off[3]]);
  const float s2 = to_float(sin[off[3] + half[3]]);
  *y1 = from_float<T>(x1 * c1 - x2 * s1);
  *y2 = from_float<T>(x2 * c2 + x1 * s2);
}

StepResult make_rope_step(const RopeArgs& args, const InitContext& ctx);

}  // namespace kiln::engine::kernels
