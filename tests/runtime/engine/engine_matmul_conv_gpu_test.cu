// The library-backed and windowed ops on a GPU against a float64 host reference
// (engine_gpu_fixture.h says how): matmul through cuBLASLt (transposes, batches, bias, residual
// and activation epilogues, autotuned algorithms), conv2d through cuDNN (and its persistent
// algorithm cache) and pool2d (NCHW and NHWC).
#include "tests/runtime/engine/engine_gpu_fixture.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <tuple>
#include <vector>

namespace kiln::engine::gpu_test {
namespace {

// ---------------------------------------------------------------------------------------------
// Matmul.

struct MatmulCase {
  DType dtype = DType::kFloat32;
  DType out_dtype = DType::kFloat32;
  int64_t batch = 1, m, n, k;
  bool trans_a = false, trans_b = false;
  bool broadcast_b = false;
  enum class Bias { kNone, kColumn, kRow, kFull } bias = Bias::kNone;
  double alpha = 1.0, beta = 1.0;
  blob::Epilogue epilogue = blob::Epilogue::kNone;
  blob::Precision precision = blob::Precision::kFp32;
  bool residual = false;  // an input of out's dtype and shape, added before the epilogue
};

double epilogue_ref(blob::Epilogue e, double v) {
  switch (e) {
    case blob::Epilogue::kNone: return v;
    case blob::Epilogue::kRelu: return std::max(v, 0.0);
    case blob::Epilogue::kGeluErf: return unary_ref(UnaryKind::kGeluErf, v, 0, 0);
    case blob::Epilogue::kGeluTanh: return unary_ref(UnaryKind::kGeluTanh, v, 0, 0);
    case blob::Epilogue::kRelu6: return std::min(std::max(v, 0.0), 6.0);
    case blob::Epilogue::kSilu: return unary_ref(UnaryKind::kSilu, v, 0, 0);
    case blob::Epilogue::kHardswish: return unary_ref(UnaryKind::kHardswish, v, 0, 0);
    case blob::Epilogue::kSigmoid: return unary_ref(UnaryKind::kSigmoid, v, 0, 0);
  }
  return v;
}

void run_matmul(const MatmulCase& mc, const std::string& name) {
  OneOp c;
  c.b.precision = mc.precision;
  const int64_t a_rows = mc.trans_a ? mc.k : mc.m, a_cols = mc.trans_a ? mc.m : mc.k;
  const int64_t b_rows = mc.trans_b ? mc.n : mc.k, b_cols = mc.trans_b ? mc.k : mc.n;
  const int64_t b_batches = mc.broadcast_b ? 1 : mc.batch;
  const HostTensor a = random(mc.dtype, {mc.batch, a_rows, a_cols}, -1.0, 1.0);
  const HostTensor b = random(mc.dtype, {b_batches, b_rows, b_cols}, -1.0, 1.0);
  const int64_t ai = c.add_input(a), bi = c.add_input(b);
  BlobBuilder::Matmul m;
  m.a = ai, m.b = bi, m.batch = mc.batch, m.m = mc.m, m.n = mc.n, m.k = mc.k;
  m.trans_a = mc.trans_a, m.trans_b = mc.trans_b;
  m.a_batch_stride = a_rows * a_cols;
  m.b_batch_stride = mc.broadcast_b ? 0 : b_rows * b_cols;
  m.alpha = mc.alpha, m.beta = mc.beta, m.epilogue = mc.epilogue;
  HostTensor bias{mc.out_dtype, {}, {}};
  if (mc.bias != MatmulCase::Bias::kNone) {
    const Sizes sizes = mc.bias == MatmulCase::Bias::kColumn ? Sizes{mc.n}
                        : mc.bias == MatmulCase::Bias::kRow  ? Sizes{mc.m}
                                                             : Sizes{mc.m, mc.n};
    bias = random(mc.out_dtype, sizes, -1.0, 1.0);
    const std::vector<uint8_t> bytes = bias.bytes();
    m.bias = c.b.weight(mc.out_dtype, sizes, bytes.data());
    m.bias_row_stride = mc.bias == MatmulCase::Bias::kColumn ? 0
                        : mc.bias == MatmulCase::Bias::kRow  ? 1
                                                             : mc.n;
    m.bias_col_stride = mc.bias == MatmulCase::Bias::kRow ? 0 : 1;
  }
  HostTensor residual{mc.out_dtype, {}, {}};
  if (mc.residual) {
    residual = random(mc.out_dtype, {mc.batch, mc.m, mc.n}, -1.0, 1.0);
    m.residual = c.add_input(residual);
  }
  m.out = c.b.output(mc.out_dtype, {mc.batch, mc.m, mc.n});
  c.b.matmul(m);
  const auto runs = run_three_ways(c.b, c.inputs);
  std::vector<double> want(static_cast<size_t>(mc.batch * mc.m * mc.n));
  for (int64_t g = 0; g < mc.batch; ++g) {
    for (int64_t i = 0; i < mc.m; ++i) {
      for (int64_t j = 0; j < mc.n; ++j) {
        double acc = 0;
        for (int64_t p = 0; p < mc.k; ++p) {
          const double av = a.v[g * a_rows * a_cols + (mc.trans_a ? p * mc.m + i : i * mc.k + p)];
          const int64_t bg = mc.broadcast_b ? 0 : g;
          const double bv = b.v[bg * b_rows * b_cols + (mc.trans_b ? j * mc.k + p : p * mc.n + j)];
          acc += av * bv;
        }
        double v = mc.alpha * acc;
        if (mc.bias != MatmulCase::Bias::kNone) {
          v += mc.beta * bias.v[i * m.bias_row_stride + j * m.bias_col_stride];
        }
        if (mc.residual) v += residual.v[(g * mc.m + i) * mc.n + j];
        want[(g * mc.m + i) * mc.n + j] = epilogue_ref(mc.epilogue, v);
      }
    }
  }
  // Accumulation error grows with sqrt(K) for inputs in [-1, 1]; TF32 keeps 10 mantissa bits.
  Tol tol = tol_for(mc.dtype == DType::kFloat32 ? mc.out_dtype : mc.dtype,
                    std::sqrt(static_cast<double>(std::max<int64_t>(mc.k, 1))) * 4);
  if (mc.precision == blob::Precision::kTf32) tol = {2e-3 * std::sqrt(double(mc.k)), 2e-3};
  expect_output(runs, 0, want, tol, name);
}

TEST_F(EngineGpu, MatmulTransposeVariantsAndAwkwardSizes) {
  for (int t = 0; t < 4; ++t) {
    MatmulCase mc;
    mc.m = 5, mc.n = 7, mc.k = 3, mc.trans_a = t & 1, mc.trans_b = t & 2;
    run_matmul(mc, "f32 5x7x3 trans " + std::to_string(t));
    mc.m = 17, mc.n = 33, mc.k = 65;
    run_matmul(mc, "f32 17x33x65 trans " + std::to_string(t));
  }
  MatmulCase one;
  one.m = 1, one.n = 1, one.k = 1;
  run_matmul(one, "f32 1x1x1");
  MatmulCase alpha;
  alpha.m = 8, alpha.n = 8, alpha.k = 8, alpha.alpha = 0.5;
  run_matmul(alpha, "alpha 0.5");
}

TEST_F(EngineGpu, MatmulBatchedWithBroadcastB) {
  MatmulCase mc;
  mc.batch = 3, mc.m = 9, mc.n = 6, mc.k = 10, mc.broadcast_b = true;
  run_matmul(mc, "batch 3, b broadcast");
  mc.broadcast_b = false, mc.trans_b = true;
  run_matmul(mc, "batch 3, b transposed");
}

TEST_F(EngineGpu, MatmulBiasAndEpilogues) {
  using Bias = MatmulCase::Bias;
  const blob::Epilogue epilogues[] = {blob::Epilogue::kNone, blob::Epilogue::kRelu,
                                      blob::Epilogue::kGeluErf, blob::Epilogue::kGeluTanh};
  for (blob::Epilogue e : epilogues) {
    for (Bias bias : {Bias::kNone, Bias::kColumn, Bias::kRow, Bias::kFull}) {
      MatmulCase mc;
      mc.batch = 2, mc.m = 12, mc.n = 20, mc.k = 16, mc.bias = bias, mc.epilogue = e;
      mc.beta = bias == Bias::kColumn ? 1.0 : 0.5;  // column bias with beta 1: fused in cuBLASLt
      run_matmul(mc, "epilogue " + std::to_string(static_cast<int>(e)) + " bias " +
                         std::to_string(static_cast<int>(bias)));
    }
  }
  MatmulCase scaled_column;
  scaled_column.m = 4, scaled_column.n = 4, scaled_column.k = 4;
  scaled_column.bias = Bias::kColumn, scaled_column.beta = 2.0;
  run_matmul(scaled_column, "column bias with beta 2 (separate pass)");
}

// The residual is cuBLASLt's C (beta 1) whatever else the op does: bias in cuBLASLt's epilogue or
// in the pass after it, activation in either, batched, bf16, K = 0 (out is the residual).
TEST_F(EngineGpu, MatmulResidualIsAddedBeforeTheEpilogue) {
  using Bias = MatmulCase::Bias;
  const std::tuple<Bias, double, blob::Epilogue, const char*> cases[] = {
      {Bias::kNone, 1.0, blob::Epilogue::kNone, "plain"},
      {Bias::kColumn, 1.0, blob::Epilogue::kRelu, "column bias relu (all in cuBLASLt)"},
      {Bias::kColumn, 1.0, blob::Epilogue::kGeluTanh, "column bias gelu tanh"},
      {Bias::kFull, 0.5, blob::Epilogue::kGeluErf, "full bias gelu erf (pass after)"},
      {Bias::kRow, 1.0, blob::Epilogue::kNone, "row bias (pass after)"},
  };
  for (const auto& [bias, beta, epilogue, what] : cases) {
    MatmulCase mc;
    mc.batch = 2, mc.m = 12, mc.n = 20, mc.k = 16, mc.trans_b = true;
    mc.bias = bias, mc.beta = beta, mc.epilogue = epilogue, mc.residual = true;
    run_matmul(mc, std::string("f32 residual, ") + what);
    mc.dtype = mc.out_dtype = DType::kBFloat16;
    run_matmul(mc, std::string("bf16 residual, ") + what);
  }
  MatmulCase empty;
  empty.m = 3, empty.n = 5, empty.k = 0, empty.bias = Bias::kColumn, empty.residual = true;
  empty.epilogue = blob::Epilogue::kRelu;
  run_matmul(empty, "K = 0: relu(bias + residual)");
}

// KILN_AUTOTUNE=1: the timed algorithm choices (fresh, then from the cache) compute right too,
// batched, transposed, with the bias in cuBLASLt's epilogue, in fp32 and bf16.
TEST_F(EngineGpu, MatmulAutotunedChoicesAreCorrect) {
  char dir[] = "/tmp/kiln_algo_cache_mm_XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  ASSERT_EQ(setenv("KILN_CACHE_DIR", dir, 1), 0);
  ASSERT_EQ(setenv("KILN_AUTOTUNE", "1", 1), 0);
  for (int pass = 0; pass < 2; ++pass) {  // timed, then read back from the cache
    MatmulCase mc;
    mc.batch = 3, mc.m = 64, mc.n = 96, mc.k = 128, mc.trans_b = true;
    mc.bias = MatmulCase::Bias::kColumn, mc.epilogue = blob::Epilogue::kRelu;
    run_matmul(mc, "f32 batched, bias relu, pass " + std::to_string(pass));
    mc.dtype = mc.out_dtype = DType::kBFloat16;
    run_matmul(mc, "bf16 batched, bias relu, pass " + std::to_string(pass));
    mc.residual = true;
    run_matmul(mc, "bf16 batched, bias residual relu, pass " + std::to_string(pass));
  }
  size_t files = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir)) files += e.is_regular_file();
  EXPECT_EQ(files, 3u);  // one per blob
  std::filesystem::remove_all(dir);
  unsetenv("KILN_AUTOTUNE");
  unsetenv("KILN_CACHE_DIR");
}

TEST_F(EngineGpu, MatmulHalfBFloat16AndTf32) {
  for (DType dtype : {DType::kFloat16, DType::kBFloat16}) {
    MatmulCase mc;
    mc.dtype = mc.out_dtype = dtype;
    mc.m = 33, mc.n = 17, mc.k = 64, mc.bias = MatmulCase::Bias::kColumn;
    mc.epilogue = blob::Epilogue::kRelu;
    run_matmul(mc, std::string(dtype_name(dtype)) + " bias relu");
    mc.out_dtype = DType::kFloat32;
    mc.bias = MatmulCase::Bias::kNone;
    run_matmul(mc, std::string(dtype_name(dtype)) + " -> Float32");
  }
  MatmulCase tf32;
  tf32.m = 64, tf32.n = 64, tf32.k = 64, tf32.precision = blob::Precision::kTf32;
  run_matmul(tf32, "tf32");
}

// A few rows against an [N, K] weight run on Kiln's GEMV (gemv.cu): every row count it
// specialises, odd N, per-column / per-row / full biases with beta, the residual and each
// epilogue, K at the width of a Llama-1B MLP, and K that is not whole 16-byte vectors (the
// element-wise loop: a squeeze-excitation FC's 4..28).
TEST_F(EngineGpu, MatmulFewRowsRunAsGemv) {
  const blob::Epilogue acts[] = {blob::Epilogue::kNone,     blob::Epilogue::kRelu,
                                 blob::Epilogue::kGeluErf,  blob::Epilogue::kGeluTanh,
                                 blob::Epilogue::kRelu6,    blob::Epilogue::kSilu,
                                 blob::Epilogue::kHardswish, blob::Epilogue::kSigmoid};
  int i = 0;
  for (DType dtype : {DType::kBFloat16, DType::kFloat16, DType::kFloat32}) {
    for (int64_t m = 1; m <= 8; ++m) {
      MatmulCase mc;
      mc.dtype = mc.out_dtype = dtype;
      const int64_t narrow_k[] = {4, 6, 10, 20, 28, 3, 250, 12};
      mc.m = m, mc.n = 67 + 2 * m;
      mc.k = i % 3 == 2 ? narrow_k[m - 1] : m == 1 ? 8192 : 40 * m;
      mc.trans_b = true;
      mc.bias = static_cast<MatmulCase::Bias>(i % 4);
      mc.beta = i % 3 == 0 ? 0.5 : 1.0;
      mc.alpha = i % 5 == 0 ? 0.25 : 1.0;
      mc.residual = i % 2 == 1;
      mc.epilogue = acts[i % 8];
      run_matmul(mc, std::string(dtype_name(dtype)) + " gemv M=" + std::to_string(m) +
                         " K=" + std::to_string(mc.k) + " bias " + std::to_string(i % 4) +
                         (mc.residual ? " + residual" : ""));
      ++i;
    }
  }
}

// A layer norm whose only reader is the few-row matmul after it runs inside that GEMV
// (gemv.cuh's folded_gemv_unsupported): RMSNorm and LayerNorm, with and without affine weights,
// rows of whole 16-byte vectors, M = 1 and 3, each dtype. The reference rounds the
// normalised rows to the dtype, as the norm's output tensor holds them. Where the norm's output is
// also a delegate output, or without KILN_GEMV_NORM=on, the two ops run apart with the same
// results.
TEST_F(EngineGpu, LayerNormFoldsIntoTheGemvAfterIt) {
  int i = 0;
  for (DType dtype : {DType::kBFloat16, DType::kFloat32}) {
    for (bool rms : {true, false}) {
      for (int64_t m : {1, 3}) {
        for (int mode = 0; mode < 3; ++mode) {   // 0 folded, 1 norm output kept, 2 env off
          const int64_t n = 67, k = i % 3 == 2 ? 24 : i % 3 == 1 ? 40 : 2048;
          OneOp c;
          const HostTensor x = random(dtype, {m, k}, -2.0, 2.0);
          const HostTensor w = random(dtype, {n, k}, -1.0, 1.0);
          const HostTensor gamma = random(dtype, {k}, 0.5, 1.5);
          const HostTensor beta = random(dtype, {k}, -0.5, 0.5);
          const bool affine = i % 2 == 0;
          const std::vector<uint8_t> wb = w.bytes(), gb = gamma.bytes(), bb = beta.bytes();
          const int64_t xi = c.add_input(x);
          const int64_t gi = affine ? c.b.weight(dtype, {k}, gb.data()) : -1;
          const int64_t bi = affine && !rms ? c.b.weight(dtype, {k}, bb.data()) : -1;
          const int64_t normed = mode == 1 ? c.b.output(dtype, {m, k}) : c.b.arena(dtype, {m, k});
          c.b.layer_norm(xi, gi, bi, normed, m, k, 1e-5, rms);
          BlobBuilder::Matmul mm;
          mm.a = normed;
          mm.b = c.b.weight(dtype, {n, k}, wb.data());
          mm.out = c.b.output(dtype, {m, n});
          mm.m = m, mm.n = n, mm.k = k, mm.trans_b = true;
          c.b.matmul(mm);
          if (mode != 2) setenv("KILN_GEMV_NORM", "on", 1);   // opt-in
          {
            const std::vector<uint8_t> blob = c.b.build();
            auto engine = Engine::create(blob.data(), blob.size());
            ASSERT_TRUE(engine.ok()) << g_log;
            EXPECT_EQ((*engine)->folded_ops(), mode == 0 ? 1u : 0u);
          }
          const auto runs = run_three_ways(c.b, c.inputs);
          unsetenv("KILN_GEMV_NORM");
          std::vector<double> y(size_t(m * k)), want(size_t(m * n));
          for (int64_t r = 0; r < m; ++r) {
            double mean = 0, var = 0;
            for (int64_t j = 0; j < k && !rms; ++j) mean += x.v[r * k + j] / double(k);
            for (int64_t j = 0; j < k; ++j) {
              var += (x.v[r * k + j] - mean) * (x.v[r * k + j] - mean) / double(k);
            }
            for (int64_t j = 0; j < k; ++j) {
              double v = (x.v[r * k + j] - mean) / std::sqrt(var + 1e-5);
              if (affine) v = v * gamma.v[j] + (rms ? 0.0 : beta.v[j]);
              y[r * k + j] = round_to(dtype, v);
            }
            for (int64_t col = 0; col < n; ++col) {
              double acc = 0;
              for (int64_t j = 0; j < k; ++j) acc += y[r * k + j] * w.v[col * k + j];
              want[r * n + col] = acc;
            }
          }
          const std::string name = std::string(dtype_name(dtype)) + (rms ? " rms" : " layer") +
                                   " norm -> gemv M=" + std::to_string(m) +
                                   " K=" + std::to_string(k) + (affine ? " affine" : "") +
                                   " mode " + std::to_string(mode);
          const double scale = std::sqrt(double(k)) * 4;
          expect_output(runs, mode == 1 ? 1 : 0, want, tol_for(dtype, scale), name);
          if (mode == 1) expect_output(runs, 0, y, tol_for(dtype, 4), name + " (norm output)");
          ++i;
        }
      }
    }
  }
}

// The gated activation of a SwiGLU / GeGLU block, act(g) * u as one kFusedElementwise, runs
// inside the GEMV of the down projection after it (with its residual): silu with the gate as the
// first input, gelu_tanh with it as the second, the vector and the element-wise staging, M = 1
// and 2. KILN_GEMV_GLU=off runs the two ops apart, with the same results.
TEST_F(EngineGpu, GatedActivationFoldsIntoTheGemvAfterIt) {
  int i = 0;
  for (DType dtype : {DType::kBFloat16, DType::kFloat32}) {
    for (bool swapped : {false, true}) {
      for (int64_t m : {1, 2}) {
        for (bool off : {false, true}) {
          const int64_t n = 45, k = i % 3 == 2 ? 12 : i % 3 == 1 ? 40 : 8192 / m;
          OneOp c;
          const HostTensor g = random(dtype, {m, k}, -6.0, 6.0);
          const HostTensor u = random(dtype, {m, k}, -2.0, 2.0);
          const HostTensor w = random(dtype, {n, k}, -1.0, 1.0);
          const HostTensor res = random(dtype, {m, n}, -1.0, 1.0);
          const std::vector<uint8_t> wb = w.bytes();
          const int64_t first = c.add_input(swapped ? u : g), second = c.add_input(swapped ? g : u);
          const UnaryKind act = swapped ? UnaryKind::kGeluTanh : UnaryKind::kSilu;
          const int64_t gated = c.b.arena(dtype, {m, k});
          c.b.gated(gated, m, k, first, second, act, swapped ? 1 : 0, dtype);
          BlobBuilder::Matmul mm;
          mm.a = gated;
          mm.b = c.b.weight(dtype, {n, k}, wb.data());
          mm.residual = c.add_input(res);
          mm.out = c.b.output(dtype, {m, n});
          mm.m = m, mm.n = n, mm.k = k, mm.trans_b = true;
          c.b.matmul(mm);
          if (off) setenv("KILN_GEMV_GLU", "off", 1);
          {
            const std::vector<uint8_t> blob = c.b.build();
            auto engine = Engine::create(blob.data(), blob.size());
            ASSERT_TRUE(engine.ok()) << g_log;
            EXPECT_EQ((*engine)->folded_ops(), off ? 0u : 1u);
          }
          const auto runs = run_three_ways(c.b, c.inputs);
          unsetenv("KILN_GEMV_GLU");
          std::vector<double> want(size_t(m * n));
          for (int64_t r = 0; r < m; ++r) {
            for (int64_t col = 0; col < n; ++col) {
              double acc = res.v[r * n + col];
              for (int64_t j = 0; j < k; ++j) {
                const double x = g.v[r * k + j];
                const double a =
                    swapped ? 0.5 * x * (1.0 + std::tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)))
                            : x / (1.0 + std::exp(-x));
                acc += round_to(dtype, round_to(dtype, a) * u.v[r * k + j]) * w.v[col * k + j];
              }
              want[r * n + col] = acc;
            }
          }
          expect_output(runs, 0, want, tol_for(dtype, std::sqrt(double(k)) * 8),
                        std::string(dtype_name(dtype)) + (swapped ? " gelu_tanh" : " silu") +
                            " gate -> gemv M=" + std::to_string(m) + " K=" + std::to_string(k) +
                            (off ? " (KILN_GEMV_GLU=off)" : ""));
          ++i;
        }
      }
    }
  }
}

TEST_F(EngineGpu, MatmulWithEmptyInnerDimensionIsBiasOnly) {
  MatmulCase mc;
  mc.m = 3, mc.n = 5, mc.k = 0, mc.bias = MatmulCase::Bias::kColumn, mc.beta = 1.0;
  mc.epilogue = blob::Epilogue::kRelu;
  run_matmul(mc, "K = 0 with bias");
  mc.bias = MatmulCase::Bias::kNone;
  run_matmul(mc, "K = 0 without bias");
}

// ---------------------------------------------------------------------------------------------
// Conv2d.

// The convolution cases (epilogues, layouts, groups, strides, dilation) are in
// engine_conv_gpu_test; here the algorithm cache.

// With KILN_AUTOTUNE=1 the fastest algorithm is timed once per blob and device kind, then read
// from the persistent algorithm cache: a second load searches nothing and computes the same bytes;
// a damaged cache file is searched again and rewritten; KILN_CACHE_DIR=off writes nothing; without
// autotuning nothing is searched or written.
TEST_F(EngineGpu, Conv2dAlgorithmsAreRememberedAcrossLoads) {
  char dir[] = "/tmp/kiln_algo_cache_gpu_XXXXXX";
  ASSERT_NE(mkdtemp(dir), nullptr);
  ASSERT_EQ(setenv("KILN_CACHE_DIR", dir, 1), 0);
  ASSERT_EQ(setenv("KILN_AUTOTUNE", "1", 1), 0);
  OneOp c;
  BlobBuilder::Conv2d conv;
  conv.n = 1, conv.c_in = 16, conv.h = 28, conv.w = 28, conv.c_out = 32, conv.kh = conv.kw = 3;
  conv.stride_h = conv.stride_w = 1, conv.pad_h = conv.pad_w = 1, conv.dil_h = conv.dil_w = 1;
  conv.groups = 1;
  const HostTensor x = random(DType::kFloat32, {1, 16, 28, 28}, -1.0, 1.0);
  const HostTensor wt = random(DType::kFloat32, {32, 16, 3, 3}, -1.0, 1.0);
  conv.x = c.add_input(x);
  const std::vector<uint8_t> w_bytes = wt.bytes();
  conv.weight = c.b.weight(DType::kFloat32, wt.sizes, w_bytes.data());
  conv.out = c.b.output(DType::kFloat32, {1, 32, 28, 28});
  c.b.conv2d(conv);
  const std::vector<uint8_t> blob = c.b.build();

  auto load = [&](size_t want_cached, size_t want_searched, const char* what) {
    auto engine = Engine::create(blob.data(), blob.size());
    EXPECT_TRUE(engine.ok()) << what << "\n" << g_log;
    if (!engine.ok()) return Outputs{};
    const Engine::AlgoChoices choices = engine.get()->algo_choices();
    EXPECT_EQ(choices.from_cache, want_cached) << what;
    EXPECT_EQ(choices.searched, want_searched) << what;
    return run_host(*engine.get(), c.inputs);
  };
  const Outputs searched = load(0, 1, "first load");
  const Outputs cached = load(1, 0, "second load");
  ASSERT_EQ(searched.size(), 1u);
  ASSERT_EQ(cached.size(), 1u);
  EXPECT_EQ(searched[0].v, cached[0].v);

  std::vector<std::string> files;
  for (const auto& e : std::filesystem::directory_iterator(dir)) files.push_back(e.path());
  ASSERT_EQ(files.size(), 1u);
  std::ofstream(files[0], std::ios::trunc) << "not a cache file\n";
  load(0, 1, "after the file was damaged");
  load(1, 0, "after it was rewritten");

  std::filesystem::remove_all(dir);
  ASSERT_EQ(setenv("KILN_CACHE_DIR", "off", 1), 0);
  load(0, 1, "cache off");
  load(0, 1, "cache off, again");
  EXPECT_FALSE(std::filesystem::exists(dir));

  ASSERT_EQ(setenv("KILN_CACHE_DIR", dir, 1), 0);
  unsetenv("KILN_AUTOTUNE");
  const Outputs heuristic = load(0, 0, "autotuning off");
  ASSERT_EQ(heuristic.size(), 1u);
  EXPECT_FALSE(std::filesystem::exists(dir));
  unsetenv("KILN_CACHE_DIR");
}

// ---------------------------------------------------------------------------------------------
// Pool2d.

// p.channels_last: x and out NHWC in memory (the reference indexes them so).
void run_pool(BlobBuilder::Pool2d p, DType dtype, const std::string& name) {
  OneOp c;
  const bool cl = p.channels_last;
  const Sizes xs = cl ? Sizes{p.n, p.h, p.w, p.c} : Sizes{p.n, p.c, p.h, p.w};
  const HostTensor x = random(dtype, xs);
  p.x = c.add_input(x);
  const int64_t ho = p.h_out(), wo = p.w_out();
  p.out = c.b.output(dtype, cl ? Sizes{p.n, ho, wo, p.c} : Sizes{p.n, p.c, ho, wo});
  c.b.pool2d(p);
  const auto runs = run_three_ways(c.b, c.inputs);
  std::vector<double> want(static_cast<size_t>(p.n * p.c * ho * wo));
  for_each_index({p.n, p.c, ho, wo}, [&](int64_t nchw, const Sizes& id) {
    // The plane's first element and the step between its pixels, and where the result goes.
    const double* plane = x.v.data() + (cl ? id[0] * p.h * p.w * p.c + id[1]
                                           : (id[0] * p.c + id[1]) * p.h * p.w);
    const int64_t step = cl ? p.c : 1;
    const int64_t i = cl ? ((id[0] * ho + id[2]) * wo + id[3]) * p.c + id[1] : nchw;
    if (p.kind == blob::PoolKind::kMax) {
      double best = -kInf;
      for (int64_t ky = 0; ky < p.kh; ++ky) {
        for (int64_t kx = 0; kx < p.kw; ++kx) {
          const int64_t iy = id[2] * p.stride_h - p.pad_h + ky * p.dil_h;
          const int64_t ix = id[3] * p.stride_w - p.pad_w + kx * p.dil_w;
          if (iy >= 0 && iy < p.h && ix >= 0 && ix < p.w)
            best = std::max(best, plane[(iy * p.w + ix) * step]);
        }
      }
      want[i] = best;
    } else {
      int64_t h0 = id[2] * p.stride_h - p.pad_h, w0 = id[3] * p.stride_w - p.pad_w;
      int64_t h1 = std::min(h0 + p.kh, p.h + p.pad_h), w1 = std::min(w0 + p.kw, p.w + p.pad_w);
      const int64_t padded = (h1 - h0) * (w1 - w0);
      h0 = std::max<int64_t>(h0, 0), w0 = std::max<int64_t>(w0, 0);
      h1 = std::min(h1, p.h), w1 = std::min(w1, p.w);
      double sum = 0;
      for (int64_t iy = h0; iy < h1; ++iy)
        for (int64_t ix = w0; ix < w1; ++ix) sum += plane[(iy * p.w + ix) * step];
      want[i] = sum / static_cast<double>(p.count_include_pad ? padded : (h1 - h0) * (w1 - w0));
    }
  });
  expect_output(runs, 0, want, tol_for(dtype, 2), name);
}

TEST_F(EngineGpu, Pool2dMaxAndAverage) {
  BlobBuilder::Pool2d p;
  p.n = 2, p.c = 3, p.h = 11, p.w = 9, p.kh = 3, p.kw = 3, p.stride_h = 2, p.stride_w = 2;
  p.pad_h = 1, p.pad_w = 1;
  run_pool(p, DType::kFloat32, "max 3x3 s2 p1");
  run_pool(p, DType::kFloat16, "f16 max 3x3 s2 p1");
  BlobBuilder::Pool2d dil = p;
  dil.dil_h = 2, dil.dil_w = 2, dil.pad_h = 0, dil.pad_w = 0;
  run_pool(dil, DType::kFloat32, "max dilated");
  BlobBuilder::Pool2d ceil = p;
  ceil.ceil_mode = true, ceil.pad_h = 0, ceil.pad_w = 0, ceil.h = 10, ceil.w = 10;
  run_pool(ceil, DType::kFloat32, "max ceil_mode");
  for (bool include : {true, false}) {
    BlobBuilder::Pool2d avg = p;
    avg.kind = blob::PoolKind::kAvg, avg.count_include_pad = include;
    run_pool(avg, DType::kFloat32, std::string("avg count_include_pad ") + (include ? "1" : "0"));
    avg.ceil_mode = true;
    run_pool(avg, DType::kBFloat16,
             std::string("bf16 avg ceil count_include_pad ") + (include ? "1" : "0"));
    avg.channels_last = true;
    run_pool(avg, DType::kFloat32,
             std::string("NHWC avg ceil count_include_pad ") + (include ? "1" : "0"));
  }
  BlobBuilder::Pool2d nhwc = p;
  nhwc.channels_last = true, nhwc.c = 5;
  run_pool(nhwc, DType::kFloat32, "NHWC max 3x3 s2 p1");
  run_pool(nhwc, DType::kBFloat16, "bf16 NHWC max 3x3 s2 p1");
  nhwc.dil_h = nhwc.dil_w = 2, nhwc.pad_h = nhwc.pad_w = 0;
  run_pool(nhwc, DType::kFloat32, "NHWC max dilated");
}

}  // namespace
}  // namespace kiln::engine::gpu_test
