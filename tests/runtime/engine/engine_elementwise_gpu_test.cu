// The elementwise ops on a GPU against a float64 host reference (engine_gpu_fixture.h says how):
// every binary and unary kind, with broadcasting, integer exactness and the vector and scalar
// paths; where; and the fused elementwise programs against the same chain unfused (strided and
// broadcast operands, and contiguous ones of one dtype, whose gated activation has a kernel of its
// own).
#include "tests/runtime/engine/engine_gpu_fixture.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

namespace kiln::engine::gpu_test {
namespace {

// ---------------------------------------------------------------------------------------------
// Binary.

double binary_ref(BinaryKind kind, double a, double b, double alpha) {
  switch (kind) {
    case BinaryKind::kAdd: return a + alpha * b;
    case BinaryKind::kSub: return a - alpha * b;
    case BinaryKind::kMul: return a * b;
    case BinaryKind::kDiv: return a / b;
    case BinaryKind::kPow: return std::pow(a, b);
    case BinaryKind::kMaximum: return std::max(a, b);
    case BinaryKind::kMinimum: return std::min(a, b);
    case BinaryKind::kEq: return a == b;
    case BinaryKind::kNe: return a != b;
    case BinaryKind::kLt: return a < b;
    case BinaryKind::kLe: return a <= b;
    case BinaryKind::kGt: return a > b;
    case BinaryKind::kGe: return a >= b;
    case BinaryKind::kLogicalAnd: return a != 0 && b != 0;
    case BinaryKind::kLogicalOr: return a != 0 || b != 0;
    case BinaryKind::kFloorDiv: {  // evaluated in fp32 like the kernel: near-integer quotients
      const float fa = static_cast<float>(a), fb = static_cast<float>(b);
      const float mod = std::fmod(fa, fb);
      float div = (fa - mod) / fb;
      if (mod != 0 && (fb < 0) != (mod < 0)) div -= 1;
      float fl = std::floor(div);
      if (div - fl > 0.5f) fl += 1;
      return fl;
    }
    case BinaryKind::kRemainder: {
      const float fa = static_cast<float>(a), fb = static_cast<float>(b);
      float mod = std::fmod(fa, fb);
      if (mod != 0 && (fb < 0) != (mod < 0)) mod += fb;
      return mod;
    }
    case BinaryKind::kFmod: return std::fmod(static_cast<float>(a), static_cast<float>(b));
  }
  return 0;
}

bool is_compare(BinaryKind k) { return k >= BinaryKind::kEq && k <= BinaryKind::kLogicalOr; }

TEST_F(EngineGpu, BinaryEveryKindWithBroadcast) {
  for (int k = 0; k <= static_cast<int>(BinaryKind::kFmod); ++k) {
    const auto kind = static_cast<BinaryKind>(k);
    OneOp c;
    HostTensor a = random(DType::kFloat32, {4, 1, 5}, kind == BinaryKind::kPow ? 0.5 : -2.0, 2.0);
    HostTensor b = random(DType::kFloat32, {1, 3, 5});
    for (double& v : b.v) {
      if (std::fabs(v) < 0.25) v = 0.5;  // keep divisors away from zero
    }
    if (is_compare(kind)) {
      b.v[2] = a.v[2];  // some equal pairs
      b.v[7] = a.v[7];
    }
    const int64_t ai = c.add_input(a), bi = c.add_input(b);
    const DType out_dtype = is_compare(kind) ? DType::kBool : DType::kFloat32;
    const int64_t out = c.b.output(out_dtype, {4, 3, 5});
    const double alpha = 1.5;
    c.b.binary(kind, ai, bi, out, alpha, 0.0, {4, 3, 5}, {5, 0, 1}, {0, 5, 1});
    const auto runs = run_three_ways(c.b, c.inputs);
    std::vector<double> want(60);
    for_each_index({4, 3, 5}, [&](int64_t i, const Sizes& id) {
      want[i] = round_to(out_dtype,
                         binary_ref(kind, a.v[id[0] * 5 + id[2]], b.v[id[1] * 5 + id[2]], alpha));
    });
    expect_output(runs, 0, want, tol_for(DType::kFloat32, 10), "binary kind " + std::to_string(k));
  }
}

TEST_F(EngineGpu, BinaryHalfAndBFloat16VectorPaths) {
  for (DType dtype : {DType::kFloat16, DType::kBFloat16, DType::kFloat32}) {
    OneOp c;
    const int64_t n = 1037;  // not a multiple of any vector width
    const HostTensor a = random(dtype, {n}), b = random(dtype, {n}), one = random(dtype, {1});
    const int64_t ai = c.add_input(a), bi = c.add_input(b), oi = c.add_input(one);
    const int64_t sum = c.b.output(dtype, {n});
    const int64_t prod_uniform = c.b.output(dtype, {n});
    const int64_t max_scalar = c.b.output(dtype, {n});
    c.b.binary(BinaryKind::kAdd, ai, bi, sum, 1.0, 0.0, {n}, {1}, {1});
    c.b.binary(BinaryKind::kMul, ai, oi, prod_uniform, 1.0, 0.0, {n}, {1}, {0});
    c.b.binary(BinaryKind::kMaximum, ai, -1, max_scalar, 1.0, 0.25, {n}, {1}, {0});
    const auto runs = run_three_ways(c.b, c.inputs);
    std::vector<double> w_sum(n), w_prod(n), w_max(n);
    for (int64_t i = 0; i < n; ++i) {
      w_sum[i] = a.v[i] + b.v[i];
      w_prod[i] = a.v[i] * one.v[0];
      w_max[i] = std::max(a.v[i], 0.25);
    }
    const std::string name = dtype_name(dtype);
    expect_output(runs, 0, w_sum, tol_for(dtype, 4), name + " add");
    expect_output(runs, 1, w_prod, tol_for(dtype, 4), name + " mul by a broadcast element");
    expect_output(runs, 2, w_max, tol_for(dtype), name + " maximum with a scalar");
  }
}

int64_t py_floordiv(int64_t a, int64_t b) {
  int64_t q = a / b;
  if (a % b != 0 && ((a < 0) != (b < 0))) --q;
  return q;
}

TEST_F(EngineGpu, BinaryIntegerMathIsExact) {
  for (DType dtype : {DType::kInt64, DType::kInt32}) {
    OneOp c;
    const HostTensor a = random_int(dtype, {64}, -50, 50);
    HostTensor b = random_int(dtype, {64}, -7, 7);
    for (double& v : b.v) {
      if (v == 0) v = 3;
    }
    const HostTensor e = random_int(dtype, {64}, 0, 5);
    const int64_t ai = c.add_input(a), bi = c.add_input(b), ei = c.add_input(e);
    const BinaryKind kinds[] = {BinaryKind::kAdd,      BinaryKind::kSub,       BinaryKind::kMul,
                                BinaryKind::kFloorDiv, BinaryKind::kRemainder, BinaryKind::kMaximum,
                                BinaryKind::kMinimum,  BinaryKind::kLt,        BinaryKind::kPow,
                                BinaryKind::kFmod};
    for (BinaryKind kind : kinds) {
      const int64_t out = c.b.output(is_compare(kind) ? DType::kBool : dtype, {64});
      c.b.binary(kind, ai, kind == BinaryKind::kPow ? ei : bi, out, 2.0, 0.0, {64}, {1}, {1});
    }
    const auto runs = run_three_ways(c.b, c.inputs);
    for (size_t k = 0; k < std::size(kinds); ++k) {
      std::vector<double> want(64);
      for (size_t i = 0; i < 64; ++i) {
        const auto x = static_cast<int64_t>(a.v[i]), y = static_cast<int64_t>(b.v[i]);
        const auto p = static_cast<int64_t>(e.v[i]);
        int64_t r = 0;
        switch (kinds[k]) {
          case BinaryKind::kAdd: r = x + 2 * y; break;
          case BinaryKind::kSub: r = x - 2 * y; break;
          case BinaryKind::kMul: r = x * y; break;
          case BinaryKind::kFloorDiv: r = py_floordiv(x, y); break;
          case BinaryKind::kRemainder: r = x - y * py_floordiv(x, y); break;
          case BinaryKind::kFmod: r = x % y; break;
          case BinaryKind::kMaximum: r = std::max(x, y); break;
          case BinaryKind::kMinimum: r = std::min(x, y); break;
          case BinaryKind::kLt: r = x < y; break;
          case BinaryKind::kPow: {
            r = 1;
            for (int64_t j = 0; j < p; ++j) r *= x;
            break;
          }
          default: break;
        }
        want[i] = static_cast<double>(r);
      }
      expect_output(
          runs, k, want, {0, 0},
          std::string(dtype_name(dtype)) + " kind " + std::to_string(static_cast<int>(kinds[k])));
    }
  }
}

TEST_F(EngineGpu, BinaryMixedDtypesUseTheGenericPath) {
  OneOp c;
  const HostTensor a = random(DType::kFloat16, {3, 4});
  const HostTensor b = random(DType::kFloat32, {4});
  const HostTensor i = random_int(DType::kInt64, {6}, -9, 9);
  const HostTensor p = random_int(DType::kBool, {6}, 0, 1);
  const HostTensor q = random_int(DType::kBool, {6}, 0, 1);
  const int64_t ai = c.add_input(a), bi = c.add_input(b), ii = c.add_input(i);
  const int64_t pi = c.add_input(p), qi = c.add_input(q);
  const int64_t o1 = c.b.output(DType::kFloat32, {3, 4});
  const int64_t o2 = c.b.output(DType::kFloat32, {6});
  const int64_t o3 = c.b.output(DType::kBool, {6});
  c.b.binary(BinaryKind::kAdd, ai, bi, o1, 1.0, 0.0, {3, 4}, {4, 1}, {0, 1});
  c.b.binary(BinaryKind::kMul, ii, -1, o2, 1.0, 0.5, {6}, {1}, {0});
  c.b.binary(BinaryKind::kLogicalOr, pi, qi, o3, 1.0, 0.0, {6}, {1}, {1});
  const auto runs = run_three_ways(c.b, c.inputs);
  std::vector<double> w1(12), w2(6), w3(6);
  for_each_index({3, 4}, [&](int64_t k, const Sizes& id) { w1[k] = a.v[k] + b.v[id[1]]; });
  for (size_t k = 0; k < 6; ++k) {
    w2[k] = i.v[k] * 0.5;
    w3[k] = (p.v[k] != 0 || q.v[k] != 0) ? 1 : 0;
  }
  expect_output(runs, 0, w1, tol_for(DType::kFloat32), "f16 + f32 -> f32");
  expect_output(runs, 1, w2, tol_for(DType::kFloat32), "int64 * 0.5 -> f32");
  expect_output(runs, 2, w3, {0, 0}, "bool | bool");
}

// ---------------------------------------------------------------------------------------------
// Unary.


struct UnaryCase {
  UnaryKind kind;
  double lo, hi, p0, p1;
};

std::vector<UnaryCase> unary_cases() {
  std::vector<UnaryCase> cases;
  for (int k = 0; k <= static_cast<int>(UnaryKind::kElu); ++k) {
    const auto kind = static_cast<UnaryKind>(k);
    UnaryCase u{kind, -3.0, 3.0, 0.0, 0.0};
    if (kind == UnaryKind::kLog || kind == UnaryKind::kSqrt || kind == UnaryKind::kRsqrt ||
        kind == UnaryKind::kPowScalar || kind == UnaryKind::kReciprocal ||
        kind == UnaryKind::kLog2 || kind == UnaryKind::kLog10) {
      u.lo = 0.2;
    }
    if (kind == UnaryKind::kErfinv) u.lo = -0.9, u.hi = 0.9;
    if (kind == UnaryKind::kClamp) u.p0 = -0.5, u.p1 = 0.7;
    if (kind == UnaryKind::kPowScalar) u.p0 = 2.5;
    if (kind == UnaryKind::kLeakyRelu) u.p0 = 0.1;
    if (kind == UnaryKind::kLog1p) u.lo = -0.8;
    if (kind == UnaryKind::kElu) u.p0 = 0.7, u.p1 = 1.05;
    cases.push_back(u);
  }
  return cases;
}

TEST_F(EngineGpu, UnaryEveryKind) {
  for (DType dtype : {DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
    for (const UnaryCase& u : unary_cases()) {
      OneOp c;
      const HostTensor x = random(dtype, {257}, u.lo, u.hi);
      const int64_t xi = c.add_input(x);
      const DType out_dtype = u.kind == UnaryKind::kLogicalNot ? DType::kBool : dtype;
      const int64_t out = c.b.output(out_dtype, {257});
      c.b.unary(u.kind, xi, out, u.p0, u.p1);
      const auto runs = run_three_ways(c.b, c.inputs);
      std::vector<double> want(257);
      for (size_t i = 0; i < want.size(); ++i) {
        want[i] = round_to(out_dtype, unary_ref(u.kind, x.v[i], u.p0, u.p1));
      }
      expect_output(runs, 0, want, tol_for(out_dtype, 10),
                    std::string(dtype_name(dtype)) + " unary kind " +
                        std::to_string(static_cast<int>(u.kind)));
    }
  }
}

TEST_F(EngineGpu, UnaryUnalignedOutputUsesTheScalarPath) {
  // An arena tensor two bytes off its 256-byte slot: the 16-byte path must not be taken.
  OneOp c;
  const HostTensor x = random(DType::kFloat16, {101});
  const int64_t xi = c.add_input(x);
  const int64_t mid = c.b.arena(DType::kFloat16, {101});
  c.b.tensors[mid].offset += 2;
  const int64_t out = c.b.output(DType::kFloat16, {101});
  c.b.unary(UnaryKind::kSilu, xi, mid);
  c.b.unary(UnaryKind::kIdentity, mid, out);
  const auto runs = run_three_ways(c.b, c.inputs);
  std::vector<double> want(101);
  for (size_t i = 0; i < want.size(); ++i) want[i] = unary_ref(UnaryKind::kSilu, x.v[i], 0, 0);
  expect_output(runs, 0, want, tol_for(DType::kFloat16, 4), "unaligned silu");
}

TEST_F(EngineGpu, UnaryOnIntegersStaysExact) {
  OneOp c;
  const HostTensor x = random_int(DType::kInt64, {40}, -9, 9);
  const int64_t xi = c.add_input(x);
  const UnaryKind kinds[] = {UnaryKind::kRelu,  UnaryKind::kNeg,        UnaryKind::kAbs,
                             UnaryKind::kClamp, UnaryKind::kLogicalNot, UnaryKind::kIdentity};
  const DType outs[] = {DType::kInt64, DType::kInt64, DType::kInt32,
                        DType::kInt64, DType::kBool,  DType::kFloat32};
  for (size_t k = 0; k < std::size(kinds); ++k) {
    c.b.unary(kinds[k], xi, c.b.output(outs[k], {40}), -3.5, 4.2);
  }
  const auto runs = run_three_ways(c.b, c.inputs);
  for (size_t k = 0; k < std::size(kinds); ++k) {
    std::vector<double> want(40);
    for (size_t i = 0; i < 40; ++i) {
      const double v = x.v[i];
      switch (kinds[k]) {
        case UnaryKind::kClamp: want[i] = std::min(std::max(v, -3.0), 4.0); break;
        default: want[i] = unary_ref(kinds[k], v, 0, 0); break;
      }
    }
    expect_output(runs, k, want, {0, 0}, "integer unary " + std::to_string(k));
  }
}

// ---------------------------------------------------------------------------------------------
// Where.

TEST_F(EngineGpu, WhereBroadcastsAndMixesDtypes) {
  OneOp c;
  const HostTensor cond = random_int(DType::kBool, {3, 1}, 0, 1);
  const HostTensor a = random(DType::kFloat32, {3, 4});
  const HostTensor b = random(DType::kFloat32, {1, 4});
  const HostTensor h = random(DType::kFloat16, {1, 4});
  const int64_t ci = c.add_input(cond), ai = c.add_input(a), bi = c.add_input(b),
                hi = c.add_input(h);
  const int64_t same = c.b.output(DType::kFloat32, {3, 4});
  const int64_t mixed = c.b.output(DType::kFloat32, {3, 4});
  c.b.where(ci, ai, bi, same, {3, 4}, {1, 0}, {4, 1}, {0, 1});
  c.b.where(ci, hi, ai, mixed, {3, 4}, {1, 0}, {0, 1}, {4, 1});
  const auto runs = run_three_ways(c.b, c.inputs);
  std::vector<double> w1(12), w2(12);
  for_each_index({3, 4}, [&](int64_t i, const Sizes& id) {
    const bool t = cond.v[id[0]] != 0;
    w1[i] = t ? a.v[i] : b.v[id[1]];
    w2[i] = t ? h.v[id[1]] : a.v[i];
  });
  expect_output(runs, 0, w1, {0, 0}, "where");
  expect_output(runs, 1, w2, {0, 0}, "where f16/f32");
}

// ---------------------------------------------------------------------------------------------
// Fused elementwise programs.

// out = where(cond, sigmoid(x * clamp(x + 3, 0, 6) / 6 + 0.5 * bias), x) over [2, 3, 8], bias
// [3] and cond [2, 1, 8] broadcast through strides, every step rounded to `dtype`. The same
// chain also runs unfused (one op per step, intermediates in the arena): the fused output must be
// bit-identical to it and close to a float64 host reference.
void run_fused_chain(DType dtype) {
  using Instr = BlobBuilder::Instr;
  using Form = blob::FusedForm;
  const auto k = [](auto kind) { return static_cast<int64_t>(kind); };
  OneOp c;
  const Sizes sizes = {2, 3, 8};
  const HostTensor x = random(dtype, sizes, -5, 5);
  const HostTensor bias = random(dtype, {3});
  const HostTensor cond = random_int(DType::kBool, {2, 1, 8}, 0, 1);
  const int64_t xi = c.add_input(x), bi = c.add_input(bias), ci = c.add_input(cond);
  const Sizes dense = {24, 8, 1}, bias_st = {0, 1, 0}, cond_st = {8, 0, 1}, none = {0, 0, 0};
  const int64_t fused = c.b.output(dtype, sizes);
  c.b.fused(fused, sizes, {xi, bi, ci}, {dense, bias_st, cond_st},
            {Instr{Form::kBinary, k(BinaryKind::kAdd), 0, -1, -1, 1.0, 3.0, dtype},      // r3
             Instr{Form::kUnary, k(UnaryKind::kClamp), 3, -1, -1, 0.0, 6.0, dtype},      // r4
             Instr{Form::kBinary, k(BinaryKind::kMul), 0, 4, -1, 1.0, 0.0, dtype},       // r5
             Instr{Form::kBinary, k(BinaryKind::kDiv), 5, -1, -1, 1.0, 6.0, dtype},      // r6
             Instr{Form::kBinary, k(BinaryKind::kAdd), 6, 1, -1, 0.5, 0.0, dtype},       // r7
             Instr{Form::kUnary, k(UnaryKind::kSigmoid), 7, -1, -1, 0.0, 0.0, dtype},    // r8
             Instr{Form::kWhere, 0, 2, 8, 0, 0.0, 0.0, dtype}});                         // r9
  int64_t t[7];
  for (int64_t& id : t) id = c.b.arena(dtype, sizes);
  c.b.binary(BinaryKind::kAdd, xi, -1, t[0], 1.0, 3.0, sizes, dense, none);
  c.b.unary(UnaryKind::kClamp, t[0], t[1], 0.0, 6.0);
  c.b.binary(BinaryKind::kMul, xi, t[1], t[2], 1.0, 0.0, sizes, dense, dense);
  c.b.binary(BinaryKind::kDiv, t[2], -1, t[3], 1.0, 6.0, sizes, dense, none);
  c.b.binary(BinaryKind::kAdd, t[3], bi, t[4], 0.5, 0.0, sizes, dense, bias_st);
  c.b.unary(UnaryKind::kSigmoid, t[4], t[5]);
  const int64_t unfused = c.b.output(dtype, sizes);
  c.b.where(ci, t[5], xi, unfused, sizes, cond_st, dense, dense);
  const auto runs = run_three_ways(c.b, c.inputs);
  std::vector<double> want(2 * 3 * 8);
  for_each_index(sizes, [&](int64_t i, const Sizes& id) {
    const auto r = [&](double v) { return round_to(dtype, v); };
    const double xv = x.v[i];
    double v = r(std::min(std::max(r(xv + 3.0), 0.0), 6.0));
    v = r(r(xv * v) / 6.0);
    v = r(v + 0.5 * bias.v[id[1]]);
    v = r(1.0 / (1.0 + std::exp(-v)));
    want[i] = cond.v[id[0] * 8 + id[2]] != 0 ? v : xv;
  });
  const std::string name = dtype == DType::kFloat32 ? "fp32" : "bf16";
  expect_output(runs, 0, want, tol_for(dtype, 2), "fused chain " + name);
  for (size_t r = 0; r < runs.size(); ++r) {
    ASSERT_EQ(runs[r].size(), 2u);
    const std::vector<uint8_t> a = runs[r][0].bytes(), b = runs[r][1].bytes();
    EXPECT_EQ(a, b) << "fused and unfused " << name << " differ [" << kRunNames[r] << "]";
  }
}

TEST_F(EngineGpu, FusedElementwiseFp32MatchesTheUnfusedChain) { run_fused_chain(DType::kFloat32); }

TEST_F(EngineGpu, FusedElementwiseBf16MatchesTheUnfusedChain) {
  run_fused_chain(DType::kBFloat16);
}

// Programs over contiguous operands of one dtype, 3 x 1001 elements (16-byte accesses and a
// tail), each bit-identical to the same chain unfused and close to a float64 host reference, in
// fp32, fp16 and bf16: silu(g) * u + 0.25 (the interpreter's kernel), silu(g) * u and
// u * gelu_tanh(g) with g the second input (both the gated-activation kernel).
enum class Glu { kSiluMulAdd, kSiluMul, kMulGeluTanhSwapped };

void run_contiguous_program(DType dtype, Glu which) {
  using Instr = BlobBuilder::Instr;
  using Form = blob::FusedForm;
  const auto k = [](auto kind) { return static_cast<int64_t>(kind); };
  OneOp c;
  const Sizes sizes = {3, 1001};
  const HostTensor g = random(dtype, sizes, -6, 6);
  const HostTensor u = random(dtype, sizes, -2, 2);
  const bool swapped = which == Glu::kMulGeluTanhSwapped;
  const int64_t first = c.add_input(swapped ? u : g), second = c.add_input(swapped ? g : u);
  const int64_t gi = swapped ? second : first, ui = swapped ? first : second;
  const Sizes dense = {1001, 1}, none = {0, 0};
  const UnaryKind act = swapped ? UnaryKind::kGeluTanh : UnaryKind::kSilu;
  // r2 = act(g); r3 = r2 * u (swapped: g is input 1, and the product reads u first).
  const int64_t act_src = swapped ? 1 : 0, mul_a = swapped ? 0 : 2, mul_b = swapped ? 2 : 1;
  std::vector<Instr> program;
  program.push_back(Instr{Form::kUnary, k(act), act_src, -1, -1, 0.0, 0.0, dtype});
  program.push_back(Instr{Form::kBinary, k(BinaryKind::kMul), mul_a, mul_b, -1, 1.0, 0.0, dtype});
  if (which == Glu::kSiluMulAdd) {
    program.push_back(Instr{Form::kBinary, k(BinaryKind::kAdd), 3, -1, -1, 1.0, 0.25, dtype});
  }
  const int64_t fused = c.b.output(dtype, sizes);
  c.b.fused(fused, sizes, {first, second}, {dense, dense}, program);
  const int64_t t0 = c.b.arena(dtype, sizes);
  c.b.unary(act, gi, t0);
  const int64_t unfused = c.b.output(dtype, sizes);
  if (which == Glu::kSiluMulAdd) {
    const int64_t t1 = c.b.arena(dtype, sizes);
    c.b.binary(BinaryKind::kMul, t0, ui, t1, 1.0, 0.0, sizes, dense, dense);
    c.b.binary(BinaryKind::kAdd, t1, -1, unfused, 1.0, 0.25, sizes, dense, none);
  } else if (swapped) {
    c.b.binary(BinaryKind::kMul, ui, t0, unfused, 1.0, 0.0, sizes, dense, dense);
  } else {
    c.b.binary(BinaryKind::kMul, t0, ui, unfused, 1.0, 0.0, sizes, dense, dense);
  }
  const auto runs = run_three_ways(c.b, c.inputs);
  std::vector<double> want(3 * 1001);
  for (size_t i = 0; i < want.size(); ++i) {
    const auto r = [&](double v) { return round_to(dtype, v); };
    const double x = g.v[i];
    const double a = swapped ? 0.5 * x * (1.0 + std::tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)))
                             : x / (1.0 + std::exp(-x));
    want[i] = r(r(a) * u.v[i]);
    if (which == Glu::kSiluMulAdd) want[i] = r(want[i] + 0.25);
  }
  const std::string name = std::string(dtype_name(dtype)) + " program " +
                           std::to_string(static_cast<int>(which));
  expect_output(runs, 0, want, tol_for(dtype, 2), "fused contiguous " + name);
  for (size_t r = 0; r < runs.size(); ++r) {
    ASSERT_EQ(runs[r].size(), 2u);
    EXPECT_EQ(runs[r][0].bytes(), runs[r][1].bytes())
        << "fused and unfused " << name << " differ [" << kRunNames[r] << "]";
  }
}

TEST_F(EngineGpu, FusedElementwiseContiguousMatchesTheUnfusedChain) {
  for (DType dtype : {DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
    for (Glu which : {Glu::kSiluMulAdd, Glu::kSiluMul, Glu::kMulGeluTanhSwapped}) {
      run_contiguous_program(dtype, which);
    }
  }
}

TEST_F(EngineGpu, FusedElementwiseMixedInputDtypesAndRank0) {
  // fp16 and fp32 inputs into an fp32 output; then a one-element (rank 0) program.
  using Instr = BlobBuilder::Instr;
  using Form = blob::FusedForm;
  OneOp c;
  const HostTensor h = random(DType::kFloat16, {5, 7});
  const HostTensor f = random(DType::kFloat32, {7, 5});  // read transposed
  const HostTensor s = random(DType::kFloat32, {1});
  const int64_t hi = c.add_input(h), fi = c.add_input(f), si = c.add_input(s);
  const int64_t out = c.b.output(DType::kFloat32, {5, 7});
  c.b.fused(out, {5, 7}, {hi, fi}, {{7, 1}, {1, 5}},
            {Instr{Form::kBinary, static_cast<int64_t>(BinaryKind::kMaximum), 0, 1},
             Instr{Form::kUnary, static_cast<int64_t>(UnaryKind::kTanh), 2}});
  const int64_t one = c.b.output(DType::kFloat32, {1});
  c.b.fused(one, {}, {si}, {{}},
            {Instr{Form::kUnary, static_cast<int64_t>(UnaryKind::kExp), 0},
             Instr{Form::kBinary, static_cast<int64_t>(BinaryKind::kSub), 1, -1, -1, 1.0, 1.0}});
  const auto runs = run_three_ways(c.b, c.inputs);
  std::vector<double> want(35);
  for_each_index({5, 7}, [&](int64_t i, const Sizes& id) {
    want[i] = std::tanh(std::max(h.v[i], f.v[id[1] * 5 + id[0]]));
  });
  expect_output(runs, 0, want, tol_for(DType::kFloat32), "fused max/tanh, mixed dtypes");
  expect_output(runs, 1, {std::exp(s.v[0]) - 1.0}, tol_for(DType::kFloat32), "fused rank 0");
}

}  // namespace
}  // namespace kiln::engine::gpu_test
