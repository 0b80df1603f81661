#include "runtime/engine/kernels/quant_matmul.cuh"

#include <cstdlib>
#include <cstring>
#include <type_traits>

#include "format/fail.h"
#include "format/quant_layout.h"
#include "runtime/engine/cuda_check.h"
#include "runtime/engine/kernels/common.cuh"
#include "runtime/engine/kernels/elementwise_math.cuh"
#include "runtime/engine/kernels/matmul.cuh"
#include "runtime/engine/env_switch.h"

namespace kiln::engine::kernels {
namespace {

using blob::DType;
using blob::Epilogue;
using executorch::runtime::Error;

// Warps per block, each computing one output row (n) for up to kMaxRows activation rows.
constexpr int kWarps = 8;
// Activation rows one block holds (a larger M runs over chunks of this many rows).
constexpr int kMaxRows = 16;
// fp32 activations one block stages in shared memory per K tile (32 KiB, all rows together).
constexpr int kStagedFloats = 8192;
// 16-byte weight vectors each lane has in flight before it computes: 4 KiB a warp, so that even
// a grid of few rows (N = 2048 at K = 8192: 2048 warps, ~16 an SM) keeps ~64 KiB an SM in flight,
// about twice what the H200's bandwidth-latency product asks of each SM.
constexpr int kUnroll = 8;

// The 16-byte weight vector's values as floats. int8: byte e is element e. int4: byte j holds
// elements 2j (low nibble) and 2j + 1 (high nibble). The integers are exact: a biased byte b goes
// into the low mantissa bits of 2^23 (a PRMT) and the bias comes off with one FADD, cheaper than
// an I2F per element.
template <int kBits>
__device__ __forceinline__ void dequantize(const uint4& v, float (&w)[128 / kBits]) {
  const uint32_t words[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    if constexpr (kBits == 8) {
      const uint32_t biased = words[i] ^ 0x80808080u;   // int8 v -> v + 128 in each byte
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        w[4 * i + j] = __int_as_float(__byte_perm(biased, 0x4B000000u, 0x7440u + j)) - 8388736.0f;
      }
    } else {
      const uint32_t biased = words[i] ^ 0x88888888u;   // int4 v -> v + 8 in each nibble
      const uint32_t lo = biased & 0x0F0F0F0Fu, hi = (biased >> 4) & 0x0F0F0F0Fu;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        w[8 * i + 2 * j] = __int_as_float(__byte_perm(lo, 0x4B000000u, 0x7440u + j)) - 8388616.0f;
        w[8 * i + 2 * j + 1] =
            __int_as_float(__byte_perm(hi, 0x4B000000u, 0x7440u + j)) - 8388616.0f;
      }
    }
  }
}

// Shared-memory position of element e of staged weight vector c (both tile-relative). The 4-float
// pieces of each vector are XOR-swizzled so that the 8 lanes of one 128-bit shared-memory phase,
// which read piece p of 8 consecutive vectors, hit 8 different bank groups (unswizzled, lanes 16
// floats apart would share banks 4 ways for int8).
template <int kElems>
__device__ __forceinline__ int staged_index(int c, int e) {
  constexpr int kPieces = kElems / 4;
  const int swizzle = (c / (8 / kPieces)) % kPieces;
  return c * kElems + (((e / 4) ^ swizzle) * 4) + (e % 4);
}

// The decode kernel's int4 values for 16-bit activations, cheaper than dequantize<4>: each is
// 0.5 + (v + 8) / 256 (the biased nibble in the mantissa of 0.5, a PRMT and no FADD), so a
// vector's sum of w * x is (dot - 136 * sum(x) / 256) * 256 in place of the exact dot: the
// activations' sum over the vector is staged once per tile for every output row. Cancelling the
// 0.5 costs a few bits of the fp32 sum, far below a 16-bit result's rounding; fp32 programs
// keep the exact values.
__device__ __forceinline__ void dequantize_offset4(const uint4& v, float (&w)[32]) {
  const uint32_t words[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const uint32_t biased = words[i] ^ 0x88888888u;
    const uint32_t lo = biased & 0x0F0F0F0Fu, hi = (biased >> 4) & 0x0F0F0F0Fu;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      w[8 * i + 2 * j] = __int_as_float(__byte_perm(lo, 0x3F000000u, 0x7044u + (j << 8)));
      w[8 * i + 2 * j + 1] = __int_as_float(__byte_perm(hi, 0x3F000000u, 0x7044u + (j << 8)));
    }
  }
}

struct Shape {
  int64_t m, n, k;
  int64_t row_vectors;   // 16-byte vectors per packed weight row
  int64_t groups, group_size;
  int group_shift;       // log2(group_size / values per vector), or -1: divide
  int chunks;            // ceil(M / kRowsPerChunk)
  bool wide;             // x (and a folded gate's second input) staged with 16-byte loads
};

// out[m, n] = act(sum_k x[m, k] * q[n, k] * scale(n, k) + bias[n] + residual[m, n]). Block b
// computes output rows of row block b / chunks for the activation rows of chunk b % chunks (chunks
// of one row block are consecutive blocks, so they run together and re-read the weight from L2).
// Each warp computes kWarpRows consecutive output rows: a short packed row (int4 at K = 2048 is
// 64 vectors, two a lane) would otherwise leave most of a lane's kUnroll loads idle, and the
// bytes each warp has in flight are what bound a decode (registers allow ~3 blocks an SM).
// kGlu: x is a SwiGLU / GeGLU gate's first input and the activations are act(x) * glu_b, staged
// as glu_kernel rounds them (the down projection with its gate folded in). Launched overlapped
// (launch_overlapped): the first weight vectors are requested before the kernel before has
// finished.
template <typename T, int kRows, int kBits, int kWarpRows, bool kGlu>
__global__ void __launch_bounds__(kWarps * 32)
    quant_matmul_kernel(const T* __restrict__ x, const uint4* __restrict__ weight,
                        const float* __restrict__ scales, const T* __restrict__ bias,
                        const T* __restrict__ residual, T* __restrict__ out, const Shape s,
                        const Epilogue act, const T* __restrict__ glu_b,
                        const blob::UnaryKind glu_act) {
  constexpr int kElems = 128 / kBits;                 // values per 16-byte vector
  constexpr int kTile = kStagedFloats / kRows;        // K values staged per row
  constexpr int kTileVectors = kTile / kElems;
  constexpr int kLoads = kUnroll / kWarpRows;         // vectors in flight per lane and row
  constexpr bool kOffset = kBits == 4 && !std::is_same<T, float>::value;
  constexpr int kVec = 16 / int(sizeof(T));           // x values per 16-byte load
  __shared__ __align__(16) float staged[kRows * kTile];
  __shared__ float vector_sums[kOffset ? kRows * kTileVectors : 1];   // kOffset: sum(x) a vector

  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int64_t chunk = blockIdx.x % s.chunks;
  const int64_t n0 = ((blockIdx.x / s.chunks) * kWarps + warp) * kWarpRows;
  const int64_t m0 = chunk * kRows;
  const int rows = static_cast<int>(s.m - m0 < kRows ? s.m - m0 : kRows);
  const uint4* w_rows[kWarpRows];
#pragma unroll
  for (int i = 0; i < kWarpRows; ++i) {
    w_rows[i] = weight + (n0 + i < s.n ? n0 + i : 0) * s.row_vectors;
  }

  float acc[kWarpRows][kRows];
#pragma unroll
  for (int i = 0; i < kWarpRows; ++i) {
#pragma unroll
    for (int r = 0; r < kRows; ++r) acc[i][r] = 0.0f;
  }

  const int64_t padded_k = s.row_vectors * kElems;
  for (int64_t t0 = 0; t0 < padded_k; t0 += kTile) {
    // Only the columns this tile's vectors read (a short K stages K, not a whole tile).
    const int columns = static_cast<int>(padded_k - t0 < kTile ? padded_k - t0 : kTile);
    const int64_t v0 = t0 / kElems;
    const int vectors = static_cast<int>(
        s.row_vectors - v0 < kTileVectors ? s.row_vectors - v0 : kTileVectors);
    // The tile's first weight vectors are requested before the activations are staged: the two
    // memory round trips overlap instead of adding up in every block's lifetime.
    uint4 loaded[kWarpRows][kLoads];
    auto load = [&](int c0) {
#pragma unroll
      for (int i = 0; i < kWarpRows; ++i) {
#pragma unroll
        for (int u = 0; u < kLoads; ++u) {
          const int c = c0 + 32 * u;
          loaded[i][u] = n0 + i < s.n && c < vectors ? __ldg(w_rows[i] + v0 + c)
                                                     : make_uint4(0, 0, 0, 0);
        }
      }
    };
    load(lane);
    if (t0 == 0) {
      // The weight is a constant; the activations (and out, residual) only after the wait.
      wait_for_previous_kernel();
      allow_next_kernel();
    }
    __syncthreads();   // every warp is done with the previous tile
    // An activation as staged: x, or with a folded gate act(x) * b.
    auto staged_value = [&](T a, T b) {
      if constexpr (kGlu) return gated(a, b, glu_act);
      return to_float(a);
    };
    if (s.wide) {
      // 16-byte loads of x, several in flight a thread (K = 8192 in one round trip); a K the
      // vectors do not reach (a padded row) stages zeros.
      const int row_loads = columns / kVec;
#pragma unroll 4
      for (int i = threadIdx.x; i < kRows * row_loads; i += kWarps * 32) {
        const int r = i / row_loads, j = (i - r * row_loads) * kVec;
        const int64_t k = t0 + j;
        float f[kVec];
        if (r < rows && k < s.k) {
          const int64_t at = (m0 + r) * s.k + k;
          const uint4 xv = __ldg(reinterpret_cast<const uint4*>(x + at));
          uint4 gv = make_uint4(0, 0, 0, 0);
          if constexpr (kGlu) gv = __ldg(reinterpret_cast<const uint4*>(glu_b + at));
          const T* xe = reinterpret_cast<const T*>(&xv);
          const T* ge = reinterpret_cast<const T*>(&gv);
#pragma unroll
          for (int e = 0; e < kVec; ++e) f[e] = staged_value(xe[e], ge[e]);
        } else {
#pragma unroll
          for (int e = 0; e < kVec; ++e) f[e] = 0.0f;
        }
        // kVec is a multiple of the swizzle's 4-float pieces, which stay whole.
#pragma unroll
        for (int p = 0; p < kVec / 4; ++p) {
          const int e = j % kElems + 4 * p;
          *reinterpret_cast<float4*>(staged + r * kTile + staged_index<kElems>(j / kElems, e)) =
              make_float4(f[4 * p], f[4 * p + 1], f[4 * p + 2], f[4 * p + 3]);
        }
      }
    } else {
#pragma unroll
      for (int r = 0; r < kRows; ++r) {
        for (int j = threadIdx.x; j < columns; j += kWarps * 32) {
          const int64_t k = t0 + j;
          const int64_t at = (m0 + r) * s.k + k;
          const float v =
              r < rows && k < s.k ? staged_value(x[at], kGlu ? glu_b[at] : x[at]) : 0.0f;
          staged[r * kTile + staged_index<kElems>(j / kElems, j % kElems)] = v;
        }
      }
    }
    __syncthreads();
    if constexpr (kOffset) {
      // Each vector's sum of x (the swizzle only permutes within a vector); a thread starts at
      // its own element so that neighbours read different banks.
      for (int i = threadIdx.x; i < kRows * vectors; i += kWarps * 32) {
        const int r = i / vectors, c = i - r * vectors;
        const float* xr = staged + r * kTile + c * kElems;
        float sum = 0.0f;
#pragma unroll 8
        for (int e = 0; e < kElems; ++e) sum += xr[(e + c) % kElems];
        vector_sums[r * kTileVectors + c] = sum;
      }
      __syncthreads();
    }
    if (n0 >= s.n) continue;
    for (int c0 = lane; c0 < vectors; c0 += 32 * kLoads) {
      if (c0 != lane) load(c0);
#pragma unroll
      for (int i = 0; i < kWarpRows; ++i) {
#pragma unroll
        for (int u = 0; u < kLoads; ++u) {
          const int c = c0 + 32 * u;
          // not break: the unrolled loops keep `loaded` in registers
          if (c >= vectors || n0 + i >= s.n) continue;
          float w[kElems];
          if constexpr (kOffset) {
            dequantize_offset4(loaded[i][u], w);
          } else {
            dequantize<kBits>(loaded[i][u], w);
          }
          float scale = 1.0f;
          if (s.groups != 1) {
            const int64_t vector = v0 + c;
            const int64_t group = s.group_shift >= 0 ? vector >> s.group_shift
                                                     : vector * kElems / s.group_size;
            scale = __ldg(scales + (n0 + i) * s.groups + group);
          }
#pragma unroll
          for (int r = 0; r < kRows; ++r) {
            const float* xr = staged + r * kTile;
            // One activation row of int4: four partial sums, one per float4 lane. A single chain
            // of 32 dependent FMAs (~4 cycles each) held each vector's dot back, and the compiler
            // does not interleave vectors; four chains of 8 overlap. Several rows already give
            // one chain each; int8 keeps its 16-FMA chain (four push its two-rows-a-warp kernel
            // past 64 registers: a quarter fewer blocks an SM).
            constexpr int kChains = kBits == 4 && kRows == 1 ? 4 : 1;
            float d[kChains] = {};
#pragma unroll
            for (int p = 0; p < kElems / 4; ++p) {
              const float4 xv =
                  *reinterpret_cast<const float4*>(xr + staged_index<kElems>(c, 4 * p));
              d[0 % kChains] = fmaf(w[4 * p], xv.x, d[0 % kChains]);
              d[1 % kChains] = fmaf(w[4 * p + 1], xv.y, d[1 % kChains]);
              d[2 % kChains] = fmaf(w[4 * p + 2], xv.z, d[2 % kChains]);
              d[3 % kChains] = fmaf(w[4 * p + 3], xv.w, d[3 % kChains]);
            }
            float dot = d[0];
            if constexpr (kChains == 4) dot = (d[0] + d[1]) + (d[2] + d[3]);
            if constexpr (kOffset) {
              dot = fmaf(dot, 256.0f, -136.0f * vector_sums[r * kTileVectors + c]);
            }
            acc[i][r] = fmaf(dot, scale, acc[i][r]);
          }
        }
      }
    }
  }
#pragma unroll
  for (int i = 0; i < kWarpRows; ++i) {
    const int64_t n = n0 + i;
    if (n >= s.n) return;
    const float row_scale = s.groups == 1 ? __ldg(scales + n) : 1.0f;
    const float b = bias != nullptr ? to_float(bias[n]) : 0.0f;
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      const float total = warp_reduce(acc[i][r], [](float a, float c) { return a + c; });
      if (lane == r && r < rows) {
        const int64_t at = (m0 + r) * s.n + n;
        float v = fmaf(total, row_scale, b);
        if (residual != nullptr) v += to_float(residual[at]);
        out[at] = from_float<T>(apply_epilogue(v, act));
      }
    }
  }
}

// --- The tensor-core decode kernel: int4 weights, 16-bit activations, M <= 8. ---
// The CUDA-core kernel above spends about 90 instructions a lane on each 16-byte int4 vector
// (unpacking 32 floats, 8 shared-memory reads of the staged fp32 activations, 32 FMAs) and moved
// 406-1301 GB/s of int4 weight on the 1B shapes on an H100, less than int8's 921-2699. Here each
// 32-bit word of 8 nibbles becomes four 16-bit pairs (a LOP3 and an HSUB2 each, exact integers)
// that are mma.m16n8k16 A-fragment registers as they stand: a dot product does not care which K
// position feeds which of the MMA's K slots, so each lane feeds the slots it owns with the nibbles
// of its own 16-byte vector, and the activations are staged once a block in the matching order.
// The MMA's 8 columns are the activation rows (at M = 1 seven of them are zero). Measured on an
// H100: 5-14 % faster than the CUDA-core kernel on the 1B shapes (LM head 1.30 -> 1.50 TB/s),
// still short of int8's bandwidth: a block issues its loads once and has none in flight while
// it stages, reduces and exits.
//
// A block computes 16 output rows (one MMA tile) with 8 warps splitting K into batches of 128
// values: lane l reads the vector 4 * batch + l % 4 of rows l / 4 and l / 4 + 8. Each batch lies
// in one scale group (group_size is K or a multiple of 128), so its MMA sums are scaled once.
constexpr int kMmaWarps = 8;
constexpr int kMmaOutRows = 16;
constexpr int kMmaBatchK = 128;
constexpr int kMmaUnroll = 4;          // batches in flight a warp: 8 16-byte weight loads a lane
constexpr int kMmaMaxActRows = 8;      // the MMA's N
// The staged activations' limit: with the 3.5 KiB of partial sums, within the 48 KiB a block
// gets without opting in to more.
constexpr size_t kMmaMaxStagedBytes = size_t{44} << 10;

// Two staged activations as one B-fragment register (lo in the low half).
template <typename T>
__device__ __forceinline__ uint32_t pack_pair(float lo, float hi) {
  uint32_t bits;
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    memcpy(&bits, &v, 4);
  } else {
    const __half2 v = __floats2half2_rn(lo, hi);
    memcpy(&bits, &v, 4);
  }
  return bits;
}

// A word's 8 nibbles (two's complement) as 4 pairs of T: pair i holds nibbles i (low half) and
// i + 4. OR-ing a biased nibble into the mantissa of 128 (bf16) or 1024 (fp16), whose unit in
// the last place is 1, gives 128 + (v + 8); subtracting 136 (1032) leaves v exactly.
template <typename T>
__device__ __forceinline__ void int4_pairs(uint32_t word, uint32_t (&pairs)[4]) {
  constexpr bool kBf16 = std::is_same_v<T, __nv_bfloat16>;
  constexpr uint32_t kMagic = kBf16 ? 0x43004300u : 0x64006400u;
  const uint32_t biased = word ^ 0x88888888u;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const uint32_t raw = ((biased >> (4 * i)) & 0x000F000Fu) | kMagic;
    if constexpr (kBf16) {
      __nv_bfloat162 v;
      memcpy(&v, &raw, 4);
      v = __hsub2(v, __floats2bfloat162_rn(136.0f, 136.0f));
      memcpy(&pairs[i], &v, 4);
    } else {
      __half2 v;
      memcpy(&v, &raw, 4);
      v = __hsub2(v, __floats2half2_rn(1032.0f, 1032.0f));
      memcpy(&pairs[i], &v, 4);
    }
  }
}

// c += A (16 x 16, row-major fragments) * B (16 x 8, column-major), fp32 accumulation.
template <typename T>
__device__ __forceinline__ void mma_16x8x16(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                            uint32_t a3, uint32_t b0, uint32_t b1) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  } else {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  }
}

template <typename T, bool kGlu>
__global__ void __launch_bounds__(kMmaWarps * 32)
    quant_gemv_mma_kernel(const T* __restrict__ x, const uint4* __restrict__ weight,
                          const float* __restrict__ scales, const T* __restrict__ bias,
                          const T* __restrict__ residual, T* __restrict__ out, const Shape s,
                          const Epilogue act, const T* __restrict__ glu_b,
                          const blob::UnaryKind glu_act) {
  // [M][K / 8] 16-byte entries; entry k / 8 holds x[k + e] for e = 0, 4, 1, 5, 2, 6, 3, 7, the
  // order int4_pairs gives the nibbles of a word in.
  extern __shared__ uint4 staged[];
  __shared__ float partial[kMmaWarps - 1][32][4];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, q = lane % 4;
  const int64_t row0 = int64_t(blockIdx.x) * kMmaOutRows + lane / 4, row1 = row0 + 8;
  const int64_t batches = (s.row_vectors + 3) / 4;
  const bool grouped = s.groups != 1;
  const uint4* w0 = weight + (row0 < s.n ? row0 : 0) * s.row_vectors;
  const uint4* w1 = weight + (row1 < s.n ? row1 : 0) * s.row_vectors;

  uint4 la[kMmaUnroll], lb[kMmaUnroll];
  float sa[kMmaUnroll], sb[kMmaUnroll];
  auto load = [&](int64_t b0) {
#pragma unroll
    for (int u = 0; u < kMmaUnroll; ++u) {
      const int64_t b = b0 + int64_t(u) * kMmaWarps, v = 4 * b + q;
      const bool in = b < batches && v < s.row_vectors;
      la[u] = in && row0 < s.n ? __ldg(w0 + v) : make_uint4(0, 0, 0, 0);
      lb[u] = in && row1 < s.n ? __ldg(w1 + v) : make_uint4(0, 0, 0, 0);
      sa[u] = sb[u] = 1.0f;
      if (grouped && b < batches) {
        const int64_t group = b * kMmaBatchK / s.group_size;
        if (row0 < s.n) sa[u] = __ldg(scales + row0 * s.groups + group);
        if (row1 < s.n) sb[u] = __ldg(scales + row1 * s.groups + group);
      }
    }
  };
  // The weight and scales are constants: requested before the previous kernel has finished.
  load(warp);
  wait_for_previous_kernel();
  allow_next_kernel();

  const int64_t row_entries = batches * (kMmaBatchK / 8);
  for (int64_t i = threadIdx.x; i < s.m * row_entries; i += kMmaWarps * 32) {
    const int64_t r = i / row_entries, k = (i - r * row_entries) * 8;
    float f[8] = {};
    if (k < s.k) {   // K is a multiple of 8: all 8 values are in the row
      const int64_t at = r * s.k + k;
      const uint4 xv = __ldg(reinterpret_cast<const uint4*>(x + at));
      uint4 gv = make_uint4(0, 0, 0, 0);
      if constexpr (kGlu) gv = __ldg(reinterpret_cast<const uint4*>(glu_b + at));
      const T* xe = reinterpret_cast<const T*>(&xv);
      const T* ge = reinterpret_cast<const T*>(&gv);
#pragma unroll
      for (int e = 0; e < 8; ++e) f[e] = kGlu ? gated(xe[e], ge[e], glu_act) : to_float(xe[e]);
    }
    staged[i] = make_uint4(pack_pair<T>(f[0], f[4]), pack_pair<T>(f[1], f[5]),
                           pack_pair<T>(f[2], f[6]), pack_pair<T>(f[3], f[7]));
  }
  __syncthreads();

  // This lane's B column is activation row lane / 4; its K slots are those of quarter q.
  const int col = lane / 4;
  float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  for (int64_t b0 = warp; b0 < batches; b0 += kMmaWarps * kMmaUnroll) {
    if (b0 != warp) load(b0);
#pragma unroll
    for (int u = 0; u < kMmaUnroll; ++u) {
      const int64_t b = b0 + int64_t(u) * kMmaWarps;
      if (b >= batches) continue;   // not break: the unrolled loop keeps la / lb in registers
      const uint4* xb = staged + int64_t(col) * row_entries + b * (kMmaBatchK / 8) + q * 4;
      const uint32_t wa[4] = {la[u].x, la[u].y, la[u].z, la[u].w};
      const uint32_t wb[4] = {lb[u].x, lb[u].y, lb[u].z, lb[u].w};
      float c[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const uint4 xv = col < s.m ? xb[j] : make_uint4(0, 0, 0, 0);
        uint32_t pa[4], pb[4];
        int4_pairs<T>(wa[j], pa);
        int4_pairs<T>(wb[j], pb);
        mma_16x8x16<T>(c, pa[0], pb[0], pa[1], pb[1], xv.x, xv.y);
        mma_16x8x16<T>(c, pa[2], pb[2], pa[3], pb[3], xv.z, xv.w);
      }
      acc[0] = fmaf(c[0], sa[u], acc[0]);
      acc[1] = fmaf(c[1], sa[u], acc[1]);
      acc[2] = fmaf(c[2], sb[u], acc[2]);
      acc[3] = fmaf(c[3], sb[u], acc[3]);
    }
  }

  // The warps' K shares summed by warp 0, whose lane holds rows row0 / row1 at activation rows
  // 2q and 2q + 1 (the C fragment's layout).
  if (warp > 0) {
#pragma unroll
    for (int i = 0; i < 4; ++i) partial[warp - 1][lane][i] = acc[i];
  }
  __syncthreads();
  if (warp > 0) return;
#pragma unroll
  for (int w = 0; w < kMmaWarps - 1; ++w) {
#pragma unroll
    for (int i = 0; i < 4; ++i) acc[i] += partial[w][lane][i];
  }
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int64_t n = i < 2 ? row0 : row1;
    const int64_t m = 2 * q + (i & 1);
    if (n >= s.n || m >= s.m) continue;
    const int64_t at = m * s.n + n;
    float v = fmaf(acc[i], grouped ? 1.0f : __ldg(scales + n),
                   bias != nullptr ? to_float(bias[n]) : 0.0f);
    if (residual != nullptr) v += to_float(residual[at]);
    out[at] = from_float<T>(apply_epilogue(v, act));
  }
}

// Activation rows per block for M <= kMaxRows rows: the smallest power of two >= M.
//
// Why M > kMaxRows (a prefill) does not run this kernel: ceil(M / 16) chunks would each do the
// decode kernel's work over the whole weight, fp32 FMAs on CUDA cores bound by shared-memory
// bandwidth at roughly 0.5 TB/s of weight on an H200, so 128 tokens of the 1B shape took ~20 ms
// against ~1.5 ms for a bf16 tensor-core GEMM. Those M run the dense path below instead.
int rows_per_chunk(int64_t m) {
  int rows = 1;
  while (rows < m && rows < kMaxRows) rows *= 2;
  return rows;
}

// --- The dense path (M > kMaxRows): dequantize, then a tensor-core GEMM. ---
// The weight is dequantized to x's dtype (q * scale, rounded once: bf16 keeps int8/int4 values
// exactly and rounds the scaled value as a bf16 model's weight is rounded) one chunk of output
// rows at a time into the workspace, and cuBLASLt multiplies each chunk into its columns of out
// (leading dimension N), bias, residual and relu / tanh-GELU in its epilogue. A chunk is at most
// kDenseChunkBytes (KILN_QUANT_CHUNK_MIB sets another size), so the workspace stays small for an
// LM head. Measured at M = 128 on the 1B shapes, 4-16 MiB chunks were 1.2-2.6x slower (each
// chunk's GEMM too narrow to fill the GPU) and 64 MiB no faster. The price against a bf16 model:
// the int8 bytes read plus the chunk written and read back, about 2.5x the bf16 weight traffic
// for int8 (1.9-3.4x the bf16 GEMM's time at M = 128).
constexpr size_t kDenseChunkBytes = size_t{32} << 20;
size_t dense_chunk_bytes() {
  const char* env = std::getenv("KILN_QUANT_CHUNK_MIB");
  const long mib = env != nullptr ? std::strtol(env, nullptr, 10) : 0;
  return mib > 0 && mib <= 4096 ? size_t(mib) << 20 : kDenseChunkBytes;
}
// Output rows per chunk are a multiple of this, so each chunk's slice of out, residual and bias
// keeps the base's alignment (64 rows of 2 bytes: 128).
constexpr int64_t kChunkRowQuantum = 64;

// KILN_QUANT_DENSE=off: every M runs the CUDA-core kernel (for comparing the two).
bool dense_path_disabled() { return env_is("KILN_QUANT_DENSE", "off"); }

// w[r, k] = q[n0 + r, k] * scale for r < rows: one thread per packed 16-byte vector, written with
// 16-byte stores where each row of K values is a whole number of them (`vector_stores`). About
// 2.5 TB/s of bytes read and written on an H200 (8192 x 2048: ~20 us); 32-bit index arithmetic
// measured no faster.
template <typename T, int kBits>
__global__ void dequantize_rows_kernel(const uint4* __restrict__ weight,
                                       const float* __restrict__ scales, T* __restrict__ w,
                                       const Shape s, int64_t n0, int64_t rows,
                                       bool vector_stores) {
  constexpr int kElems = 128 / kBits;
  constexpr int kStores = kElems * int(sizeof(T)) / 16;
  const int64_t total = rows * s.row_vectors;
  for (int64_t i = thread_index(); i < total; i += thread_count()) {
    const int64_t r = i / s.row_vectors, c = i - r * s.row_vectors;
    const int64_t n = n0 + r, k0 = c * kElems;
    float q[kElems];
    dequantize<kBits>(__ldg(weight + n * s.row_vectors + c), q);
    // A vector never straddles two groups: group_size is K or a multiple of 32 >= kElems.
    const float scale = __ldg(scales + n * s.groups + k0 / s.group_size);
    T* dst = w + r * s.k + k0;
    if (vector_stores && k0 + kElems <= s.k) {
      alignas(16) T packed[kElems];
#pragma unroll
      for (int e = 0; e < kElems; ++e) packed[e] = from_float<T>(q[e] * scale);
#pragma unroll
      for (int j = 0; j < kStores; ++j) {
        reinterpret_cast<uint4*>(dst)[j] = reinterpret_cast<const uint4*>(packed)[j];
      }
    } else {
      for (int e = 0; e < kElems && k0 + e < s.k; ++e) dst[e] = from_float<T>(q[e] * scale);
    }
  }
}

class QuantMatmulStep final : public Step {
 public:
  QuantMatmulStep(const QuantMatmulArgs& a, const Graph& graph, const QuantGate* gate)
      : a_(a), dtype_(graph.tensors[a.x].dtype) {
    if (gate != nullptr) gate_ = *gate;
  }

  Error init(const InitContext& ctx) {
    op_ = ctx.op_index;
    if (ctx.alignment[size_t(a_.weight)] < blob::kQuantRowAlignment) {
      return fail(nullptr, Error::InvalidProgram,
                  "Kiln op %zu (QuantMatmul): the packed weight (tensor %lld) is %u-byte aligned; "
                  "its 16-byte row loads need 16",
                  op_, static_cast<long long>(a_.weight), ctx.alignment[size_t(a_.weight)]);
    }
    rows_ = rows_per_chunk(a_.m);
    shape_ = {a_.m, a_.n, a_.k,
              blob::quant_row_words(a_.k, a_.bits) / 4, a_.k / a_.group_size, a_.group_size,
              group_shift(a_.group_size, 128 / int(a_.bits)),
              static_cast<int>((a_.m + rows_ - 1) / rows_), false};
    // The staged tensors (x, or a folded gate's two inputs) in 16-byte loads when every row is
    // whole vectors of them.
    const int64_t staged = gate_.a != kNoTensor ? gate_.a : a_.x;
    shape_.wide = (a_.k * int64_t(element_size(dtype_))) % 16 == 0 &&
                  ctx.alignment[size_t(staged)] >= 16 &&
                  (gate_.b == kNoTensor || ctx.alignment[size_t(gate_.b)] >= 16);
    if (gate_.a != kNoTensor && a_.m > kMaxRows) {
      return fail(nullptr, Error::Internal,
                  "Kiln op %zu (QuantMatmul): a gated activation was folded into %lld rows; "
                  "only the decode kernel (M <= %d) takes one",
                  op_, static_cast<long long>(a_.m), kMaxRows);
    }
    if (a_.m > kMaxRows && a_.n > 0 && !dense_path_disabled()) return init_dense(ctx);
    if (mma_fits()) {
      mma_ = true;
      blocks_ = static_cast<unsigned>((a_.n + kMmaOutRows - 1) / kMmaOutRows);
      return Error::Ok;
    }
    warp_rows_ = warp_rows(a_.m, a_.n, shape_.row_vectors);
    const int64_t rows_per_block = int64_t(kWarps) * warp_rows_;
    const int64_t row_blocks = (a_.n + rows_per_block - 1) / rows_per_block;
    if (a_.m > 0 && row_blocks * shape_.chunks > INT32_MAX) {
      return fail(nullptr, Error::NotSupported,
                  "Kiln op %zu (QuantMatmul): M = %lld, N = %lld need %lld thread blocks, more "
                  "than a grid holds",
                  op_, static_cast<long long>(a_.m), static_cast<long long>(a_.n),
                  static_cast<long long>(row_blocks * shape_.chunks));
    }
    blocks_ = static_cast<unsigned>(row_blocks * shape_.chunks);
    return Error::Ok;
  }

  Error enqueue(const RunContext& ctx) override {
    if (a_.m == 0 || a_.n == 0) return Error::Ok;
    if (dense_) return enqueue_dense(ctx);
    cudaError_t launched = cudaSuccess;
    visit_floating(dtype_, [&](auto tag) {
      using T = typename decltype(tag)::type;
      if constexpr (!std::is_same_v<T, float>) {
        if (mma_) {
          launched = launch_mma<T>(ctx);
          return;
        }
      }
      switch (rows_) {
        case 1: launched = launch<T, 1>(ctx); break;
        case 2: launched = launch<T, 2>(ctx); break;
        case 4: launched = launch<T, 4>(ctx); break;
        case 8: launched = launch<T, 8>(ctx); break;
        default: launched = launch<T, 16>(ctx); break;
      }
    });
    if (launched != cudaSuccess) {
      return fail(nullptr, Error::Internal, "Kiln op %zu (QuantMatmul): the launch failed: %s",
                  op_, cudaGetErrorString(launched));
    }
    return Error::Ok;
  }

  size_t workspace_bytes() const override {
    return dense_ ? chunk_offset() + kMatmulWorkspaceBytes : 0;
  }

 private:
  // Output rows per warp (M = 1 only): enough that a lane's kUnroll loads are all in use on a
  // short packed row, while the grid keeps at least kMinRowBlocks blocks (two an H200 SM).
  static int warp_rows(int64_t m, int64_t n, int64_t row_vectors) {
    constexpr int64_t kMinRowBlocks = 264;
    int rows = 1;
    while (m == 1 && rows < 4 && 2 * rows * row_vectors <= 32 * kUnroll &&
           n / (int64_t(kWarps) * 2 * rows) >= kMinRowBlocks) {
      rows *= 2;
    }
    return rows;
  }

  // Whether the tensor-core kernel takes this op: int4 with 16-bit activations, M <= 8, x rows
  // of whole 16-byte loads, scale groups of whole 128-value batches, and the staged activations
  // within 44 KiB (M = 1 up to K = 22528). KILN_QUANT_MMA=off keeps the CUDA-core kernel.
  bool mma_fits() const {
    if (env_is("KILN_QUANT_MMA", "off")) return false;
    if (a_.bits != 4 || (dtype_ != DType::kBFloat16 && dtype_ != DType::kFloat16)) return false;
    if (a_.m < 1 || a_.m > kMmaMaxActRows || a_.k % 8 != 0 || !shape_.wide) return false;
    if (shape_.groups != 1 && shape_.group_size % kMmaBatchK != 0) return false;
    if (mma_staged_bytes() > kMmaMaxStagedBytes) return false;
    return (a_.n + kMmaOutRows - 1) / kMmaOutRows <= INT32_MAX;
  }
  // The tensor-core kernel's dynamic shared memory: M rows of K padded to whole batches, 16-bit.
  size_t mma_staged_bytes() const {
    return size_t(a_.m) * size_t((shape_.row_vectors + 3) / 4 * kMmaBatchK) * 2;
  }

  // log2(group_size / elems) when that is a power of two (the kernel shifts), else -1.
  static int group_shift(int64_t group_size, int elems) {
    if (group_size % elems != 0) return -1;
    const int64_t vectors = group_size / elems;
    if ((vectors & (vectors - 1)) != 0) return -1;
    int shift = 0;
    while ((int64_t(1) << shift) < vectors) ++shift;
    return shift;
  }

  template <typename T, int kRows>
  cudaError_t launch(const RunContext& ctx) const {
    if constexpr (kRows == 1) {
      if (warp_rows_ == 4) return launch<T, 1, 4>(ctx);
      if (warp_rows_ == 2) return launch<T, 1, 2>(ctx);
    }
    return launch<T, kRows, 1>(ctx);
  }

  template <typename T, int kRows, int kWarpRows>
  cudaError_t launch(const RunContext& ctx) const {
    auto go = [&](auto kernel) { return launch_decode<T>(ctx, kernel, kWarps * 32, 0); };
    const bool glu = gate_.a != kNoTensor;
    if (a_.bits == 8) {
      return glu ? go(quant_matmul_kernel<T, kRows, 8, kWarpRows, true>)
                 : go(quant_matmul_kernel<T, kRows, 8, kWarpRows, false>);
    }
    return glu ? go(quant_matmul_kernel<T, kRows, 4, kWarpRows, true>)
               : go(quant_matmul_kernel<T, kRows, 4, kWarpRows, false>);
  }

  template <typename T>
  cudaError_t launch_mma(const RunContext& ctx) const {
    auto go = [&](auto kernel) {
      return launch_decode<T>(ctx, kernel, kMmaWarps * 32, mma_staged_bytes());
    };
    return gate_.a != kNoTensor ? go(quant_gemv_mma_kernel<T, true>)
                                : go(quant_gemv_mma_kernel<T, false>);
  }

  // Either decode kernel (they take the same arguments), launched overlapped on blocks_ blocks.
  template <typename T, typename Kernel>
  cudaError_t launch_decode(const RunContext& ctx, Kernel kernel, unsigned threads,
                            size_t smem) const {
    const bool glu = gate_.a != kNoTensor;
    const T* x = ctx.ptr<const T>(glu ? gate_.a : a_.x);
    const uint4* w = ctx.ptr<const uint4>(a_.weight);
    const float* scales = ctx.ptr<const float>(a_.scales);
    const T* bias = a_.bias == kNoTensor ? nullptr : ctx.ptr<const T>(a_.bias);
    const T* residual = a_.residual == kNoTensor ? nullptr : ctx.ptr<const T>(a_.residual);
    T* out = ctx.ptr<T>(a_.out);
    const T* glu_b = glu ? ctx.ptr<const T>(gate_.b) : nullptr;
    return launch_overlapped(kernel, blocks_, threads, smem, ctx.stream, x, w, scales, bias,
                             residual, out, shape_, a_.epilogue, glu_b, gate_.act);
  }

  // One chunk shape's cuBLASLt layouts and algorithm: the full chunk, and the last one when
  // N is not a multiple of it.
  struct ChunkPlan {
    int64_t rows = 0;
    Layout w, d;
    cublasLtMatmulAlgo_t algo{};
  };

  Error lt_status(cublasStatus_t s, const char* what) const {
    if (s == CUBLAS_STATUS_SUCCESS) return Error::Ok;
    return fail(nullptr, Error::NotSupported, "Kiln op %zu (QuantMatmul): %s failed: %s", op_,
                what, cublasLtGetStatusString(s));
  }

  Error make_layout(Layout& layout, uint64_t rows, uint64_t cols, int64_t ld) {
    cublasLtMatrixLayout_t raw = nullptr;
    KILN_TRY(lt_status(cublasLtMatrixLayoutCreate(&raw, cublas_type(dtype_), rows, cols, ld),
                       "cublasLtMatrixLayoutCreate"));
    layout.reset(raw);
    return Error::Ok;
  }

  Error set_desc(cublasLtMatmulDescAttributes_t attribute, const void* value, size_t size) {
    return lt_status(cublasLtMatmulDescSetAttribute(desc_.get(), attribute, value, size),
                     "cublasLtMatmulDescSetAttribute");
  }

  size_t element_bytes() const { return element_size(dtype_); }
  // The dequantized chunk sits at the workspace's start; cuBLASLt's workspace follows it.
  size_t chunk_offset() const {
    const size_t bytes = size_t(full_.rows) * size_t(a_.k) * element_bytes();
    return (bytes + 255) / 256 * 256;
  }

  Error init_dense(const InitContext& ctx) {
    if (ctx.lt == nullptr) {
      return fail(nullptr, Error::Internal,
                  "Kiln op %zu (QuantMatmul): M = %lld runs on cuBLASLt, but the engine made no "
                  "cuBLASLt handle",
                  op_, static_cast<long long>(a_.m));
    }
    dense_ = true;
    lt_ = ctx.lt;
    const int64_t budget =
        static_cast<int64_t>(dense_chunk_bytes() / (size_t(a_.k) * element_bytes()));
    int64_t rows = budget / kChunkRowQuantum * kChunkRowQuantum;
    if (rows < kChunkRowQuantum) rows = kChunkRowQuantum;
    full_.rows = rows < a_.n ? rows : a_.n;
    tail_.rows = a_.n % full_.rows;
    const cublasComputeType_t compute =
        dtype_ == DType::kFloat32 && ctx.graph.precision == blob::Precision::kTf32
            ? CUBLAS_COMPUTE_32F_FAST_TF32
            : CUBLAS_COMPUTE_32F;
    cublasLtMatmulDesc_t desc = nullptr;
    KILN_TRY(lt_status(cublasLtMatmulDescCreate(&desc, compute, CUDA_R_32F),
                       "cublasLtMatmulDescCreate"));
    desc_.reset(desc);
    // Row-major out[M, N-chunk] = x[M, K] @ w[chunk, K]^T is column-major
    // out^T = w^T(op T of the column-major K x chunk) @ x^T (the column-major K x M).
    const cublasOperation_t trans = CUBLAS_OP_T, keep = CUBLAS_OP_N;
    KILN_TRY(set_desc(CUBLASLT_MATMUL_DESC_TRANSA, &trans, sizeof(trans)));
    KILN_TRY(set_desc(CUBLASLT_MATMUL_DESC_TRANSB, &keep, sizeof(keep)));
    const bool bias = a_.bias != kNoTensor;
    const cublasLtEpilogue_t epilogue = lt_epilogue(bias, a_.epilogue, post_act_);
    KILN_TRY(set_desc(CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof(epilogue)));
    if (bias) {
      const int32_t bias_type = cublas_type(dtype_);
      KILN_TRY(set_desc(CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type, sizeof(bias_type)));
    }
    KILN_TRY(make_layout(x_layout_, uint64_t(a_.k), uint64_t(a_.m), a_.k));
    for (ChunkPlan* plan : {&full_, &tail_}) {
      if (plan->rows == 0) continue;
      KILN_TRY(make_layout(plan->w, uint64_t(a_.k), uint64_t(plan->rows), a_.k));
      KILN_TRY(make_layout(plan->d, uint64_t(plan->rows), uint64_t(a_.m), a_.n));
    }
    // Every chunk starts a multiple of full_.rows rows in: its slices keep this much alignment.
    const int64_t step_bytes = full_.rows * int64_t(element_bytes());
    align_x_ = ctx.alignment[size_t(a_.x)];
    align_out_ = min_alignment(ctx.alignment[size_t(a_.out)], step_bytes);
    align_c_ = a_.residual == kNoTensor ? align_out_
                                        : min_alignment(ctx.alignment[size_t(a_.residual)],
                                                        step_bytes);
    return choose_algorithms();
  }

  // The heuristic's first algorithm for each chunk shape under the current alignments; host-only,
  // so it is also safe while the stream is being captured.
  Error choose_algorithms() {
    for (ChunkPlan* plan : {&full_, &tail_}) {
      if (plan->rows == 0) continue;
      cublasLtMatmulPreference_t raw = nullptr;
      KILN_TRY(lt_status(cublasLtMatmulPreferenceCreate(&raw), "cublasLtMatmulPreferenceCreate"));
      Preference preference(raw);
      // cuBLASLt's A is the chunk, at the workspace's start (256-byte aligned).
      KILN_TRY(lt_status(set_preference(raw, kMatmulWorkspaceBytes,
                                        {256u, align_x_, align_c_, align_out_}),
                         "setting the workspace limit and alignments"));
      cublasLtMatmulHeuristicResult_t result{};
      int found = 0;
      const cublasStatus_t s = cublasLtMatmulAlgoGetHeuristic(
          lt_, desc_.get(), plan->w.get(), x_layout_.get(), plan->d.get(), plan->d.get(), raw, 1,
          &result, &found);
      if (s != CUBLAS_STATUS_SUCCESS || found == 0) {
        return fail(nullptr, Error::NotSupported,
                    "Kiln op %zu (QuantMatmul): cuBLASLt has no algorithm for the dequantized "
                    "chunk GEMM M %lld, N %lld, K %lld, %s (%s)",
                    op_, static_cast<long long>(a_.m), static_cast<long long>(plan->rows),
                    static_cast<long long>(a_.k), dtype_name(dtype_),
                    s != CUBLAS_STATUS_SUCCESS ? cublasLtGetStatusString(s) : "no heuristic result");
      }
      plan->algo = result.algo;
    }
    return Error::Ok;
  }

  Error enqueue_dense(const RunContext& ctx) {
    const char* x = ctx.ptr<const char>(a_.x);
    char* out = ctx.ptr<char>(a_.out);
    const char* residual = a_.residual == kNoTensor ? nullptr : ctx.ptr<const char>(a_.residual);
    const char* bias = a_.bias == kNoTensor ? nullptr : ctx.ptr<const char>(a_.bias);
    const size_t elem = element_bytes();
    // Bound io buffers may be less aligned than the algorithms were chosen for: choose again.
    const int64_t step_bytes = full_.rows * int64_t(elem);
    const uint32_t ax = alignment_of(x), ao = min_alignment(alignment_of(out), step_bytes);
    const uint32_t ac =
        residual == nullptr ? ao : min_alignment(alignment_of(residual), step_bytes);
    if (ax < align_x_ || ao < align_out_ || ac < align_c_) {
      align_x_ = ax, align_out_ = ao, align_c_ = ac;
      KILN_TRY(choose_algorithms());
    }
    void* w = ctx.workspace;
    void* lt_workspace = static_cast<char*>(ctx.workspace) + chunk_offset();
    const float alpha = 1.0f, beta = residual != nullptr ? 1.0f : 0.0f;
    const bool vector_stores = (size_t(a_.k) * elem) % 16 == 0;
    for (int64_t n0 = 0; n0 < a_.n; n0 += full_.rows) {
      const ChunkPlan& plan = a_.n - n0 < full_.rows ? tail_ : full_;
      visit_floating(dtype_, [&](auto tag) {
        using T = typename decltype(tag)::type;
        const uint4* q = ctx.ptr<const uint4>(a_.weight);
        const float* scales = ctx.ptr<const float>(a_.scales);
        const unsigned blocks =
            blocks_for(plan.rows * shape_.row_vectors, kBlock, ctx.max_blocks);
        if (a_.bits == 8) {
          dequantize_rows_kernel<T, 8><<<blocks, kBlock, 0, ctx.stream>>>(
              q, scales, static_cast<T*>(w), shape_, n0, plan.rows, vector_stores);
        } else {
          dequantize_rows_kernel<T, 4><<<blocks, kBlock, 0, ctx.stream>>>(
              q, scales, static_cast<T*>(w), shape_, n0, plan.rows, vector_stores);
        }
      });
      if (bias != nullptr) {
        const void* chunk_bias = bias + n0 * int64_t(elem);
        KILN_TRY(set_desc(CUBLASLT_MATMUL_DESC_BIAS_POINTER, &chunk_bias, sizeof(chunk_bias)));
      }
      char* d = out + n0 * int64_t(elem);
      const void* c = residual != nullptr ? residual + n0 * int64_t(elem) : d;
      const cublasStatus_t s = cublasLtMatmul(
          ctx.lt, desc_.get(), &alpha, w, plan.w.get(), x, x_layout_.get(), &beta, c,
          plan.d.get(), d, plan.d.get(), &plan.algo, lt_workspace, kMatmulWorkspaceBytes,
          ctx.stream);
      if (s != CUBLAS_STATUS_SUCCESS) {
        return fail(nullptr, Error::Internal,
                    "Kiln op %zu (QuantMatmul): cublasLtMatmul on the dequantized rows %lld.. "
                    "failed: %s",
                    op_, static_cast<long long>(n0), cublasLtGetStatusString(s));
      }
    }
    if (post_act_ != Epilogue::kNone) {
      enqueue_epilogue_pass(ctx, dtype_, out, a_.m * a_.n, a_.m, a_.n, nullptr, dtype_, 0, 1,
                            0.0f, post_act_);
    }
    return Error::Ok;
  }

  QuantMatmulArgs a_;
  DType dtype_;
  QuantGate gate_;   // a folded gated activation (a is kNoTensor when none)
  size_t op_ = 0;
  int rows_ = 1;
  int warp_rows_ = 1;
  Shape shape_{};
  unsigned blocks_ = 0;
  // The dense path (M > kMaxRows).
  bool dense_ = false;
  bool mma_ = false;   // the tensor-core kernel (int4, 16-bit, M <= 8)
  cublasLtHandle_t lt_ = nullptr;
  MatmulDesc desc_;
  Layout x_layout_;
  ChunkPlan full_, tail_;
  Epilogue post_act_ = Epilogue::kNone;
  uint32_t align_x_ = 16, align_out_ = 16, align_c_ = 16;
};

}  // namespace

const char* quant_gemv_unsupported(const QuantMatmulArgs& args) {
  if (args.m < 1 || args.m > kMaxRows) return "not the decode kernel's M <= 16 rows";
  if (args.n == 0) return "no output rows";
  return nullptr;
}

namespace {

StepResult new_quant_step(const QuantMatmulArgs& args, const InitContext& ctx, const QuantGate* gate) {
  auto step = std::make_unique<QuantMatmulStep>(args, ctx.graph, gate);
  const Error err = step->init(ctx);
  if (err != Error::Ok) return err;
  return std::unique_ptr<Step>(std::move(step));
}

}  // namespace

StepResult make_quant_matmul_step(const QuantMatmulArgs& args, const InitContext& ctx) {
  return new_quant_step(args, ctx, nullptr);
}

StepResult make_quant_matmul_step(const QuantMatmulArgs& args, const InitContext& ctx,
                                  const QuantGate& gate) {
  return new_quant_step(args, ctx, &gate);
}

}  // namespace kiln::engine::kernels
