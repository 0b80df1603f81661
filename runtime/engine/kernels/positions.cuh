// The device-side check of a state write's positions (kIndexPut, and the rope-and-append step
// that runs kIndexPut ops with the ropes before them): a position outside [0, dim_size) is
// recorded in the run's DeviceErrorFlag and the write is skipped, so the state stays unchanged.
#pragma once

#include <cstdint>

#include "runtime/engine/step.h"

namespace kiln::engine::kernels {

// Whether any of the positions this thread checks (i = threadIdx.x, + blockDim.x, ...) is outside
// [0, dim_size); the first bad one any thread finds is recorded in the flag.
template <typename Index>
__device__ __forceinline__ bool flag_bad_positions(const Index* __restrict__ positions,
                                                   int64_t num_positions, int64_t dim_size,
                                                   DeviceErrorFlag* __restrict__ flag,
                                                   unsigned long long op_plus_one) {
  bool bad = false;
  for (int64_t i = threadIdx.x; i < num_positions; i += blockDim.x) {
    const int64_t p = static_cast<int64_t>(positions[i]);
    if (p < 0 || p >= dim_size) {
      bad = true;
      if (atomicCAS(&flag->op_plus_one, 0ull, op_plus_one) == 0ull) {
        flag->index = p;
        flag->position = i;
      }
    }
  }
  return bad;
}

// Whether an op before this one in the run has recorded an error (then a state write is skipped).
__device__ __forceinline__ bool run_failed(const DeviceErrorFlag* flag) {
  return *reinterpret_cast<const volatile unsigned long long*>(&flag->op_plus_one) != 0;
}

// Up to this many positions every block of a write checks them all itself before it writes (a
// decode's one row, a prefill chunk's 128): one launch instead of a check kernel and the write.
inline constexpr int64_t kSelfCheckedPositions = 1024;

}  // namespace kiln::engine::kernels
