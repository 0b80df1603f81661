// Strided iteration spaces shared by several operands (copy, binary, where), simplified on the
// host before a launch: fewer dimensions means fewer divisions per element in the kernel.
#pragma once

#include <cstdint>

#include "format/blob_format.h"

namespace kiln::engine {

/// `kOperands` operands walked together over `sizes` (outermost first). Element `i` in row-major
/// order over `sizes` is at `sum_d idx_d * strides[k][d]` in operand k (plus that operand's base
/// offset, which callers fold into its pointer). Trivially copyable: it is a kernel parameter.
template <int kOperands>
struct StridedLoop {
  int32_t rank = 0;
  int64_t numel = 1;
  int64_t sizes[blob::kMaxRank] = {};
  int64_t strides[kOperands][blob::kMaxRank] = {};
};

/// Row-major (C-contiguous) strides of `sizes`.
inline void contiguous_strides(uint32_t rank, const int64_t* sizes, int64_t* strides) {
  int64_t s = 1;
  for (uint32_t d = rank; d-- > 0;) {
    strides[d] = s;
    s *= sizes[d];
  }
}

/// Builds the loop and simplifies it without changing which elements pair up: dimensions of size 1
/// are dropped, and a dimension is merged into the one outside it when every operand steps
/// through both as one (outer stride == inner stride * inner size).
template <int kOperands>
StridedLoop<kOperands> collapse(uint32_t rank, const int64_t* sizes,
                                const int64_t* const (&strides)[kOperands]) {
  StridedLoop<kOperands> loop;
  for (uint32_t d = 0; d < rank; ++d) {
    loop.numel *= sizes[d];
  }
  if (loop.numel == 0) {
    return loop;  // nothing to walk
  }
  for (uint32_t d = 0; d < rank; ++d) {
    if (sizes[d] == 1) {
      continue;
    }
    if (loop.rank > 0) {
      const int32_t last = loop.rank - 1;
      bool mergeable = true;
      for (int k = 0; k < kOperands; ++k) {
        mergeable = mergeable && loop.strides[k][last] == strides[k][d] * sizes[d];
      }
      if (mergeable) {
        loop.sizes[last] *= sizes[d];
        for (int k = 0; k < kOperands; ++k) {
          loop.strides[k][last] = strides[k][d];
        }
        continue;
      }
    }
    loop.sizes[loop.rank] = sizes[d];
    for (int k = 0; k < kOperands; ++k) {
      loop.strides[k][loop.rank] = strides[k][d];
    }
    ++loop.rank;
  }
  return loop;
}

/// True when operand k walks memory densely in element order (after collapse: rank <= 1 with
/// unit stride), so the operation is a plain contiguous pass over it.
template <int kOperands>
bool is_dense(const StridedLoop<kOperands>& loop, int k) {
  return loop.rank == 0 || (loop.rank == 1 && loop.strides[k][0] == 1);
}

/// Widens the element of a loop to `factor` consecutive elements (e.g. four fp32 as one 16-byte
/// word) when every operand's innermost dimension is unit-stride, the innermost size and every
/// other stride are multiples of `factor`, and each operand's element offset `offsets[k]` is too.
/// Returns false and leaves the loop alone otherwise.
template <int kOperands>
bool widen(StridedLoop<kOperands>& loop, const int64_t (&offsets)[kOperands], int64_t factor) {
  if (loop.rank == 0 || loop.sizes[loop.rank - 1] % factor != 0) {
    return false;
  }
  const int32_t inner = loop.rank - 1;
  for (int k = 0; k < kOperands; ++k) {
    if (loop.strides[k][inner] != 1 || offsets[k] % factor != 0) {
      return false;
    }
    for (int32_t d = 0; d < inner; ++d) {
      if (loop.strides[k][d] % factor != 0) {
        return false;
      }
    }
  }
  loop.sizes[inner] /= factor;
  loop.numel /= factor;
  for (int k = 0; k < kOperands; ++k) {
    for (int32_t d = 0; d < inner; ++d) {
      loop.strides[k][d] /= factor;
    }
  }
  return true;
}

}  // namespace kiln::engine
