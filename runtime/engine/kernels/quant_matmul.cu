#include "runtime/engine/kernels/quant_matmul.cuh"

#include "format/fail.h"
#include "format/quant_layout.h"
#include "runtime/engine/kernels/common.cuh"

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

struct Shape {
  int64_t m, n, k;
  int64_t row_vectors;   // 16-byte vectors per packed weight row
  int64_t groups, group_size;
  int chunks;            // ceil(M / kRowsPerChunk)
};

// out[m, n] = act(sum_k x[m, k] * q[n, k] * scale(n, k) + bias[n] + residual[m, n]). Block b
// computes rows n of row block b / chunks for the activation rows of chunk b % chunks (chunks of
// one row block are consecutive blocks, so they run together and re-read the weight from L2).
template <typename T, int kRows, int kBits>
__global__ void __launch_bounds__(kWarps * 32)
    quant_matmul_kernel(const T* __restrict__ x, const uint4* __restrict__ weight,
                        const float* __restrict__ scales, const T* __restrict__ bias,
                        const T* __restrict__ residual, T* __restrict__ out, const Shape s,
                        const Epilogue act) {
  constexpr int kElems = 128 / kBits;                 // values per 16-byte vector
  constexpr int kTile = kStagedFloats / kRows;        // K values staged per row
  constexpr int kTileVectors = kTile / kElems;
  __shared__ __align__(16) float staged[kRows * kTile];

  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int64_t chunk = blockIdx.x % s.chunks;
  const int64_t n = (blockIdx.x / s.chunks) * kWarps + warp;
  const int64_t m0 = chunk * kRows;
  const int rows = static_cast<int>(s.m - m0 < kRows ? s.m - m0 : kRows);
  const uint4* w_row = weight + (n < s.n ? n : 0) * s.row_vectors;

  float acc[kRows];
#pragma unroll
  for (int r = 0; r < kRows; ++r) acc[r] = 0.0f;

  const int64_t padded_k = s.row_vectors * kElems;
  for (int64_t t0 = 0; t0 < padded_k; t0 += kTile) {
    // Only the columns this tile's vectors read (a short K stages K, not a whole tile).
    const int columns = static_cast<int>(padded_k - t0 < kTile ? padded_k - t0 : kTile);
    __syncthreads();   // every warp is done with the previous tile
#pragma unroll
    for (int r = 0; r < kRows; ++r) {
      for (int j = threadIdx.x; j < columns; j += kWarps * 32) {
        const int64_t k = t0 + j;
        const float v = r < rows && k < s.k ? to_float(x[(m0 + r) * s.k + k]) : 0.0f;
        staged[r * kTile + staged_index<kElems>(j / kElems, j % kElems)] = v;
      }
    }
    __syncthreads();
    if (n >= s.n) continue;
    const int64_t v0 = t0 / kElems;
    const int vectors = static_cast<int>(
        s.row_vectors - v0 < kTileVectors ? s.row_vectors - v0 : kTileVectors);
    for (int c0 = lane; c0 < vectors; c0 += 32 * kUnroll) {
      uint4 loaded[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int c = c0 + 32 * u;
        loaded[u] = c < vectors ? __ldg(w_row + v0 + c) : make_uint4(0, 0, 0, 0);
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int c = c0 + 32 * u;
        if (c >= vectors) continue;   // not break: the unrolled loop keeps `loaded` in registers
        float w[kElems];
        dequantize<kBits>(loaded[u], w);
        const float scale =
            s.groups == 1 ? 1.0f : __ldg(scales + n * s.groups + (v0 + c) * kElems / s.group_size);
#pragma unroll
        for (int r = 0; r < kRows; ++r) {
          const float* xr = staged + r * kTile;
          float dot = 0.0f;
#pragma unroll
          for (int p = 0; p < kElems / 4; ++p) {
            const float4 xv =
                *reinterpret_cast<const float4*>(xr + staged_index<kElems>(c, 4 * p));
            dot = fmaf(w[4 * p], xv.x, dot);
            dot = fmaf(w[4 * p + 1], xv.y, dot);
            dot = fmaf(w[4 * p + 2], xv.z, dot);
            dot = fmaf(w[4 * p + 3], xv.w, dot);
          }
          acc[r] = fmaf(dot, scale, acc[r]);
        }
      }
    }
  }
  if (n >= s.n) return;
  const float row_scale = s.groups == 1 ? __ldg(scales + n) : 1.0f;
  const float b = bias != nullptr ? to_float(bias[n]) : 0.0f;
#pragma unroll
  for (int r = 0; r < kRows; ++r) {
    const float total = warp_reduce(acc[r], [](float a, float c) { return a + c; });
    if (lane == r && r < rows) {
      const int64_t at = (m0 + r) * s.n + n;
      float v = fmaf(total, row_scale, b);
      if (residual != nullptr) v += to_float(residual[at]);
      out[at] = from_float<T>(apply_epilogue(v, act));
    }
  }
}

// Activation rows per block for M rows: the smallest power of two >= M, at most kMaxRows.
//
// What M > 16 (a prefill) costs: ceil(M / 16) chunks, each the decode kernel's work over the
// whole weight. The chunks of one row block are consecutive blocks, so they run at about the same
// time and all but the first read the weight from L2: HBM traffic stays near one pass. The
// arithmetic does not: fp32 FMAs on CUDA cores with every activation read from shared memory for
// each weight row (16 rows x 64 bytes of staged floats per 16-byte int8 vector), so a chunk of 16
// rows is bound by shared-memory bandwidth at roughly 0.5 TB/s of weight on an H200 and a prefill
// of M rows takes about M / 16 times the weight bytes over that, e.g. ~20 ms for 128 tokens of the
// 1B shape against ~1.5 ms for a bf16 tensor-core GEMM. A tiled kernel (dequantized weight tiles
// in shared memory feeding mma, or cuBLASLt on a dequantized copy) is what prefill needs.
int rows_per_chunk(int64_t m) {
  int rows = 1;
  while (rows < m && rows < kMaxRows) rows *= 2;
  return rows;
}

class QuantMatmulStep final : public Step {
 public:
  QuantMatmulStep(const QuantMatmulArgs& a, const Graph& graph)
      : a_(a), dtype_(graph.tensors[a.x].dtype) {}

  Error init(const InitContext& ctx) {
    if (ctx.alignment[size_t(a_.weight)] < blob::kQuantRowAlignment) {
      return fail(nullptr, Error::InvalidProgram,
                  "Kiln op %zu (QuantMatmul): the packed weight (tensor %lld) is %u-byte aligned; "
                  "its 16-byte row loads need 16",
                  ctx.op_index, static_cast<long long>(a_.weight),
                  ctx.alignment[size_t(a_.weight)]);
    }
    rows_ = rows_per_chunk(a_.m);
    shape_ = {a_.m, a_.n, a_.k,
              blob::quant_row_words(a_.k, a_.bits) / 4, a_.k / a_.group_size, a_.group_size,
              static_cast<int>((a_.m + rows_ - 1) / rows_)};
    const int64_t row_blocks = (a_.n + kWarps - 1) / kWarps;
    if (a_.m > 0 && row_blocks * shape_.chunks > INT32_MAX) {
      return fail(nullptr, Error::NotSupported,
                  "Kiln op %zu (QuantMatmul): M = %lld, N = %lld need %lld thread blocks, more "
                  "than a grid holds",
                  ctx.op_index, static_cast<long long>(a_.m), static_cast<long long>(a_.n),
                  static_cast<long long>(row_blocks * shape_.chunks));
    }
    blocks_ = static_cast<unsigned>(row_blocks * shape_.chunks);
    return Error::Ok;
  }

  Error enqueue(const RunContext& ctx) override {
    if (a_.m == 0 || a_.n == 0) return Error::Ok;
    visit_floating(dtype_, [&](auto tag) {
      using T = typename decltype(tag)::type;
      switch (rows_) {
        case 1: launch<T, 1>(ctx); break;
        case 2: launch<T, 2>(ctx); break;
        case 4: launch<T, 4>(ctx); break;
        case 8: launch<T, 8>(ctx); break;
        default: launch<T, 16>(ctx); break;
      }
    });
    return Error::Ok;
  }

 private:
  template <typename T, int kRows>
  void launch(const RunContext& ctx) const {
    const T* x = ctx.ptr<const T>(a_.x);
    const uint4* w = ctx.ptr<const uint4>(a_.weight);
    const float* scales = ctx.ptr<const float>(a_.scales);
    const T* bias = a_.bias == kNoTensor ? nullptr : ctx.ptr<const T>(a_.bias);
    const T* residual = a_.residual == kNoTensor ? nullptr : ctx.ptr<const T>(a_.residual);
    T* out = ctx.ptr<T>(a_.out);
    if (a_.bits == 8) {
      quant_matmul_kernel<T, kRows, 8><<<blocks_, kWarps * 32, 0, ctx.stream>>>(
          x, w, scales, bias, residual, out, shape_, a_.epilogue);
    } else {
      quant_matmul_kernel<T, kRows, 4><<<blocks_, kWarps * 32, 0, ctx.stream>>>(
          x, w, scales, bias, residual, out, shape_, a_.epilogue);
    }
  }

  QuantMatmulArgs a_;
  DType dtype_;
  int rows_ = 1;
  Shape shape_{};
  unsigned blocks_ = 0;
};

}  // namespace

StepResult make_quant_matmul_step(const QuantMatmulArgs& args, const InitContext& ctx) {
  auto step = std::make_unique<QuantMatmulStep>(args, ctx.graph);
  const Error err = step->init(ctx);
  if (err != Error::Ok) return err;
  return std::unique_ptr<Step>(std::move(step));
}

}  // namespace kiln::engine::kernels
