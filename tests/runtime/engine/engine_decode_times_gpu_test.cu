// The batch-1 decode step's ops at the Llama-3.2-1B shapes, timed through Engine with device
// bindings and the CUDA graph replayed (what a decode step runs): printed measurements for the
// choices the engine makes, nothing asserted about the times (each test checks only that every
// execute succeeded). Kiln's GEMV against cuBLASLt (KILN_GEMV=off) per projection shape, with
// several weights per program so that the weights come from HBM, not the 50 MB L2, as in a real
// step; the attention over a 2048-row KV cache at several positions on the flash-decoding kernel
// (attention_decode.cu, the default) and on the generic kernel (KILN_ATTENTION_DECODE=off), with
// the query heads of a KV head packed into one CTA and without (KILN_ATTENTION_QUERIES=4).
#include "tests/runtime/engine/engine_gpu_fixture.h"

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <functional>
#include <vector>

namespace kiln::engine::gpu_test {
namespace {

// Microseconds per execute of `blob` (median-free: the mean of `iters` back-to-back executes on
// one stream after 5 warm-up runs), with every input and output bound to device memory of its
// size filled with `fill` bytes.
double time_blob(const std::vector<uint8_t>& blob, const std::vector<size_t>& in_bytes,
                 const std::vector<size_t>& out_bytes, int iters,
                 const std::function<void(std::vector<void*>&)>& fill_inputs) {
  auto engine = Engine::create(blob.data(), blob.size());
  EXPECT_TRUE(engine.ok()) << g_log;
  if (!engine.ok()) return -1.0;
  std::vector<void*> ins(in_bytes.size()), outs(out_bytes.size());
  std::vector<Binding> in_b, out_b;
  for (size_t i = 0; i < ins.size(); ++i) {
    EXPECT_EQ(cudaMalloc(&ins[i], in_bytes[i]), cudaSuccess);
    EXPECT_EQ(cudaMemset(ins[i], 0x3c, in_bytes[i]), cudaSuccess);  // bf16 0x3c3c = 0.0115
    in_b.push_back({ins[i], in_bytes[i], true});
  }
  fill_inputs(ins);
  for (size_t o = 0; o < outs.size(); ++o) {
    EXPECT_EQ(cudaMalloc(&outs[o], out_bytes[o]), cudaSuccess);
    out_b.push_back({outs[o], out_bytes[o], true});
  }
  cudaStream_t stream;
  EXPECT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  auto run = [&] {
    return (*engine)->execute(Span<const Binding>(in_b.data(), in_b.size()),
                              Span<const Binding>(out_b.data(), out_b.size()), stream);
  };
  bool ok = true;
  for (int i = 0; i < 5 && ok; ++i) ok = run() == Error::Ok;
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  cudaEventRecord(start, stream);
  for (int i = 0; i < iters && ok; ++i) ok = run() == Error::Ok;
  cudaEventRecord(stop, stream);
  EXPECT_EQ(cudaEventSynchronize(stop), cudaSuccess);
  EXPECT_TRUE(ok) << "execute failed: " << g_log;
  float ms = 0;
  cudaEventElapsedTime(&ms, start, stop);
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  cudaStreamDestroy(stream);
  for (void* p : ins) cudaFree(p);
  for (void* p : outs) cudaFree(p);
  return ok ? 1e3 * ms / iters : -1.0;
}

// `copies` bf16 GEMVs x [1, K] x W_i [N, K]^T of distinct weights, one program: the weights of
// one execute exceed the L2 (as a decode step's do), so each op streams its weight from HBM.
std::vector<uint8_t> gemv_blob(int64_t n, int64_t k, int copies, std::vector<uint16_t>& w) {
  BlobBuilder b;
  const int64_t x = b.input(DType::kBFloat16, {1, k});
  for (int c = 0; c < copies; ++c) {
    BlobBuilder::Matmul m;
    m.a = x;
    w[0] = uint16_t(0x3c00 + c);   // distinct contents: the engine shares equal weights
    m.b = b.weight(DType::kBFloat16, {n, k}, w.data());
    m.out = b.output(DType::kBFloat16, {1, n});
    m.m = 1, m.n = n, m.k = k, m.trans_b = true;
    b.matmul(m);
  }
  return b.build();
}

TEST_F(EngineGpu, GemvDecodeShapesAgainstCublasLt) {
  // q/k/v merged, o, gate/up merged, down, the LM head (128256 x 2048).
  const int64_t shapes[][2] = {{3072, 2048}, {2048, 2048}, {16384, 2048}, {2048, 8192},
                               {128256, 2048}};
  for (const auto& s : shapes) {
    const int64_t n = s[0], k = s[1];
    const double bytes = double(n * k) * 2;
    const int copies = std::max(1, std::min(8, int(200e6 / bytes)));
    std::vector<uint16_t> w(size_t(n * k));
    for (size_t i = 0; i < w.size(); ++i) w[i] = uint16_t(0x3c00 + (i * 2654435761u >> 24));
    const std::vector<uint8_t> blob = gemv_blob(n, k, copies, w);
    for (const char* mode : {"kiln", "cublaslt"}) {
      if (std::string(mode) == "cublaslt") setenv("KILN_GEMV", "off", 1);
      const double us = time_blob(blob, {size_t(k) * 2},
                                  std::vector<size_t>(size_t(copies), size_t(n) * 2), 30,
                                  [](std::vector<void*>&) {});
      unsetenv("KILN_GEMV");
      ASSERT_GT(us, 0.0);
      std::printf("[perf] gemv %-8s N=%6lld K=%5lld: %7.2f us per op (%d ops a run), %5.0f GB/s "
                  "of weight\n",
                  mode, static_cast<long long>(n), static_cast<long long>(k), us / copies, copies,
                  bytes / (us / copies * 1e3));
    }
  }
}

TEST_F(EngineGpu, AttentionDecodeOverAStaticCache) {
  constexpr int64_t kHq = 32, kHkv = 8, kCache = 2048, kD = 64;
  BlobBuilder b;
  BlobBuilder::Attention a;
  a.q = b.input(DType::kBFloat16, {1, kHq, 1, kD});
  a.k = b.input(DType::kBFloat16, {1, kHkv, kCache, kD});
  a.v = b.input(DType::kBFloat16, {1, kHkv, kCache, kD});
  a.mask = b.input(DType::kBool, {1, 1, 1, kCache});
  a.batch = 1, a.heads_q = kHq, a.heads_kv = kHkv, a.seq_q = 1, a.seq_kv = kCache;
  a.head_dim = kD, a.head_dim_v = kD, a.scale = 0.125;
  a.mask_strides[0] = kCache, a.mask_strides[1] = 0, a.mask_strides[2] = kCache;
  a.mask_strides[3] = 1;
  // Several ops a run, so that the host's work per execute hides behind the GPU's.
  constexpr int kOps = 8;
  for (int i = 0; i < kOps; ++i) {
    a.out = b.output(DType::kBFloat16, {1, kHq, 1, kD});
    b.attention(a);
  }
  const std::vector<uint8_t> blob = b.build();
  const std::vector<size_t> in = {size_t(kHq * kD * 2), size_t(kHkv * kCache * kD * 2),
                                  size_t(kHkv * kCache * kD * 2), size_t(kCache)};
  for (int64_t position : {19, 127, 1023, 2047}) {
    for (const char* mode : {"decode", "packed", "per-head"}) {
      // decode: the flash-decoding kernel (the default); packed / per-head: the generic
      // kernel with a KV head's query heads in one CTA or a CTA per head.
      if (std::string(mode) != "decode") setenv("KILN_ATTENTION_DECODE", "off", 1);
      if (std::string(mode) == "per-head") setenv("KILN_ATTENTION_QUERIES", "4", 1);
      const double us = time_blob(blob, in, std::vector<size_t>(kOps, size_t(kHq * kD * 2)), 100,
                                  [&](std::vector<void*>& ins) {
                                    std::vector<uint8_t> m(size_t(kCache), 0);
                                    for (int64_t j = 0; j <= position; ++j) m[size_t(j)] = 1;
                                    cudaMemcpy(ins[3], m.data(), m.size(), cudaMemcpyHostToDevice);
                                  });
      unsetenv("KILN_ATTENTION_QUERIES");
      unsetenv("KILN_ATTENTION_DECODE");
      ASSERT_GT(us, 0.0);
      std::printf("[perf] attention decode %-8s 32 q / 8 kv heads, cache 2048, position %4lld: "
                  "%6.2f us per op (%d ops a run)\n",
                  mode, static_cast<long long>(position), us / kOps, kOps);
    }
  }
}

}  // namespace
}  // namespace kiln::engine::gpu_test
