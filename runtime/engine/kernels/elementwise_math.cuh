// The elementwise math of kBinary and kUnary (GELU itself lives in common.cuh, which the matmul
// epilogue shares): one device function per kind family, shared by the typed, vectorised and
// dynamic-dtype kernels in elementwise.cu.
#pragma once

#include <cstdint>

#include "format/blob_format.h"
#include "runtime/engine/kernels/common.cuh"

namespace kiln::engine::kernels {

// Float kinds follow PyTorch's definitions (NaN-propagating maximum/minimum, Python-style
// floor division and remainder); integer kinds wrap on overflow instead of being undefined.

__device__ __forceinline__ float nan_max(float a, float b) {
  return a != a ? a : (b != b ? b : fmaxf(a, b));
}

__device__ __forceinline__ float nan_min(float a, float b) {
  return a != a ? a : (b != b ? b : fminf(a, b));
}

// c10::div_floor_floating.
__device__ __forceinline__ float floor_divide(float a, float b) {
  if (b == 0.0f) {
    return a / b;
  }
  const float mod = fmodf(a, b);
  float div = (a - mod) / b;
  if (mod != 0.0f && (b < 0.0f) != (mod < 0.0f)) {
    div -= 1.0f;
  }
  if (div == 0.0f) {
    return copysignf(0.0f, a / b);
  }
  float floordiv = floorf(div);
  if (div - floordiv > 0.5f) {
    floordiv += 1.0f;
  }
  return floordiv;
}

__device__ __forceinline__ float remainder(float a, float b) {
  float mod = fmodf(a, b);
  if (mod != 0.0f && (b < 0.0f) != (mod < 0.0f)) {
    mod += b;
  }
  return mod;
}

__device__ __forceinline__ float binary_float(blob::BinaryKind kind, float a, float b,
                                              float alpha) {
  switch (kind) {
    case blob::BinaryKind::kAdd: return a + alpha * b;
    case blob::BinaryKind::kSub: return a - alpha * b;
    case blob::BinaryKind::kMul: return a * b;
    case blob::BinaryKind::kDiv: return a / b;
    case blob::BinaryKind::kPow: return powf(a, b);
    case blob::BinaryKind::kMaximum: return nan_max(a, b);
    case blob::BinaryKind::kMinimum: return nan_min(a, b);
    case blob::BinaryKind::kEq: return a == b ? 1.0f : 0.0f;
    case blob::BinaryKind::kNe: return a != b ? 1.0f : 0.0f;
    case blob::BinaryKind::kLt: return a < b ? 1.0f : 0.0f;
    case blob::BinaryKind::kLe: return a <= b ? 1.0f : 0.0f;
    case blob::BinaryKind::kGt: return a > b ? 1.0f : 0.0f;
    case blob::BinaryKind::kGe: return a >= b ? 1.0f : 0.0f;
    case blob::BinaryKind::kLogicalAnd: return (a != 0.0f && b != 0.0f) ? 1.0f : 0.0f;
    case blob::BinaryKind::kLogicalOr: return (a != 0.0f || b != 0.0f) ? 1.0f : 0.0f;
    case blob::BinaryKind::kFloorDiv: return floor_divide(a, b);
    case blob::BinaryKind::kRemainder: return remainder(a, b);
    case blob::BinaryKind::kFmod: return fmodf(a, b);
  }
  return 0.0f;
}

__device__ __forceinline__ int64_t wrap(uint64_t v) { return static_cast<int64_t>(v); }

__device__ __forceinline__ int64_t int_pow(int64_t base, int64_t exponent) {
  if (exponent < 0) {  // PyTorch rejects this for integers; give the truncated real result
    return base == 1 ? 1 : (base == -1 ? ((exponent & 1) ? -1 : 1) : 0);
  }
  uint64_t result = 1;
  uint64_t b = static_cast<uint64_t>(base);
  while (exponent != 0) {
    if (exponent & 1) {
      result *= b;
    }
    b *= b;
    exponent >>= 1;
  }
  return wrap(result);
}

__device__ __forceinline__ int64_t binary_int(blob::BinaryKind kind, int64_t a, int64_t b,
                                              int64_t alpha) {
  const uint64_t ua = static_cast<uint64_t>(a);
  const uint64_t ub = static_cast<uint64_t>(b);
  switch (kind) {
    case blob::BinaryKind::kAdd: return wrap(ua + static_cast<uint64_t>(alpha) * ub);
    case blob::BinaryKind::kSub: return wrap(ua - static_cast<uint64_t>(alpha) * ub);
    case blob::BinaryKind::kMul: return wrap(ua * ub);
    case blob::BinaryKind::kDiv:  // true division runs in float math; kept total for safety
      if (b == 0) return 0;
      if (b == -1) return wrap(0 - ua);
      return a / b;
    case blob::BinaryKind::kPow: return int_pow(a, b);
    case blob::BinaryKind::kMaximum: return a > b ? a : b;
    case blob::BinaryKind::kMinimum: return a < b ? a : b;
    case blob::BinaryKind::kEq: return a == b;
    case blob::BinaryKind::kNe: return a != b;
    case blob::BinaryKind::kLt: return a < b;
    case blob::BinaryKind::kLe: return a <= b;
    case blob::BinaryKind::kGt: return a > b;
    case blob::BinaryKind::kGe: return a >= b;
    case blob::BinaryKind::kLogicalAnd: return a != 0 && b != 0;
    case blob::BinaryKind::kLogicalOr: return a != 0 || b != 0;
    case blob::BinaryKind::kFloorDiv: {
      if (b == 0) return 0;  // PyTorch raises; a kernel cannot, so division by zero gives 0
      if (b == -1) return wrap(0 - ua);
      int64_t q = a / b;
      if (a % b != 0 && ((a < 0) != (b < 0))) --q;
      return q;
    }
    case blob::BinaryKind::kRemainder: {
      if (b == 0 || b == -1) return 0;
      int64_t r = a % b;
      if (r != 0 && ((r < 0) != (b < 0))) r += b;
      return r;
    }
    case blob::BinaryKind::kFmod:  // C's %: the sign of a (PyTorch raises on 0; 0 here)
      if (b == 0 || b == -1) return 0;
      return a % b;
  }
  return 0;
}

__device__ __forceinline__ float unary_float(blob::UnaryKind kind, float x, float p0, float p1) {
  switch (kind) {
    case blob::UnaryKind::kRelu: return x != x ? x : fmaxf(x, 0.0f);
    case blob::UnaryKind::kGeluErf: return gelu_erf(x);
    case blob::UnaryKind::kGeluTanh: return gelu_tanh(x);
    case blob::UnaryKind::kSigmoid: return 1.0f / (1.0f + expf(-x));
    case blob::UnaryKind::kTanh: return tanhf(x);
    case blob::UnaryKind::kSilu: return x / (1.0f + expf(-x));
    case blob::UnaryKind::kExp: return expf(x);
    case blob::UnaryKind::kLog: return logf(x);
    case blob::UnaryKind::kCos: return cosf(x);
    case blob::UnaryKind::kSin: return sinf(x);
    case blob::UnaryKind::kRsqrt: return rsqrtf(x);
    case blob::UnaryKind::kSqrt: return sqrtf(x);
    case blob::UnaryKind::kNeg: return -x;
    case blob::UnaryKind::kAbs: return fabsf(x);
    case blob::UnaryKind::kHardswish: return x * fminf(fmaxf(x + 3.0f, 0.0f), 6.0f) / 6.0f;
    case blob::UnaryKind::kHardsigmoid: return fminf(fmaxf(x + 3.0f, 0.0f), 6.0f) / 6.0f;
    case blob::UnaryKind::kClamp: return x != x ? x : fminf(fmaxf(x, p0), p1);
    case blob::UnaryKind::kLogicalNot: return x == 0.0f ? 1.0f : 0.0f;
    case blob::UnaryKind::kErf: return erff(x);
    case blob::UnaryKind::kReciprocal: return 1.0f / x;
    case blob::UnaryKind::kPowScalar: return powf(x, p0);
    case blob::UnaryKind::kLeakyRelu: return x > 0.0f ? x : p0 * x;
    case blob::UnaryKind::kIdentity: return x;
    case blob::UnaryKind::kErfinv: return erfinvf(x);
    case blob::UnaryKind::kCeil: return ceilf(x);
    case blob::UnaryKind::kFloor: return floorf(x);
    case blob::UnaryKind::kTrunc: return truncf(x);
    case blob::UnaryKind::kRound: return rintf(x);
    case blob::UnaryKind::kLog1p: return log1pf(x);
    case blob::UnaryKind::kLog2: return log2f(x);
    case blob::UnaryKind::kLog10: return log10f(x);
    case blob::UnaryKind::kElu: return p1 * (x > 0.0f ? x : p0 * expm1f(x));
  }
  return x;
}

// act(a) * b as glu_kernel (elementwise.cu) computes it: the activation rounded to T, then the
// product (the GEMVs that fold a gated activation stage this).
template <typename T>
__device__ __forceinline__ float gated(T a, T b, blob::UnaryKind act) {
  const float g = to_float(from_float<T>(unary_float(act, to_float(a), 0.0f, 0.0f)));
  return to_float(from_float<T>(g * to_float(b)));
}

// The kinds that stay exact on integers (see UnaryStep).
__device__ __forceinline__ int64_t unary_int(blob::UnaryKind kind, int64_t x, int64_t lo,
                                             int64_t hi) {
  switch (kind) {
    case blob::UnaryKind::kRelu: return x > 0 ? x : 0;
    case blob::UnaryKind::kNeg: return wrap(0 - static_cast<uint64_t>(x));
    case blob::UnaryKind::kAbs: return x < 0 ? wrap(0 - static_cast<uint64_t>(x)) : x;
    case blob::UnaryKind::kClamp: {
      const int64_t y = x < lo ? lo : x;
      return y > hi ? hi : y;
    }
    case blob::UnaryKind::kLogicalNot: return x == 0;
    default: return x;
  }
}

}  // namespace kiln::engine::kernels
