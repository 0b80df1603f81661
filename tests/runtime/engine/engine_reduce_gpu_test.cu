// The ops that reduce along an axis, on a GPU against a float64 host reference
// (engine_gpu_fixture.h says how): softmax, layer norm and the reductions. Their kernels share
// memory between threads, so gpu-check.sh sanitize also runs this binary under racecheck.
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
// Softmax, layer norm, reduce.

TEST_F(EngineGpu, SoftmaxRowsColumnsAndLog) {
  struct Case {
    int64_t outer, dim, inner;
  };
  for (DType dtype : {DType::kFloat32, DType::kFloat16}) {
    for (const Case& sc : {Case{7, 10, 1}, Case{3, 3000, 1}, Case{2, 5, 7}, Case{1, 1, 1}}) {
      for (bool is_log : {false, true}) {
        OneOp c;
        HostTensor x = random(dtype, {sc.outer, sc.dim, sc.inner}, -4.0, 4.0);
        if (sc.dim > 2) x.v[1] = -kInf;  // a masked element
        const int64_t xi = c.add_input(x);
        const int64_t out = c.b.output(dtype, {sc.outer, sc.dim, sc.inner});
        c.b.softmax(xi, out, sc.outer, sc.dim, sc.inner, is_log);
        const auto runs = run_three_ways(c.b, c.inputs);
        std::vector<double> want(x.v.size());
        for (int64_t o = 0; o < sc.outer; ++o) {
          for (int64_t in = 0; in < sc.inner; ++in) {
            double mx = -kInf, sum = 0;
            for (int64_t d = 0; d < sc.dim; ++d)
              mx = std::max(mx, x.v[(o * sc.dim + d) * sc.inner + in]);
            for (int64_t d = 0; d < sc.dim; ++d)
              sum += std::exp(x.v[(o * sc.dim + d) * sc.inner + in] - mx);
            for (int64_t d = 0; d < sc.dim; ++d) {
              const size_t i = static_cast<size_t>((o * sc.dim + d) * sc.inner + in);
              want[i] = is_log ? x.v[i] - mx - std::log(sum) : std::exp(x.v[i] - mx) / sum;
            }
          }
        }
        // Probabilities are small: hold them to a relative tolerance.
        const Tol tol = dtype == DType::kFloat32 ? Tol{1e-7, 1e-5} : Tol{1e-6, 2e-3};
        expect_output(runs, 0, want, tol,
                      std::string(dtype_name(dtype)) + (is_log ? " log_softmax " : " softmax ") +
                          std::to_string(sc.outer) + "x" + std::to_string(sc.dim) + "x" +
                          std::to_string(sc.inner));
      }
    }
  }
}

TEST_F(EngineGpu, LayerNormWarpAndBlockRows) {
  for (DType dtype : {DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
    // Every width class of the kernels: a warp per row (<= 256), the vectorised block per row
    // (whole 16-byte vectors, weight and bias of one dtype: 128..1024 threads, partly filled
    // blocks included), the register-cached block per row (257..8192 otherwise), the uncached
    // block loop (wider).
    for (int64_t cols : {16, 3000, 1, 257, 768, 1000, 1024, 2048, 4096, 8192, 8193, 16384}) {
      // affine (fp32 weight, row-dtype bias), plain, RMSNorm with a weight, affine with both in
      // fp32, affine with both in the row's dtype
      for (int variant = 0; variant < 5; ++variant) {
        const bool affine = variant != 1, rms = variant == 2;
        const DType wdt = variant == 4 ? dtype : DType::kFloat32;
        const DType bdt = variant == 3 ? DType::kFloat32 : dtype;
        OneOp c;
        const int64_t rows = cols == 768 ? 700 : 5;  // 700: BERT/ViT-like, hundreds of blocks
        const HostTensor x = random(dtype, {rows, cols}, -3.0, 5.0);
        const HostTensor w = random(wdt, {cols});
        const HostTensor bias = random(bdt, {cols});
        const int64_t xi = c.add_input(x);
        const std::vector<uint8_t> wb = w.bytes(), bb = bias.bytes();
        const int64_t wi = affine ? c.b.weight(wdt, {cols}, wb.data()) : -1;
        const int64_t bi = affine ? c.b.weight(bdt, {cols}, bb.data()) : -1;
        const int64_t out = c.b.output(dtype, {rows, cols});
        c.b.layer_norm(xi, wi, rms ? -1 : bi, out, rows, cols, 1e-5, rms);
        const auto runs = run_three_ways(c.b, c.inputs);
        std::vector<double> want(x.v.size());
        for (int64_t r = 0; r < rows; ++r) {
          double mean = 0, var = 0;
          for (int64_t k = 0; k < cols && !rms; ++k) mean += x.v[r * cols + k];
          mean /= static_cast<double>(cols);
          for (int64_t k = 0; k < cols; ++k) var += std::pow(x.v[r * cols + k] - mean, 2);
          var /= static_cast<double>(cols);
          for (int64_t k = 0; k < cols; ++k) {
            double y = (x.v[r * cols + k] - mean) / std::sqrt(var + 1e-5);
            if (affine) y = y * w.v[k] + (rms ? 0.0 : bias.v[k]);
            want[r * cols + k] = y;
          }
        }
        expect_output(runs, 0, want, tol_for(dtype, 20),
                      std::string(dtype_name(dtype)) + " layer_norm cols " + std::to_string(cols) +
                          (affine ? " affine" : "") + (rms ? " rms" : "") + " variant " +
                          std::to_string(variant));
      }
    }
  }
}

TEST_F(EngineGpu, ReduceEveryKindRowsAndColumns) {
  struct Case {
    int64_t outer, reduce, inner;
  };
  const blob::ReduceKind kinds[] = {blob::ReduceKind::kSum, blob::ReduceKind::kMean,
                                    blob::ReduceKind::kAmax, blob::ReduceKind::kAmin,
                                    blob::ReduceKind::kAny};
  // Columns (inner > 1): a thread per output (4x1x3), tiles of one chunk (2x40x6), tiles over
  // many chunks combined from the workspace (an NHWC global pool 1x12544x32; a partial tile
  // 2x3000x40; 3x200x1000 wide and a few chunks).
  for (const Case& rc : {Case{3, 50, 1}, Case{2, 40, 6}, Case{2, 5000, 1}, Case{4, 1, 3},
                         Case{1, 12544, 32}, Case{2, 3000, 40}, Case{3, 200, 1000}}) {
    for (DType dtype : {DType::kFloat32, DType::kFloat16, DType::kInt64, DType::kBool}) {
      OneOp c;
      const HostTensor x =
          dtype == DType::kBool    ? random_int(dtype, {rc.outer, rc.reduce, rc.inner}, 0, 1)
          : dtype == DType::kInt64 ? random_int(dtype, {rc.outer, rc.reduce, rc.inner}, -99, 99)
                                   : random(dtype, {rc.outer, rc.reduce, rc.inner});
      const int64_t xi = c.add_input(x);
      std::vector<DType> out_dtypes;
      for (blob::ReduceKind kind : kinds) {
        const DType od = kind == blob::ReduceKind::kAny    ? DType::kBool
                         : kind == blob::ReduceKind::kMean ? DType::kFloat32
                         : dtype == DType::kBool           ? DType::kInt64
                                                           : dtype;
        out_dtypes.push_back(od);
        c.b.reduce(kind, xi, c.b.output(od, {rc.outer, rc.inner}), rc.outer, rc.reduce, rc.inner);
      }
      const auto runs = run_three_ways(c.b, c.inputs);
      for (size_t k = 0; k < std::size(kinds); ++k) {
        std::vector<double> want(static_cast<size_t>(rc.outer * rc.inner));
        for (int64_t o = 0; o < rc.outer; ++o) {
          for (int64_t in = 0; in < rc.inner; ++in) {
            double sum = 0, mx = -kInf, mn = kInf, any = 0;
            for (int64_t r = 0; r < rc.reduce; ++r) {
              const double v = x.v[(o * rc.reduce + r) * rc.inner + in];
              sum += v, mx = std::max(mx, v), mn = std::min(mn, v), any = any || v != 0;
            }
            const double vals[] = {sum, sum / static_cast<double>(rc.reduce), mx, mn, any};
            want[o * rc.inner + in] = round_to(out_dtypes[k], vals[k]);
          }
        }
        const Tol tol = out_dtypes[k] == DType::kFloat16   ? tol_for(DType::kFloat16, 40)
                        : out_dtypes[k] == DType::kFloat32 ? tol_for(DType::kFloat32, 100)
                                                           : Tol{0, 0};
        expect_output(runs, k, want, tol,
                      std::string(dtype_name(dtype)) + " reduce kind " + std::to_string(k) +
                          " shape " + std::to_string(rc.outer) + "x" + std::to_string(rc.reduce) +
                          "x" + std::to_string(rc.inner));
      }
    }
  }
}

// argmax / argmin: every launch shape (warp rows, block rows, columns, few long rows split into
// chunks: an LM head's 128256 logits), ties drawn from a small integer range (the first index
// must win, also when every chunk holds the extreme), NaN planted in floating rows (NaN is the
// extreme).
TEST_F(EngineGpu, ArgmaxArgminTiesAndNan) {
  struct Case {
    int64_t outer, reduce, inner;
  };
  for (const Case& rc : {Case{5, 37, 1}, Case{2, 5000, 1}, Case{3, 40, 6}, Case{4, 1, 3},
                         Case{1, 128256, 1}, Case{3, 20001, 1}}) {
    for (DType dtype : {DType::kFloat32, DType::kFloat16, DType::kBFloat16, DType::kInt32,
                        DType::kInt64}) {
      const bool floating = is_floating(dtype);
      OneOp c;
      HostTensor x = random_int(dtype, {rc.outer, rc.reduce, rc.inner}, -3, 3);
      if (floating && rc.reduce > 1) {
        // Row 0 gets one NaN (late in the row), the last row two (the first must win).
        const int64_t r0 = rc.reduce - 1, r1 = rc.reduce / 2;
        x.v[(0 * rc.reduce + r0) * rc.inner] = kNan;
        x.v[((rc.outer - 1) * rc.reduce + r1) * rc.inner] = kNan;
        x.v[((rc.outer - 1) * rc.reduce + r0) * rc.inner] = kNan;
      }
      const int64_t xi = c.add_input(x);
      for (blob::ReduceKind kind : {blob::ReduceKind::kArgmax, blob::ReduceKind::kArgmin}) {
        c.b.reduce(kind, xi, c.b.output(DType::kInt64, {rc.outer, rc.inner}), rc.outer,
                   rc.reduce, rc.inner);
      }
      const auto runs = run_three_ways(c.b, c.inputs);
      for (size_t k = 0; k < 2; ++k) {
        std::vector<double> want(static_cast<size_t>(rc.outer * rc.inner));
        for (int64_t o = 0; o < rc.outer; ++o) {
          for (int64_t in = 0; in < rc.inner; ++in) {
            int64_t best = 0;
            for (int64_t r = 1; r < rc.reduce; ++r) {
              const double v = x.v[(o * rc.reduce + r) * rc.inner + in];
              const double b = x.v[(o * rc.reduce + best) * rc.inner + in];
              if (std::isnan(b)) break;
              if (std::isnan(v) || (k == 0 ? v > b : v < b)) best = r;
            }
            want[o * rc.inner + in] = static_cast<double>(best);
          }
        }
        expect_output(runs, k, want, Tol{0, 0},
                      std::string(dtype_name(dtype)) + (k == 0 ? " argmax " : " argmin ") +
                          std::to_string(rc.outer) + "x" + std::to_string(rc.reduce) + "x" +
                          std::to_string(rc.inner));
      }
    }
  }
}

// median: the lower median of odd and even axes (rows and columns), ties from a small integer
// range, NaN planted in the first slice of floating inputs (the median is then NaN).
TEST_F(EngineGpu, MedianLowerOfOddEvenRowsColumnsAndNan) {
  struct Case {
    int64_t outer, reduce, inner;
  };
  for (const Case& rc : {Case{5, 7, 1}, Case{3, 8, 1}, Case{2, 40, 6}, Case{3, 1, 2},
                         Case{2, 300, 1}}) {
    for (DType dtype : {DType::kFloat32, DType::kFloat16, DType::kInt32, DType::kInt64}) {
      OneOp c;
      HostTensor x = is_floating(dtype) && rc.reduce > 20
                         ? random(dtype, {rc.outer, rc.reduce, rc.inner})
                         : random_int(dtype, {rc.outer, rc.reduce, rc.inner}, -4, 4);
      if (is_floating(dtype) && rc.reduce > 1) x.v[rc.inner] = kNan;  // slice (0, 0)
      const int64_t xi = c.add_input(x);
      c.b.reduce(blob::ReduceKind::kMedian, xi, c.b.output(dtype, {rc.outer, rc.inner}),
                 rc.outer, rc.reduce, rc.inner);
      const auto runs = run_three_ways(c.b, c.inputs);
      std::vector<double> want(static_cast<size_t>(rc.outer * rc.inner));
      for (int64_t o = 0; o < rc.outer; ++o) {
        for (int64_t in = 0; in < rc.inner; ++in) {
          std::vector<double> slice;
          for (int64_t r = 0; r < rc.reduce; ++r)
            slice.push_back(x.v[(o * rc.reduce + r) * rc.inner + in]);
          const bool nan = std::any_of(slice.begin(), slice.end(), [](double v) {
            return std::isnan(v);
          });
          std::sort(slice.begin(), slice.end());
          want[o * rc.inner + in] = nan ? kNan : slice[static_cast<size_t>((rc.reduce - 1) / 2)];
        }
      }
      expect_output(runs, 0, want, Tol{0, 0},
                    std::string(dtype_name(dtype)) + " median " + std::to_string(rc.outer) + "x" +
                        std::to_string(rc.reduce) + "x" + std::to_string(rc.inner));
    }
  }
}

TEST_F(EngineGpu, ReduceOverAnEmptyAxis) {
  OneOp c;
  const HostTensor x = random(DType::kFloat32, {3, 0});
  const int64_t xi = c.add_input(x);
  c.b.reduce(blob::ReduceKind::kSum, xi, c.b.output(DType::kFloat32, {3}), 3, 0, 1);
  c.b.reduce(blob::ReduceKind::kMean, xi, c.b.output(DType::kFloat32, {3}), 3, 0, 1);
  c.b.reduce(blob::ReduceKind::kAny, xi, c.b.output(DType::kBool, {3}), 3, 0, 1);
  const auto runs = run_three_ways(c.b, c.inputs);
  expect_output(runs, 0, {0, 0, 0}, {0, 0}, "sum over nothing");
  expect_output(runs, 1, {kNan, kNan, kNan}, {0, 0}, "mean over nothing");
  expect_output(runs, 2, {0, 0, 0}, {0, 0}, "any over nothing");
}

}  // namespace
}  // namespace kiln::engine::gpu_test
