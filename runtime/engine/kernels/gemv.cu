#include "runtime/engine/kernels/gemv.cuh"

#include <cstdlib>
#include <cstring>
#include <type_traits>

#include "format/dtype.h"
#include "runtime/engine/kernels/common.cuh"
#include "runtime/engine/kernels/matmul.cuh"

namespace kiln::engine::kernels {
namespace {

using blob::DType;
using blob::Epilogue;
using executorch::runtime::Error;

constexpr int kMaxRows = 8;                     // M
constexpr size_t kMaxStagedBytes = 48 << 10;    // the activations, fp32, in shared memory
constexpr int kWarps = 8;                       // per block
constexpr int64_t kMaxNarrowK = 256;            // the element-wise path's K (below 16-byte rows)
constexpr int64_t kLtWeightBytes = int64_t(48) << 20;   // larger 16-bit weights go to cuBLASLt

struct GemvParams {
  const void* a;          // [M, K]
  const void* b;          // [N, K], the weight
  void* out;              // [M, N]
  const void* residual;   // [M, N] or null
  const void* bias;       // bias[m * bias_row_stride + n * bias_col_stride] or null
  DType bias_dtype;
  int64_t bias_row_stride, bias_col_stride;
  float alpha, beta;
  Epilogue act;
  int n, k;
  bool b_constant;        // b is a weight: no kernel writes it, so it is read before the wait
};

constexpr int kLoads = 8;   // 16-byte weight vectors in flight per lane

// out[m, col] = act(alpha * a[m, :] . b[col, :] + residual[m, col] + beta * bias[...]). A warp per
// output column streams its weight row with 16-byte loads (kLoads in flight per lane) and dots it
// with the M activation rows staged in shared memory as fp32; fp32 accumulation, one rounding.
// The warp's first weight vectors are requested before the activations are staged, so the two
// memory round trips overlap instead of adding up at the start of every block.
// kWide false: rows that are not whole 16-byte vectors (a squeeze-excitation FC's K of 4..28)
// are read an element a lane.
template <typename T, int kM, bool kWide>
__global__ void __launch_bounds__(kWarps * 32) gemv_kernel(const GemvParams p) {
  constexpr int kVector = 16 / static_cast<int>(sizeof(T));  // elements per 16-byte load
  extern __shared__ float staged[];   // [kM][K]
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const T* b = static_cast<const T*>(p.b);
  const int first = blockIdx.x * kWarps + warp;
  const int vectors = p.k / kVector;
  // Launched overlapped (launch_overlapped): a weight's first vectors are requested while the
  // kernel before still runs; the activations (and a computed b) only after it has finished.
  if (!p.b_constant) wait_for_previous_kernel();
  uint4 ahead[kLoads];
  if constexpr (kWide) {
    const uint4* row = reinterpret_cast<const uint4*>(b + static_cast<size_t>(first) * p.k);
#pragma unroll
    for (int u = 0; u < kLoads; ++u) {
      const int v = lane + 32 * u;
      ahead[u] = first < p.n && v < vectors ? __ldg(row + v) : make_uint4(0, 0, 0, 0);
    }
  }
  wait_for_previous_kernel();
  allow_next_kernel();
  const T* a = static_cast<const T*>(p.a);
  if constexpr (kWide) {
    // 16-byte loads of the activations, several in flight per thread: a K of 8192 staged in one
    // round trip, where an element a thread took one per 256 elements.
    const uint4* a4 = reinterpret_cast<const uint4*>(a);
#pragma unroll 4
    for (int i = threadIdx.x; i < kM * vectors; i += blockDim.x) {
      const uint4 packed = __ldg(a4 + i);
      const T* e = reinterpret_cast<const T*>(&packed);
#pragma unroll
      for (int q = 0; q < kVector / 4; ++q) {
        reinterpret_cast<float4*>(staged + i * kVector)[q] =
            make_float4(to_float(e[4 * q]), to_float(e[4 * q + 1]), to_float(e[4 * q + 2]),
                        to_float(e[4 * q + 3]));
      }
    }
  } else {
    for (int i = threadIdx.x; i < kM * p.k; i += blockDim.x) staged[i] = to_float(a[i]);
  }
  __syncthreads();
  for (int col = first; col < p.n; col += gridDim.x * kWarps) {
    const T* weight_row = b + static_cast<size_t>(col) * p.k;
    float acc[kM] = {};
    if constexpr (kWide) {
      const uint4* row = reinterpret_cast<const uint4*>(weight_row);
      for (int v0 = lane; v0 < vectors; v0 += 32 * kLoads) {
        uint4 loaded[kLoads];
#pragma unroll
        for (int u = 0; u < kLoads; ++u) {
          const int v = v0 + 32 * u;
          loaded[u] = col == first && v0 == lane ? ahead[u]
                      : v < vectors              ? __ldg(row + v)
                                                 : make_uint4(0, 0, 0, 0);
        }
#pragma unroll
        for (int u = 0; u < kLoads; ++u) {
          const int v = v0 + 32 * u;
          if (v >= vectors) continue;   // not break: `loaded` stays in registers
          const T* w = reinterpret_cast<const T*>(&loaded[u]);
#pragma unroll
          for (int m = 0; m < kM; ++m) {
            const float4* x = reinterpret_cast<const float4*>(staged + m * p.k + v * kVector);
#pragma unroll
            for (int q = 0; q < kVector / 4; ++q) {
              const float4 xq = x[q];
              acc[m] += to_float(w[4 * q]) * xq.x + to_float(w[4 * q + 1]) * xq.y +
                        to_float(w[4 * q + 2]) * xq.z + to_float(w[4 * q + 3]) * xq.w;
            }
          }
        }
      }
    } else {
      for (int kk = lane; kk < p.k; kk += 32) {
        const float w = to_float(weight_row[kk]);
#pragma unroll
        for (int m = 0; m < kM; ++m) acc[m] += w * staged[m * p.k + kk];
      }
    }
#pragma unroll
    for (int m = 0; m < kM; ++m) {
      for (int offset = 16; offset > 0; offset /= 2) {
        acc[m] += __shfl_xor_sync(0xffffffffu, acc[m], offset);
      }
    }
    if (lane == 0) {
      T* out = static_cast<T*>(p.out);
      const T* residual = static_cast<const T*>(p.residual);
#pragma unroll
      for (int m = 0; m < kM; ++m) {
        const int64_t i = static_cast<int64_t>(m) * p.n + col;
        float v = p.alpha * acc[m];
        if (residual != nullptr) v += to_float(residual[i]);
        if (p.bias != nullptr) {
          v += p.beta * static_cast<float>(load_f64(
                            p.bias, p.bias_dtype, m * p.bias_row_stride + col * p.bias_col_stride));
        }
        out[i] = from_float<T>(apply_epilogue(v, p.act));
      }
    }
  }
}

class GemvStep final : public Step {
 public:
  GemvStep(const MatmulArgs& a, DType dtype, DType bias_dtype, bool wide, bool b_constant)
      : a_(a), dtype_(dtype), bias_dtype_(bias_dtype), wide_(wide), b_constant_(b_constant) {}

  Error enqueue(const RunContext& ctx) override {
    GemvParams p{ctx.ptr(a_.a), ctx.ptr(a_.b), ctx.ptr(a_.out),
                 a_.residual == kNoTensor ? nullptr : ctx.ptr(a_.residual),
                 a_.bias == kNoTensor ? nullptr : ctx.ptr(a_.bias), bias_dtype_,
                 a_.bias_row_stride, a_.bias_col_stride, static_cast<float>(a_.alpha),
                 static_cast<float>(a_.beta), a_.epilogue, static_cast<int>(a_.n),
                 static_cast<int>(a_.k), b_constant_};
    const size_t staged = static_cast<size_t>(a_.m * a_.k) * sizeof(float);
    // Enough blocks to keep every SM streaming; each stages the activations once.
    const unsigned blocks = blocks_for(a_.n, kWarps, ctx.max_blocks);
    auto launch = [&](auto tag, auto rows) {
      using T = typename decltype(tag)::type;
      constexpr int kM = decltype(rows)::value;
      if (wide_) {
        launch_overlapped(gemv_kernel<T, kM, true>, blocks, kWarps * 32, staged, ctx.stream, p);
      } else {
        launch_overlapped(gemv_kernel<T, kM, false>, blocks, kWarps * 32, staged, ctx.stream, p);
      }
    };
    visit_floating(dtype_, [&](auto tag) {
      switch (a_.m) {  // the rows are a template argument: acc[] stays in registers
        case 1: launch(tag, std::integral_constant<int, 1>{}); break;
        case 2: launch(tag, std::integral_constant<int, 2>{}); break;
        case 3: launch(tag, std::integral_constant<int, 3>{}); break;
        case 4: launch(tag, std::integral_constant<int, 4>{}); break;
        case 5: launch(tag, std::integral_constant<int, 5>{}); break;
        case 6: launch(tag, std::integral_constant<int, 6>{}); break;
        case 7: launch(tag, std::integral_constant<int, 7>{}); break;
        default: launch(tag, std::integral_constant<int, kMaxRows>{}); break;
      }
    });
    return Error::Ok;
  }

 private:
  MatmulArgs a_;
  DType dtype_, bias_dtype_;
  bool wide_;  // whole 16-byte weight rows, aligned: the vector loop
  bool b_constant_;  // b is a weight (read before the previous kernel has finished)
};

// Whether the op's weight rows are whole, aligned 16-byte vectors (the kernel's vector loop).
bool wide_rows(const MatmulArgs& a, const InitContext& ctx) {
  const size_t bytes = element_size(ctx.graph.tensors[a.a].dtype);
  return (a.k * int64_t(bytes)) % 16 == 0 && ctx.alignment[a.a] >= 16 &&
         ctx.alignment[a.b] >= 16;
}

}  // namespace

const char* gemv_unsupported(const MatmulArgs& a, const InitContext& ctx) {
  const char* env = std::getenv("KILN_GEMV");
  if (env != nullptr && std::strcmp(env, "off") == 0) return "KILN_GEMV=off";
  const Graph& g = ctx.graph;
  const DType dtype = g.tensors[a.a].dtype;
  if ((dtype != DType::kBFloat16 && dtype != DType::kFloat16 && dtype != DType::kFloat32) ||
      g.tensors[a.b].dtype != dtype || g.tensors[a.out].dtype != dtype) {
    return "not one floating dtype throughout";
  }
  // Every dtype accumulates in fp32 (for fp32 operands exact products: what TF32 only permits
  // rounding away).
  if (a.batch != 1 || a.m < 1 || a.m > kMaxRows || a.trans_a || !a.trans_b) {
    return "not M <= 8 rows against an [N, K] weight";
  }
  if (a.k > INT32_MAX / kMaxRows || a.n > INT32_MAX ||
      static_cast<size_t>(a.m * a.k) * sizeof(float) > kMaxStagedBytes) {
    return "the activations exceed the staging space";
  }
  if (!wide_rows(a, ctx) && a.k > kMaxNarrowK) {
    return "weight rows not whole aligned 16-byte vectors, at a K the element-wise loop is slow for";
  }
  // A large 16-bit weight at one row streams faster through cuBLASLt where it fuses the whole
  // epilogue (H200, weights from HBM: 16384 x 2048 bf16 18.8 us against 22.3, the 128256 x 2048 LM
  // head 125.6 against 135.5; at 2048 x 2048 Kiln's 5.4 beat 6.1, at 2048 x 8192 they are within
  // 5 %: engine_decode_times_gpu_test).
  const bool lt_bias = a.bias != kNoTensor && lt_per_column_bias(a, g.tensors[a.bias].dtype, dtype);
  Epilogue rest = Epilogue::kNone;
  lt_epilogue(lt_bias, a.epilogue, rest);
  const bool lt_fuses_all = (a.bias == kNoTensor || lt_bias) && rest == Epilogue::kNone;
  if (dtype != DType::kFloat32 && a.m == 1 && lt_fuses_all &&
      a.n * a.k * int64_t(element_size(dtype)) >= kLtWeightBytes) {
    return "a 16-bit weight of 48 MiB or more at one row, which cuBLASLt streams faster";
  }
  return nullptr;
}

StepResult make_gemv_step(const MatmulArgs& a, const InitContext& ctx) {
  const Graph& g = ctx.graph;
  const DType bias_dtype = a.bias == kNoTensor ? g.tensors[a.out].dtype : g.tensors[a.bias].dtype;
  return std::unique_ptr<Step>(
      new GemvStep(a, g.tensors[a.a].dtype, bias_dtype, wide_rows(a, ctx),
                   g.tensors[a.b].storage == blob::Storage::kWeight));
}

}  // namespace kiln::engine::kernels
