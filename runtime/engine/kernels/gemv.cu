#include "runtime/engine/kernels/gemv.cuh"

#include <type_traits>

#include "format/dtype.h"
#include "runtime/engine/kernels/common.cuh"
#include "runtime/engine/kernels/elementwise.cuh"
#include "runtime/engine/kernels/elementwise_math.cuh"
#include "runtime/engine/kernels/matmul.cuh"
#include "runtime/engine/kernels/quant_matmul.cuh"
#include "runtime/engine/op_tensors.h"
#include "runtime/engine/env_switch.h"

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
  // A folded kLayerNorm (Prologue::kNorm): `a` is the norm's input, normalised per row as it is
  // staged.
  const void* norm_weight;   // null: 1
  const void* norm_bias;     // null: 0
  DType norm_weight_dtype, norm_bias_dtype;
  float eps;
  bool rms;
  // A folded gated activation (Prologue::kGlu): staged act(a) * glu_b, each step rounded to T.
  const void* glu_b;
  blob::UnaryKind glu_act;
};

// What the GEMV computes from its activations as it stages them: the op before it, folded in.
// kRms is an RMSNorm without bias: its scale 1 / rms(x) is a per-row factor of the dot product,
// so the kernel stages x * weight and applies the factor to the sums, with no pass of its own.
enum class Prologue { kNone, kNorm, kRms, kGlu };

constexpr int kLoads = 8;   // 16-byte weight vectors in flight per lane

// The same for the 16-byte vectors of a and b: returns the vector of the products.
template <typename T>
__device__ __forceinline__ uint4 gated_vector(uint4 a, uint4 b, blob::UnaryKind act) {
  constexpr int kN = 16 / static_cast<int>(sizeof(T));
  const T* x = reinterpret_cast<const T*>(&a);
  const T* y = reinterpret_cast<const T*>(&b);
  uint4 out;
  T* o = reinterpret_cast<T*>(&out);
#pragma unroll
  for (int e = 0; e < kN; ++e) o[e] = from_float<T>(gated(x[e], y[e], act));
  return out;
}

// Stores the 16-byte vector v of T values at `to` as fp32; returns their sum.
template <typename T>
__device__ __forceinline__ float stage_vector(float* to, uint4 v) {
  constexpr int kN = 16 / static_cast<int>(sizeof(T));
  const T* e = reinterpret_cast<const T*>(&v);
  float sum = 0.0f;
#pragma unroll
  for (int q = 0; q < kN / 4; ++q) {
    const float4 f = make_float4(to_float(e[4 * q]), to_float(e[4 * q + 1]),
                                 to_float(e[4 * q + 2]), to_float(e[4 * q + 3]));
    reinterpret_cast<float4*>(to)[q] = f;
    sum += (f.x + f.y) + (f.z + f.w);
  }
  return sum;
}

// Stores x * g (16-byte vectors of T; g null: 1) at `to` as fp32, unrounded; returns the sum of
// x's squares.
template <typename T>
__device__ __forceinline__ float stage_scaled_vector(float* to, uint4 x, const uint4* g) {
  constexpr int kN = 16 / static_cast<int>(sizeof(T));
  const T* e = reinterpret_cast<const T*>(&x);
  const T* w = reinterpret_cast<const T*>(g);
  float squares = 0.0f;
#pragma unroll
  for (int q = 0; q < kN / 4; ++q) {
    float f[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      f[j] = to_float(e[4 * q + j]);
      squares += f[j] * f[j];
      if (g != nullptr) f[j] *= to_float(w[4 * q + j]);
    }
    reinterpret_cast<float4*>(to)[q] = make_float4(f[0], f[1], f[2], f[3]);
  }
  return squares;
}

// The sum over the block of each row's per-thread parts, in every thread (`red`: kWarps * kM
// floats of shared memory, free on entry and on return).
template <int kM>
__device__ __forceinline__ void block_row_sums(float (&part)[kM], float* red) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
  for (int m = 0; m < kM; ++m) {
    const float v = warp_reduce(part[m], SumOp{});
    if (lane == 0) red[warp * kM + m] = v;
  }
  __syncthreads();
#pragma unroll
  for (int m = 0; m < kM; ++m) {
    float v = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) v += red[w * kM + m];
    part[m] = v;
  }
  __syncthreads();
}

// The rows a folded kLayerNorm would have written, from its input staged as fp32 in shared
// memory by the 16-byte staging loop of gemv_kernel (each thread normalises the vectors it
// staged; row_sum holds its part of each row's sum), with the norm's weight and bias staged in
// `affine`. The mean, then the variance around it, as layer_norm.cu (RMSNorm: mean 0).
template <typename T, int kM>
__device__ __forceinline__ void normalize_staged(float* staged, const float* affine,
                                                 float (&row_sum)[kM], const GemvParams& p) {
  constexpr int kVector = 16 / static_cast<int>(sizeof(T));
  __shared__ float red[kWarps * kM];
  const int vectors = p.k / kVector;
  const float inv_k = 1.0f / static_cast<float>(p.k);
  float mean[kM], squares[kM];
  if (!p.rms) block_row_sums<kM>(row_sum, red);
#pragma unroll
  for (int m = 0; m < kM; ++m) {
    mean[m] = p.rms ? 0.0f : row_sum[m] * inv_k;
    squares[m] = 0.0f;
  }
  for (int i = threadIdx.x; i < kM * vectors; i += blockDim.x) {
    const int row = i / vectors;
    float sq = 0.0f, mu = 0.0f;
#pragma unroll
    for (int m = 0; m < kM; ++m) mu = m == row ? mean[m] : mu;
#pragma unroll
    for (int q = 0; q < kVector; ++q) {
      const float d = staged[i * kVector + q] - mu;
      sq += d * d;
    }
#pragma unroll
    for (int m = 0; m < kM; ++m) squares[m] += m == row ? sq : 0.0f;
  }
  block_row_sums<kM>(squares, red);
  for (int i = threadIdx.x; i < kM * vectors; i += blockDim.x) {
    const int row = i / vectors, c0 = (i - row * vectors) * kVector;
    float mu = 0.0f, rstd = 0.0f;
#pragma unroll
    for (int m = 0; m < kM; ++m) {
      if (m == row) {
        mu = mean[m];
        rstd = rsqrtf(squares[m] * inv_k + p.eps);
      }
    }
#pragma unroll
    for (int q = 0; q < kVector; ++q) {
      float y = (staged[i * kVector + q] - mu) * rstd;
      if (p.norm_weight != nullptr) y *= affine[c0 + q];
      if (p.norm_bias != nullptr) y += affine[p.k + c0 + q];
      staged[i * kVector + q] = to_float(from_float<T>(y));
    }
  }
  __syncthreads();
}

// out[m, col] = act(alpha * a[m, :] . b[col, :] + residual[m, col] + beta * bias[...]). A warp per
// output column streams its weight row with 16-byte loads (kLoads in flight per lane) and dots it
// with the M activation rows staged in shared memory as fp32; fp32 accumulation, one rounding.
// The warp's first weight vectors are requested before the activations are staged, so the two
// memory round trips overlap instead of adding up at the start of every block.
// kWide false: rows that are not whole 16-byte vectors (a squeeze-excitation FC's K of 4..28)
// are read an element a lane.
// kPro, the folded op before it: kNorm, the activations are a kLayerNorm's input, and every
// block normalises the rows it staged (as layer_norm.cu does: the mean, then the variance around
// it; RMSNorm's mean is 0), rounding each value to T as the norm's output tensor would have;
// kRms, they are a bias-free RMSNorm's input: staged times the norm's weight, and each row's
// sums scaled by rsqrt(mean(x^2) + eps) at the end (the normalised row is not rounded to T);
// kGlu, they are the gate of a SwiGLU / GeGLU (act(a) * glu_b, as glu_kernel rounds it). A
// decoder's norm and its projection, or its gate and the down projection, are one kernel, and
// the staged row never goes through memory.
template <typename T, int kM, bool kWide, Prologue kPro = Prologue::kNone>
__global__ void __launch_bounds__(kWarps * 32) gemv_kernel(const GemvParams p) {
  static_assert((kPro != Prologue::kNorm && kPro != Prologue::kRms) || kWide,
                "a folded norm reads whole 16-byte vectors");
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
  float row_sum[kM] = {};                  // kNorm: this thread's part of each row's sum
  float* affine = staged + kM * p.k;       // kNorm: the norm's weight [K] and bias [K]
  if constexpr (kWide) {
    // 16-byte loads of the activations, several in flight per thread: a K of 8192 staged in one
    // round trip, where an element a thread took one per 256 elements.
    const uint4* a4 = reinterpret_cast<const uint4*>(a);
#pragma unroll 4
    for (int i = threadIdx.x; i < kM * vectors; i += blockDim.x) {
      uint4 packed = __ldg(a4 + i);
      if constexpr (kPro == Prologue::kRms) {
        const int row = i / vectors;
        uint4 g;
        if (p.norm_weight != nullptr) g = __ldg(reinterpret_cast<const uint4*>(p.norm_weight) + (i - row * vectors));
        const float squares = stage_scaled_vector<T>(staged + i * kVector, packed,
                                                     p.norm_weight != nullptr ? &g : nullptr);
#pragma unroll
        for (int m = 0; m < kM; ++m) row_sum[m] += m == row ? squares : 0.0f;
        continue;
      }
      if constexpr (kPro == Prologue::kGlu) {
        packed = gated_vector<T>(packed, __ldg(reinterpret_cast<const uint4*>(p.glu_b) + i),
                                 p.glu_act);
      }
      if constexpr (kPro == Prologue::kNorm) {
        // The norm's weight and bias go to shared memory with the first row, loaded in the same
        // round trip as the activations.
        if (i < vectors && p.norm_weight != nullptr) {
          stage_vector<T>(affine + i * kVector, __ldg(reinterpret_cast<const uint4*>(p.norm_weight) + i));
        }
        if (i < vectors && p.norm_bias != nullptr) {
          stage_vector<T>(affine + p.k + i * kVector,
                          __ldg(reinterpret_cast<const uint4*>(p.norm_bias) + i));
        }
      }
      const float sum = stage_vector<T>(staged + i * kVector, packed);
      if constexpr (kPro == Prologue::kNorm) {
        const int row = i / vectors;
#pragma unroll
        for (int m = 0; m < kM; ++m) row_sum[m] += m == row ? sum : 0.0f;
      }
    }
  } else {
    for (int i = threadIdx.x; i < kM * p.k; i += blockDim.x) {
      staged[i] = kPro == Prologue::kGlu
                      ? gated(a[i], static_cast<const T*>(p.glu_b)[i], p.glu_act)
                      : to_float(a[i]);
    }
  }
  __syncthreads();
  if constexpr (kPro == Prologue::kNorm) normalize_staged<T, kM>(staged, affine, row_sum, p);
  float row_scale[kM];   // kRms: 1 / rms of each row
#pragma unroll
  for (int m = 0; m < kM; ++m) row_scale[m] = p.alpha;
  if constexpr (kPro == Prologue::kRms) {
    __shared__ float red[kWarps * kM];
    block_row_sums<kM>(row_sum, red);
#pragma unroll
    for (int m = 0; m < kM; ++m) row_scale[m] *= rsqrtf(row_sum[m] / static_cast<float>(p.k) + p.eps);
  }
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
        float v = row_scale[m] * acc[m];
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

// The op folded into a GEMV step: a kLayerNorm (norm) or a gated activation (glu), or neither.
struct Folded {
  Prologue kind = Prologue::kNone;
  LayerNormArgs norm{};
  int64_t glu_a = kNoTensor, glu_b = kNoTensor;   // act(glu_a) * glu_b
  blob::UnaryKind glu_act = blob::UnaryKind::kSilu;
};

// Rows of K floats a folded norm's weight and bias take after the staged activations (the bias
// is the second).
int64_t affine_rows(const Folded& f) {
  if (f.kind != Prologue::kNorm) return 0;
  return f.norm.bias != kNoTensor ? 2 : f.norm.weight != kNoTensor ? 1 : 0;
}

class GemvStep final : public Step {
 public:
  GemvStep(const MatmulArgs& a, const Graph& g, bool wide, const Folded& folded)
      : a_(a), dtype_(g.tensors[a.a].dtype),
        bias_dtype_(a.bias == kNoTensor ? g.tensors[a.out].dtype : g.tensors[a.bias].dtype),
        wide_(wide), b_constant_(g.tensors[a.b].storage == blob::Storage::kWeight), f_(folded) {
    if (f_.kind == Prologue::kNorm || f_.kind == Prologue::kRms) {
      ln_weight_dtype_ = f_.norm.weight == kNoTensor ? dtype_ : g.tensors[f_.norm.weight].dtype;
      ln_bias_dtype_ = f_.norm.bias == kNoTensor ? dtype_ : g.tensors[f_.norm.bias].dtype;
    }
  }

  Error enqueue(const RunContext& ctx) override {
    const bool norm = f_.kind == Prologue::kNorm || f_.kind == Prologue::kRms;
    const int64_t staged_from = norm ? f_.norm.x : f_.kind == Prologue::kGlu ? f_.glu_a : a_.a;
    GemvParams p{ctx.ptr(staged_from), ctx.ptr(a_.b), ctx.ptr(a_.out),
                 a_.residual == kNoTensor ? nullptr : ctx.ptr(a_.residual),
                 a_.bias == kNoTensor ? nullptr : ctx.ptr(a_.bias), bias_dtype_,
                 a_.bias_row_stride, a_.bias_col_stride, static_cast<float>(a_.alpha),
                 static_cast<float>(a_.beta), a_.epilogue, static_cast<int>(a_.n),
                 static_cast<int>(a_.k), b_constant_,
                 norm && f_.norm.weight != kNoTensor ? ctx.ptr(f_.norm.weight) : nullptr,
                 norm && f_.norm.bias != kNoTensor ? ctx.ptr(f_.norm.bias) : nullptr,
                 ln_weight_dtype_, ln_bias_dtype_, static_cast<float>(f_.norm.eps), f_.norm.rms,
                 f_.kind == Prologue::kGlu ? ctx.ptr(f_.glu_b) : nullptr, f_.glu_act};
    const size_t staged = static_cast<size_t>(a_.m * a_.k + affine_rows(f_) * a_.k) * sizeof(float);
    // Enough blocks to keep every SM streaming; each stages the activations once.
    const unsigned blocks = blocks_for(a_.n, kWarps, ctx.max_blocks);
    auto launch = [&](auto tag, auto rows) {
      using T = typename decltype(tag)::type;
      constexpr int kM = decltype(rows)::value;
      auto go = [&](auto kernel) {
        launch_overlapped(kernel, blocks, kWarps * 32, staged, ctx.stream, p);
      };
      switch (f_.kind) {
        case Prologue::kNone:
          wide_ ? go(gemv_kernel<T, kM, true>) : go(gemv_kernel<T, kM, false>);
          break;
        case Prologue::kNorm:   // only over whole 16-byte rows (folded_gemv_unsupported)
          go(gemv_kernel<T, kM, true, Prologue::kNorm>);
          break;
        case Prologue::kRms:
          go(gemv_kernel<T, kM, true, Prologue::kRms>);
          break;
        case Prologue::kGlu:
          wide_ ? go(gemv_kernel<T, kM, true, Prologue::kGlu>)
                : go(gemv_kernel<T, kM, false, Prologue::kGlu>);
          break;
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
  Folded f_;
  DType ln_weight_dtype_ = DType::kFloat32, ln_bias_dtype_ = DType::kFloat32;
};

// The op a folded step stands for: its work runs in a later op's step, so it enqueues nothing.
class FoldedStep final : public Step {
 public:
  Error enqueue(const RunContext&) override { return Error::Ok; }
};

// Whether the op's weight rows are whole, aligned 16-byte vectors (the kernel's vector loop);
// `a` is the tensor the kernel stages (a folded norm's input, or the op's own a).
bool wide_rows(const MatmulArgs& m, int64_t a, const InitContext& ctx) {
  const size_t bytes = element_size(ctx.graph.tensors[m.a].dtype);
  return (m.k * int64_t(bytes)) % 16 == 0 && ctx.alignment[a] >= 16 &&
         ctx.alignment[m.b] >= 16;
}

// gemv_unsupported; folded: a norm is folded in, so the GEMV takes even the weights cuBLASLt
// streams as fast (it would cost the norm's kernel).
const char* unsupported(const MatmulArgs& a, int64_t staged, const InitContext& ctx, bool folded) {
  if (env_is("KILN_GEMV", "off")) return "KILN_GEMV=off";
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
  if (!wide_rows(a, staged, ctx) && a.k > kMaxNarrowK) {
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
  if (!folded && dtype != DType::kFloat32 && a.m == 1 && lt_fuses_all &&
      a.n * a.k * int64_t(element_size(dtype)) >= kLtWeightBytes) {
    return "a 16-bit weight of 48 MiB or more at one row, which cuBLASLt streams faster";
  }
  return nullptr;
}

}  // namespace

const char* gemv_unsupported(const MatmulArgs& a, const InitContext& ctx) {
  return unsupported(a, a.a, ctx, false);
}

StepResult make_gemv_step(const MatmulArgs& a, const InitContext& ctx) {
  return std::unique_ptr<Step>(new GemvStep(a, ctx.graph, wide_rows(a, a.a, ctx), Folded{}));
}

namespace {

// Whether a tensor's strides read it in order, element i at offset i (size-1 dimensions aside).
bool dense(const Tensor& t, const int64_t* strides) {
  int64_t expect = 1;
  for (uint32_t d = t.rank; d-- > 0;) {
    if (t.sizes[d] != 1 && strides[d] != expect) return false;
    expect *= t.sizes[d];
  }
  return true;
}

// What op `op` is as a GEMV prologue, with `staged` the tensor the GEMV reads in its place;
// nullptr, or why not.
const char* folded_form(const Graph& g, size_t op, Folded* f, int64_t* out, int64_t* staged) {
  const Op& o = g.ops[op];
  if (o.opcode == blob::Opcode::kLayerNorm) {
    // Opt-in: on the H200 the folded prologue costs the GEMV more than the norm's own kernel
    // (llama1b_2l decode 0.350 ms folded, 0.309 apart), so norms stay apart by default.
    if (!env_is("KILN_GEMV_NORM", "on")) return "KILN_GEMV_NORM is not on";
    f->norm = std::get<LayerNormArgs>(o.args);
    f->kind = f->norm.rms && f->norm.bias == kNoTensor ? Prologue::kRms : Prologue::kNorm;
    *out = f->norm.out;
    *staged = f->norm.x;
    return nullptr;
  }
  if (o.opcode != blob::Opcode::kFusedElementwise) return "not a layer norm or a gated activation";
  if (env_is("KILN_GEMV_GLU", "off")) return "KILN_GEMV_GLU=off";
  const auto& fe = std::get<FusedElementwiseArgs>(o.args);
  const DType dtype = g.tensors[size_t(fe.out)].dtype;
  int32_t act_input = 0;
  if (!is_floating(dtype) || !glu_program(fe, dtype, &act_input, &f->glu_act)) {
    return "not a gated activation";
  }
  for (uint32_t k = 0; k < 2; ++k) {
    const Tensor& in = g.tensors[size_t(fe.inputs[k])];
    if (in.dtype != dtype || in.numel != g.tensors[size_t(fe.out)].numel ||
        !dense(g.tensors[size_t(fe.out)], fe.strides[k])) {
      return "the gated activation's inputs are not read in order";
    }
  }
  f->kind = Prologue::kGlu;
  f->glu_a = fe.inputs[act_input];
  f->glu_b = fe.inputs[1 - act_input];
  *out = fe.out;
  *staged = f->glu_a;
  return nullptr;
}

}  // namespace

namespace {

// The checks of a fold whatever the GEMV: op ctx.op_index reads op's output (f's `out`) as its
// activations `x` ([m, k] rows) and writes `out`; nullptr, or why not.
const char* consumer_unsupported(size_t op, const InitContext& ctx, const Folded& f,
                                 int64_t made_by_op, int64_t x, int64_t out, int64_t m,
                                 int64_t k) {
  const Graph& g = ctx.graph;
  const Tensor& made = g.tensors[size_t(made_by_op)];
  const Tensor& a = g.tensors[size_t(x)];
  const ArenaRange range = arena_range(g, made_by_op);
  // The consumer's `x` is the op's output (or a view of all of it: a reshape).
  if (range.begin == range.end || a.storage != blob::Storage::kArena || a.offset != made.offset ||
      a.nbytes != made.nbytes || a.dtype != made.dtype) {
    return "the matmul's a is not the op's output";
  }
  if (made.numel != m * k ||
      (f.kind != Prologue::kGlu && (m != f.norm.rows || k != f.norm.cols))) {
    return "the matmul's rows are not the op's rows";
  }
  bool other_operand = false;
  for_each_tensor(g.ops[ctx.op_index], [&](int64_t t, blob::Role) {
    if (t != x && arena_range(g, t).overlaps(range)) other_operand = true;
  });
  if (other_operand) return "the matmul reads the op's output as another operand";
  // The GEMV writes its output while other blocks still stage the op's inputs.
  bool shared = false;
  for_each_tensor(g.ops[op], [&](int64_t t, blob::Role role) {
    if (is_read(role) && arena_range(g, out).overlaps(arena_range(g, t))) shared = true;
  });
  if (shared) return "the matmul's output shares an input's memory";
  if (read_later(g, range, ctx.op_index)) return "the op's output is read by another op";
  return nullptr;
}

// The quantized decode kernel's fold (quant_matmul.cuh): a gated activation only.
const char* quant_fold_unsupported(size_t op, const InitContext& ctx, QuantGate* gate) {
  const Graph& g = ctx.graph;
  Folded f;
  int64_t made = kNoTensor, staged = kNoTensor;
  if (g.ops[op].opcode != blob::Opcode::kFusedElementwise) {
    return "a quantized matmul folds only a gated activation";
  }
  if (const char* why = folded_form(g, op, &f, &made, &staged)) return why;
  const auto& qm = std::get<QuantMatmulArgs>(g.ops[ctx.op_index].args);
  if (const char* why = quant_gemv_unsupported(qm)) return why;
  if (const char* why = consumer_unsupported(op, ctx, f, made, qm.x, qm.out, qm.m, qm.k)) {
    return why;
  }
  if (gate != nullptr) *gate = QuantGate{f.glu_a, f.glu_b, f.glu_act};
  return nullptr;
}

}  // namespace

const char* folded_gemv_unsupported(size_t op, const InitContext& ctx) {
  const Graph& g = ctx.graph;
  if (op + 1 != ctx.op_index) return "the next op is not a matmul";
  if (g.ops[ctx.op_index].opcode == blob::Opcode::kQuantMatmul) {
    return quant_fold_unsupported(op, ctx, nullptr);
  }
  if (g.ops[ctx.op_index].opcode != blob::Opcode::kMatmul) return "the next op is not a matmul";
  Folded f;
  int64_t out = kNoTensor, staged = kNoTensor;
  if (const char* why = folded_form(g, op, &f, &out, &staged)) return why;
  const auto& mm = std::get<MatmulArgs>(g.ops[ctx.op_index].args);
  if (mm.batch != 1 || mm.trans_a) return "the matmul's rows are not the op's rows";
  if (const char* why = consumer_unsupported(op, ctx, f, out, mm.a, mm.out, mm.m, mm.k)) {
    return why;
  }
  const Tensor& a = g.tensors[size_t(mm.a)];
  if (f.kind == Prologue::kGlu && wide_rows(mm, staged, ctx) && ctx.alignment[f.glu_b] < 16) {
    return "the gate's second input is not 16-byte aligned";
  }
  if (f.kind == Prologue::kNorm || f.kind == Prologue::kRms) {
    // The norm's rows, weight and bias are read as 16-byte vectors of the activation dtype.
    if (!wide_rows(mm, staged, ctx)) return "the norm's rows are not whole 16-byte vectors";
    for (int64_t t : {f.norm.weight, f.norm.bias}) {
      if (t != kNoTensor && (g.tensors[size_t(t)].dtype != a.dtype || ctx.alignment[t] < 16)) {
        return "the norm's weight or bias is not 16-byte aligned in the activation dtype";
      }
    }
    if (static_cast<size_t>((mm.m + affine_rows(f)) * mm.k) * sizeof(float) > kMaxStagedBytes) {
      return "the rows with the norm's weight and bias exceed the staging space";
    }
  }
  return unsupported(mm, staged, ctx, true);
}

StepResult make_folded_gemv_step(size_t op, const InitContext& ctx) {
  if (ctx.graph.ops[ctx.op_index].opcode == blob::Opcode::kQuantMatmul) {
    QuantGate gate;
    quant_fold_unsupported(op, ctx, &gate);
    return make_quant_matmul_step(std::get<QuantMatmulArgs>(ctx.graph.ops[ctx.op_index].args),
                                  ctx, gate);
  }
  Folded f;
  int64_t out = kNoTensor, staged = kNoTensor;
  folded_form(ctx.graph, op, &f, &out, &staged);
  const auto& mm = std::get<MatmulArgs>(ctx.graph.ops[ctx.op_index].args);
  return std::unique_ptr<Step>(new GemvStep(mm, ctx.graph, wide_rows(mm, staged, ctx), f));
}

std::unique_ptr<Step> make_folded_step() { return std::make_unique<FoldedStep>(); }

}  // namespace kiln::engine::kernels
