// The layout of kQuantMatmul's packed weight (op_table.def says what it holds), shared by the
// reader's checks, the engine's kernel and the builder's tests.
#pragma once

#include <cstdint>

namespace kiln::engine::blob {

/// Bytes per vector load of the quantized kernels: every packed row is padded to a multiple.
inline constexpr int64_t kQuantRowAlignment = 16;

/// Int32 words per packed row of K `bits`-bit values, or -1 when the count overflows int64.
constexpr int64_t quant_row_words(int64_t k, int64_t bits) {
  if (k < 0 || bits <= 0 || k > (INT64_MAX - 127) / bits) return -1;
  const int64_t vectors = (k * bits + 8 * kQuantRowAlignment - 1) / (8 * kQuantRowAlignment);
  return vectors * (kQuantRowAlignment / 4);
}

}  // namespace kiln::engine::blob
