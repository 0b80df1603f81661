// kQuantMatmul on a GPU against a float64 host reference (engine_gpu_fixture.h says how): int8
// per output channel and int4 in groups of 32 / 64, M = 1, 4, 16 (the decode kernel) and 17, 33
// (the dense path: dequantized chunks through cuBLASLt, also with KILN_QUANT_DENSE=off), decode
// with several output rows per warp, the int4 tensor-core decode kernel, odd N,
// K a multiple of 8 and not (padded rows), K past one shared-memory tile, N past one dequantized
// chunk, bias, residual and relu / SiLU epilogues, in fp32, fp16 and bf16; the decode kernel's
// bandwidth on the 1B-class shapes (2048 x 2048 .. 128256 x 2048), printed and held to a floor;
// and the prefill (M = 128) time on those shapes, both paths, printed; a gated activation folded
// into the decode kernel.
#include "tests/runtime/engine/engine_gpu_fixture.h"

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "format/quant_layout.h"

namespace kiln::engine::gpu_test {
namespace {

struct QuantCase {
  DType dtype;
  int64_t m, n, k;
  int64_t bits = 8, group = 0;   // group 0: K (per output channel)
  bool bias = false, residual = false;
  blob::Epilogue epilogue = blob::Epilogue::kNone;   // kNone, kRelu or kSilu
};

struct Packed {
  std::vector<int32_t> words;   // [N, row_words]
  std::vector<int64_t> q;       // [N, K]
  std::vector<float> scales;    // [N, K / group]
};

// Random integers in the scheme's range (both ends included) and positive scales, packed as
// op_table.def lays kQuantMatmul's weight out.
Packed pack_random(int64_t n, int64_t k, int64_t bits, int64_t group) {
  Packed p;
  const int64_t words = blob::quant_row_words(k, bits);
  const int64_t qmax = bits == 8 ? 127 : 7;
  p.words.assign(size_t(n * words), 0);
  p.q.resize(size_t(n * k));
  std::uniform_int_distribution<int64_t> value(-qmax - (bits == 4 ? 1 : 0), qmax);
  std::uniform_real_distribution<float> scale(0.5f, 1.5f);
  auto* bytes = reinterpret_cast<uint8_t*>(p.words.data());
  for (int64_t r = 0; r < n; ++r) {
    uint8_t* row = bytes + r * words * 4;
    for (int64_t c = 0; c < k; ++c) {
      const int64_t v = value(g_rng);
      p.q[size_t(r * k + c)] = v;
      if (bits == 8) {
        row[c] = static_cast<uint8_t>(static_cast<int8_t>(v));
      } else {
        row[c / 2] |= static_cast<uint8_t>((v & 0xF) << (4 * (c % 2)));
      }
    }
  }
  p.scales.resize(size_t(n * (k / group)));
  for (float& s : p.scales) s = scale(g_rng) / float(qmax);
  return p;
}

void run_quant(const QuantCase& qc) {
  const int64_t group = qc.group == 0 ? qc.k : qc.group;
  const std::string name = std::string(dtype_name(qc.dtype)) + " int" + std::to_string(qc.bits) +
                           " M=" + std::to_string(qc.m) + " N=" + std::to_string(qc.n) +
                           " K=" + std::to_string(qc.k) + " group=" + std::to_string(group) +
                           (qc.bias ? " bias" : "") + (qc.residual ? " residual" : "");
  OneOp c;
  const Packed p = pack_random(qc.n, qc.k, qc.bits, group);
  const HostTensor x = random(qc.dtype, {qc.m, qc.k}, -1, 1);
  const HostTensor bias = random(qc.dtype, {qc.n});
  const HostTensor residual = random(qc.dtype, {qc.m, qc.n});
  BlobBuilder::QuantMatmul q;
  q.x = c.add_input(x);
  q.weight = c.b.weight(DType::kInt32, {qc.n, blob::quant_row_words(qc.k, qc.bits)},
                        p.words.data());
  q.scales = c.b.weight(DType::kFloat32, {qc.n, qc.k / group}, p.scales.data());
  if (qc.bias) q.bias = c.add_input(bias);
  if (qc.residual) q.residual = c.add_input(residual);
  q.out = c.b.output(qc.dtype, {qc.m, qc.n});
  q.m = qc.m, q.n = qc.n, q.k = qc.k, q.bits = qc.bits, q.group_size = group;
  q.epilogue = qc.epilogue;
  c.b.quant_matmul(q);

  // The dense path (M > 16) multiplies q * scale rounded to x's dtype, as a model of that dtype's
  // weights would (op_table.def); the CUDA-core kernel keeps it in fp32.
  const char* dense_env = std::getenv("KILN_QUANT_DENSE");
  const bool rounded_weight = qc.m > 16 && qc.dtype != DType::kFloat32 &&
                              !(dense_env != nullptr && std::string(dense_env) == "off");
  std::vector<double> want(size_t(qc.m * qc.n));
  double largest = 1.0;
  for (int64_t i = 0; i < qc.m; ++i) {
    for (int64_t j = 0; j < qc.n; ++j) {
      double acc = 0, magnitude = 0;
      for (int64_t kk = 0; kk < qc.k; ++kk) {
        const int64_t q = p.q[size_t(j * qc.k + kk)];
        const float scale = p.scales[size_t(j * (qc.k / group) + kk / group)];
        const double w = rounded_weight ? round_to(qc.dtype, float(q) * scale)
                                        : double(q) * double(scale);
        acc += x.v[size_t(i * qc.k + kk)] * w;
        magnitude += std::fabs(x.v[size_t(i * qc.k + kk)] * w);
      }
      if (qc.bias) acc += bias.v[size_t(j)];
      if (qc.residual) acc += residual.v[size_t(i * qc.n + j)];
      if (qc.epilogue == blob::Epilogue::kRelu) acc = std::max(acc, 0.0);
      if (qc.epilogue == blob::Epilogue::kSilu) acc = acc / (1.0 + std::exp(-acc));
      want[size_t(i * qc.n + j)] = acc;
      largest = std::max(largest, magnitude);
    }
  }
  const auto runs = run_three_ways(c.b, c.inputs);
  // fp32 accumulation of K products: the error grows with the sum of their magnitudes.
  Tol tol = tol_for(qc.dtype, qc.dtype == DType::kFloat32 ? largest : 4.0);
  expect_output(runs, 0, want, tol, name);
}

TEST_F(EngineGpu, QuantMatmulInt8DecodeAndDenseRowsEveryDtype) {
  for (DType dtype : {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
    for (int64_t m : {1, 4, 16, 17, 33}) {
      run_quant({dtype, m, 37, 64});                      // odd N, K a multiple of 16
      run_quant({dtype, m, 5, 45, 8, 0, true, true});     // K not a multiple of 8, bias, residual
    }
  }
}

TEST_F(EngineGpu, QuantMatmulInt8LongRowsSpanSeveralTiles) {
  // K = 8200 > one tile of staged activations at M = 1 (8192), and far more at M = 16 (512).
  run_quant({DType::kBFloat16, 1, 19, 8200, 8, 0, true, false});
  run_quant({DType::kFloat32, 16, 19, 8200});
  run_quant({DType::kFloat32, 3, 300, 1040, 8, 0, false, true, blob::Epilogue::kRelu});
}

// The dense path past one dequantized chunk (32 MiB: 2048 rows of K = 4096 fp32, 8192 rows of
// K = 2048 bf16), so the last chunk is a partial one; an epilogue cuBLASLt has no form of (SiLU,
// a pass after the GEMMs); and the CUDA-core kernel for M > 16 when KILN_QUANT_DENSE=off.
TEST_F(EngineGpu, QuantMatmulDenseChunksAndEpilogues) {
  run_quant({DType::kFloat32, 33, 2100, 4096, 8, 0, true, true});
  run_quant({DType::kBFloat16, 17, 8200, 2048, 4, 64, true, false});
  run_quant({DType::kBFloat16, 40, 300, 256, 8, 0, true, true, blob::Epilogue::kSilu});
  run_quant({DType::kFloat16, 40, 300, 256, 4, 32, false, false, blob::Epilogue::kRelu});
  setenv("KILN_QUANT_DENSE", "off", 1);
  run_quant({DType::kBFloat16, 40, 300, 256, 8, 0, true, true, blob::Epilogue::kSilu});
  run_quant({DType::kFloat32, 33, 37, 128, 4, 32});
  unsetenv("KILN_QUANT_DENSE");
}

// Decode (M = 1) rows long enough to run several output rows per warp: int8 at K = 2048 two a
// warp (N >= 4224), int4 four (N >= 8448), N odd so the last warp has rows past N.
TEST_F(EngineGpu, QuantMatmulDecodeSeveralRowsPerWarp) {
  run_quant({DType::kBFloat16, 1, 4229, 2048, 8, 0, true, true});
  run_quant({DType::kBFloat16, 1, 8461, 2048, 4, 32, true, false});
  run_quant({DType::kFloat32, 1, 8461, 2048, 4, 128, false, false, blob::Epilogue::kSilu});
  run_quant({DType::kFloat16, 1, 6001, 1024, 4, 64});
}

TEST_F(EngineGpu, QuantMatmulInt4Groups) {
  for (DType dtype : {DType::kFloat32, DType::kBFloat16}) {
    for (int64_t m : {1, 4, 33}) {
      run_quant({dtype, m, 37, 128, 4, 32});
      run_quant({dtype, m, 9, 192, 4, 64, true, true});
      run_quant({dtype, m, 11, 45, 4, 0});                // per channel, odd K: a padded nibble
    }
  }
}

// The tensor-core kernel (int4, bf16 / fp16, M <= 8, K a multiple of 8, scale groups of whole
// 128-value batches or per channel): N not a multiple of its 16-row tiles, K not a multiple of
// its batches (K = 200 per channel: a padded vector and a batch of two vectors), groups of 256,
// several batches a warp (K = 8192), M = 8 at the 44 KiB staging limit (K = 2816) and past it
// (K = 2944: the CUDA-core kernel), bias, residual and SiLU; the same cases again with
// KILN_QUANT_MMA=off (the CUDA-core kernel).
TEST_F(EngineGpu, QuantMatmulInt4TensorCoreDecode) {
  for (bool off : {false, true}) {
    if (off) setenv("KILN_QUANT_MMA", "off", 1);
    for (DType dtype : {DType::kBFloat16, DType::kFloat16}) {
      for (int64_t m : {1, 3, 8}) {
        run_quant({dtype, m, 37, 256, 4, 128});
        run_quant({dtype, m, 45, 200, 4, 0, true, true});
        run_quant({dtype, m, 300, 512, 4, 256, false, true, blob::Epilogue::kSilu});
      }
      run_quant({dtype, 1, 19, 8192, 4, 128, true, false});
      run_quant({dtype, 8, 21, 2816, 4, 128});
      run_quant({dtype, 8, 21, 2944, 4, 0});
    }
    unsetenv("KILN_QUANT_MMA");
  }
}

// The gated activation of a SwiGLU / GeGLU block, act(g) * u as one kFusedElementwise, runs
// inside the quantized decode kernel of the down projection after it (with its residual): int8
// per channel and int4 in groups (the 16-bit int4 path sums each vector against the offset
// values), 16-byte and element-wise staging (K = 36: 72-byte bf16 rows), M = 1 and 3, silu with
// the gate first and gelu_tanh with it second. KILN_GEMV_GLU=off runs the two ops apart, with
// the same results.
TEST_F(EngineGpu, GatedActivationFoldsIntoTheQuantizedGemv) {
  struct GateCase {
    DType dtype;
    int64_t m, k, bits, group;   // group 0: K
    bool swapped;
  };
  const GateCase cases[] = {
      {DType::kBFloat16, 1, 8192, 8, 0, false}, {DType::kBFloat16, 1, 2048, 4, 128, true},
      {DType::kBFloat16, 3, 512, 4, 32, false}, {DType::kBFloat16, 1, 36, 4, 0, true},
      {DType::kFloat32, 2, 36, 8, 0, false},    {DType::kFloat32, 1, 1024, 4, 64, true},
      {DType::kFloat16, 1, 4096, 8, 0, true},   {DType::kFloat16, 3, 1024, 4, 128, false},
  };
  for (const GateCase& gc : cases) {
    for (bool off : {false, true}) {
      const DType dtype = gc.dtype;
      const int64_t m = gc.m, k = gc.k, n = 45, group = gc.group == 0 ? k : gc.group;
      OneOp c;
      const HostTensor g = random(dtype, {m, k}, -6.0, 6.0);
      const HostTensor u = random(dtype, {m, k}, -2.0, 2.0);
      const HostTensor res = random(dtype, {m, n}, -1.0, 1.0);
      const Packed p = pack_random(n, k, gc.bits, group);
      const int64_t first = c.add_input(gc.swapped ? u : g);
      const int64_t second = c.add_input(gc.swapped ? g : u);
      const UnaryKind act = gc.swapped ? UnaryKind::kGeluTanh : UnaryKind::kSilu;
      const int64_t gated = c.b.arena(dtype, {m, k});
      c.b.gated(gated, m, k, first, second, act, gc.swapped ? 1 : 0, dtype);
      BlobBuilder::QuantMatmul q;
      q.x = gated;
      q.weight = c.b.weight(DType::kInt32, {n, blob::quant_row_words(k, gc.bits)}, p.words.data());
      q.scales = c.b.weight(DType::kFloat32, {n, k / group}, p.scales.data());
      q.residual = c.add_input(res);
      q.out = c.b.output(dtype, {m, n});
      q.m = m, q.n = n, q.k = k, q.bits = gc.bits, q.group_size = group;
      c.b.quant_matmul(q);
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
      double largest = 1.0;
      for (int64_t r = 0; r < m; ++r) {
        for (int64_t col = 0; col < n; ++col) {
          double acc = res.v[size_t(r * n + col)], magnitude = 0.0;
          for (int64_t j = 0; j < k; ++j) {
            const double x = g.v[size_t(r * k + j)];
            const double a =
                gc.swapped
                    ? 0.5 * x * (1.0 + std::tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)))
                    : x / (1.0 + std::exp(-x));
            const double w = double(p.q[size_t(col * k + j)]) *
                             double(p.scales[size_t(col * (k / group) + j / group)]);
            const double term = round_to(dtype, round_to(dtype, a) * u.v[size_t(r * k + j)]) * w;
            acc += term;
            magnitude += std::fabs(term);
          }
          want[size_t(r * n + col)] = acc;
          largest = std::max(largest, magnitude);
        }
      }
      expect_output(runs, 0, want,
                    tol_for(dtype, dtype == DType::kFloat32 ? largest : std::sqrt(double(k)) * 2),
                    std::string(dtype_name(dtype)) + (gc.swapped ? " gelu_tanh" : " silu") +
                        " gate -> int" + std::to_string(gc.bits) + " group " +
                        std::to_string(group) + " M=" + std::to_string(m) +
                        " K=" + std::to_string(k) + (off ? " (KILN_GEMV_GLU=off)" : ""));
    }
  }
}

// A bf16 program of one op, x [M, K] in and out [M, N] out, built by `add_op`: its microseconds
// per execute with device bindings (the engine's CUDA graph replayed), after 5 warm-up runs.
template <typename AddOp>
double time_one_op(int64_t m, int64_t n, int64_t k, int iters, AddOp add_op) {
  BlobBuilder b;
  const int64_t x = b.input(DType::kBFloat16, {m, k});
  const int64_t out = b.output(DType::kBFloat16, {m, n});
  add_op(b, x, out);
  const std::vector<uint8_t> blob = b.build();
  auto engine = Engine::create(blob.data(), blob.size());
  EXPECT_TRUE(engine.ok());
  if (!engine.ok()) return -1.0;
  void *xd = nullptr, *od = nullptr;
  EXPECT_EQ(cudaMalloc(&xd, size_t(m * k) * 2), cudaSuccess);
  EXPECT_EQ(cudaMalloc(&od, size_t(m * n) * 2), cudaSuccess);
  EXPECT_EQ(cudaMemset(xd, 0, size_t(m * k) * 2), cudaSuccess);
  cudaStream_t stream;
  EXPECT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  const Binding in[] = {{xd, size_t(m * k) * 2, true}};
  const Binding outs[] = {{od, size_t(m * n) * 2, true}};
  auto run = [&] {
    return (*engine)->execute(Span<const Binding>(in, 1), Span<const Binding>(outs, 1), stream);
  };
  double us = -1.0;
  bool ok = true;
  for (int i = 0; i < 5 && ok; ++i) ok = run() == Error::Ok;
  cudaEvent_t start, stop;
  EXPECT_EQ(cudaEventCreate(&start), cudaSuccess);
  EXPECT_EQ(cudaEventCreate(&stop), cudaSuccess);
  EXPECT_EQ(cudaEventRecord(start, stream), cudaSuccess);
  for (int i = 0; i < iters && ok; ++i) ok = run() == Error::Ok;
  EXPECT_EQ(cudaEventRecord(stop, stream), cudaSuccess);
  EXPECT_EQ(cudaEventSynchronize(stop), cudaSuccess);
  EXPECT_TRUE(ok) << "execute failed";
  float ms = 0;
  if (ok && cudaEventElapsedTime(&ms, start, stop) == cudaSuccess) us = 1e3 * ms / iters;
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  cudaStreamDestroy(stream);
  cudaFree(xd);
  cudaFree(od);
  return us;
}

// A kQuantMatmul op on x -> out with a constant weight, int8 per channel or int4 in groups of
// 128 (its bytes do not matter to the time).
struct QuantWeight {
  int64_t n, k, bits, group, words;
  std::vector<int32_t> packed;
  std::vector<float> scales;
  QuantWeight(int64_t n_, int64_t k_, int64_t bits_ = 8)
      : n(n_), k(k_), bits(bits_), group(bits_ == 8 ? k_ : 128),
        words(blob::quant_row_words(k_, bits_)), packed(size_t(n_ * words), 0x01FF7F81),
        scales(size_t(n_ * (k_ / group)), 1e-3f) {}
  void add(BlobBuilder& b, int64_t x, int64_t out, int64_t m) const {
    BlobBuilder::QuantMatmul q;
    q.x = x;
    q.weight = b.weight(DType::kInt32, {n, words}, packed.data());
    q.scales = b.weight(DType::kFloat32, {n, k / group}, scales.data());
    q.out = out;
    q.m = m, q.n = n, q.k = k, q.bits = bits, q.group_size = group;
    b.quant_matmul(q);
  }
};

const int64_t kShapes1B[][2] = {{2048, 2048}, {8192, 2048}, {2048, 8192}, {128256, 2048}};

// The decode kernel (M = 1, bf16) on the 1B-class projection and LM-head shapes, int8 and int4:
// achieved weight bandwidth printed; int8 held to a floor of 1 TB/s on the large shapes (a quarter
// of the H200's; a regression guard, the printed number is the measurement).
TEST_F(EngineGpu, QuantMatmulDecodeBandwidth) {
  // int4 twice: the tensor-core kernel, then the CUDA-core one (KILN_QUANT_MMA=off).
  for (int pass = 0; pass < 3; ++pass) {
    const int64_t bits = pass == 0 ? 8 : 4;
    if (pass == 2) setenv("KILN_QUANT_MMA", "off", 1);
    for (const auto& shape : kShapes1B) {
      const QuantWeight w(shape[0], shape[1], bits);
      const double us = time_one_op(1, w.n, w.k, 50, [&](BlobBuilder& b, int64_t x, int64_t out) {
        w.add(b, x, out, 1);
      });
      ASSERT_GT(us, 0.0);
      const double gbs = double(w.n * w.words * 4) / (us * 1e3);
      std::printf("[perf] quant_matmul int%lld%s bf16 M=1 N=%lld K=%lld: %.2f us/run, %.0f GB/s "
                  "of weight (launch and graph replay included)\n",
                  static_cast<long long>(bits),
                  pass == 1 ? " tensor cores" : (pass == 2 ? " CUDA cores" : ""),
                  static_cast<long long>(w.n), static_cast<long long>(w.k), us, gbs);
      if (bits == 8 && w.n * w.k >= 8192LL * 2048) {
        EXPECT_GT(gbs, 1000.0) << "N=" << w.n << " K=" << w.k;
      }
    }
  }
  unsetenv("KILN_QUANT_MMA");
}

// A prefill of 128 tokens (M = 128, bf16) on the same shapes: the dense path (with chunks of
// 4..64 MiB too), the CUDA-core kernel (KILN_QUANT_DENSE=off) and a bf16 kMatmul of the same shape, printed (a measurement, nothing
// asserted about the times).
TEST_F(EngineGpu, QuantMatmulInt8PrefillTimes) {
  constexpr int64_t kM = 128;
  for (const auto& shape : kShapes1B) {
    const QuantWeight w(shape[0], shape[1]);
    auto quant = [&](BlobBuilder& b, int64_t x, int64_t out) { w.add(b, x, out, kM); };
    const double dense = time_one_op(kM, w.n, w.k, 20, quant);
    // Other dequantized chunk sizes (the default is 32 MiB).
    for (const char* mib : {"4", "8", "16", "64"}) {
      setenv("KILN_QUANT_CHUNK_MIB", mib, 1);
      std::printf("[perf] quant_matmul int8 bf16 M=%lld N=%lld K=%lld: dense, chunks of %s MiB: "
                  "%.1f us\n",
                  static_cast<long long>(kM), static_cast<long long>(w.n),
                  static_cast<long long>(w.k), mib, time_one_op(kM, w.n, w.k, 20, quant));
    }
    unsetenv("KILN_QUANT_CHUNK_MIB");
    setenv("KILN_QUANT_DENSE", "off", 1);
    const double cores = time_one_op(kM, w.n, w.k, 3, quant);
    unsetenv("KILN_QUANT_DENSE");
    const std::vector<uint16_t> bf16_weight(size_t(w.n * w.k), 0x3C00);
    const double gemm = time_one_op(kM, w.n, w.k, 20, [&](BlobBuilder& b, int64_t x, int64_t out) {
      BlobBuilder::Matmul mm;
      mm.a = x;
      mm.b = b.weight(DType::kBFloat16, {w.n, w.k}, bf16_weight.data());
      mm.out = out;
      mm.m = kM, mm.n = w.n, mm.k = w.k, mm.trans_b = true;
      b.matmul(mm);
    });
    ASSERT_GT(dense, 0.0);
    std::printf("[perf] quant_matmul int8 bf16 M=%lld N=%lld K=%lld: dense %.1f us, CUDA cores "
                "%.1f us, bf16 matmul %.1f us (dense / bf16 %.2fx)\n",
                static_cast<long long>(kM), static_cast<long long>(w.n),
                static_cast<long long>(w.k), dense, cores, gemm, dense / gemm);
  }
}

}  // namespace
}  // namespace kiln::engine::gpu_test
