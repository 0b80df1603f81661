// The executor on a GPU (engine_gpu_fixture.h): a chain of ops through the arena, binding
// checks, graph replays that follow changing device pointers, a run inside a caller's stream
// capture, and the errors of a bad device index and an arena larger than the device.
#include "tests/runtime/engine/engine_gpu_fixture.h"

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

namespace kiln::engine::gpu_test {
namespace {

// ---------------------------------------------------------------------------------------------
// The executor.

TEST_F(EngineGpu, ChainThroughTheArena) {
  // y = softmax(layer_norm(x @ w + bias)), with the intermediates in the arena.
  OneOp c;
  const int64_t m = 6, k = 24, n = 40;
  const HostTensor x = random(DType::kFloat32, {m, k}, -1, 1);
  const HostTensor w = random(DType::kFloat32, {k, n}, -1, 1);
  const HostTensor bias = random(DType::kFloat32, {n}, -1, 1);
  const std::vector<uint8_t> wb = w.bytes(), bb = bias.bytes();
  BlobBuilder::Matmul mm;
  mm.a = c.add_input(x);
  mm.b = c.b.weight(DType::kFloat32, {k, n}, wb.data());
  mm.bias = c.b.weight(DType::kFloat32, {n}, bb.data());
  mm.out = c.b.arena(DType::kFloat32, {m, n});
  mm.m = m, mm.n = n, mm.k = k;
  c.b.matmul(mm);
  const int64_t normed = c.b.arena(DType::kFloat32, {m, n});
  c.b.layer_norm(mm.out, -1, -1, normed, m, n, 1e-5);
  const int64_t y = c.b.output(DType::kFloat32, {m, n});
  c.b.softmax(normed, y, m, n, 1, false);
  const auto runs = run_three_ways(c.b, c.inputs);
  std::vector<double> want(static_cast<size_t>(m * n));
  for (int64_t i = 0; i < m; ++i) {
    std::vector<double> row(static_cast<size_t>(n));
    double mean = 0, var = 0, sum = 0;
    for (int64_t j = 0; j < n; ++j) {
      double acc = bias.v[j];
      for (int64_t p = 0; p < k; ++p) acc += x.v[i * k + p] * w.v[p * n + j];
      row[j] = acc;
      mean += acc / static_cast<double>(n);
    }
    for (double v : row) var += (v - mean) * (v - mean) / static_cast<double>(n);
    for (double& v : row) v = (v - mean) / std::sqrt(var + 1e-5);
    const double mx = *std::max_element(row.begin(), row.end());
    for (double v : row) sum += std::exp(v - mx);
    for (int64_t j = 0; j < n; ++j) want[i * n + j] = std::exp(row[j] - mx) / sum;
  }
  expect_output(runs, 0, want, tol_for(DType::kFloat32, 10), "matmul -> layer_norm -> softmax");
}

std::vector<uint8_t> relu_blob(int64_t n) {
  BlobBuilder b;
  const int64_t x = b.input(DType::kFloat32, {n});
  const int64_t y = b.output(DType::kFloat32, {n});
  b.unary(UnaryKind::kRelu, x, y);
  return b.build();
}

TEST_F(EngineGpu, BindingsAreChecked) {
  const std::vector<uint8_t> blob = relu_blob(8);
  auto engine = Engine::create(blob.data(), blob.size());
  ASSERT_TRUE(engine.ok()) << g_log;
  EXPECT_EQ((*engine)->num_inputs(), 1u);
  EXPECT_EQ((*engine)->input(0).nbytes, 32u);
  EXPECT_EQ((*engine)->input(0).rank, 1u);
  EXPECT_EQ((*engine)->input(0).sizes[0], 8);
  std::vector<float> x(8, -1.0f), y(8, 0.0f), small(4);
  const Binding in{x.data(), 32, false}, out{y.data(), 32, false};
  const Binding short_in{small.data(), 16, false};
  const Binding null_in{nullptr, 32, false};
  const Binding host_as_device{x.data(), 32, true};
  g_log.clear();
  EXPECT_EQ((*engine)->execute(Span<const Binding>(), Span<const Binding>(&out, 1)),
            Error::InvalidArgument);
  EXPECT_NE(g_log.find("got 0 inputs"), std::string::npos) << g_log;
  EXPECT_EQ((*engine)->execute(Span<const Binding>(&short_in, 1), Span<const Binding>(&out, 1)),
            Error::InvalidArgument);
  EXPECT_NE(g_log.find("input 0 is 16 bytes, but the blob declares 32 bytes"), std::string::npos)
      << g_log;
  EXPECT_EQ((*engine)->execute(Span<const Binding>(&null_in, 1), Span<const Binding>(&out, 1)),
            Error::InvalidArgument);
  EXPECT_EQ(
      (*engine)->execute(Span<const Binding>(&host_as_device, 1), Span<const Binding>(&out, 1)),
      Error::InvalidArgument);
  EXPECT_NE(g_log.find("ordinary host memory"), std::string::npos) << g_log;
  ASSERT_EQ((*engine)->execute(Span<const Binding>(&in, 1), Span<const Binding>(&out, 1)),
            Error::Ok)
      << g_log;
  EXPECT_EQ(y, std::vector<float>(8, 0.0f));
}

TEST_F(EngineGpu, ReplaysFollowChangingDevicePointers) {
  const int64_t n = 1000;
  const std::vector<uint8_t> blob = relu_blob(n);
  auto engine = Engine::create(blob.data(), blob.size());
  ASSERT_TRUE(engine.ok()) << g_log;
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  float* buffers[4] = {};
  for (float*& p : buffers) ASSERT_EQ(cudaMalloc(&p, n * sizeof(float)), cudaSuccess);
  for (int run = 0; run < 8; ++run) {
    const int set = run % 2;  // alternate two binding sets: each change re-captures the graph
    std::vector<float> x(n);
    for (int64_t i = 0; i < n; ++i) x[i] = static_cast<float>((i % 7) - 3) * (run + 1);
    ASSERT_EQ(cudaMemcpy(buffers[2 * set], x.data(), n * sizeof(float), cudaMemcpyHostToDevice),
              cudaSuccess);
    ASSERT_EQ(cudaMemset(buffers[2 * set + 1], 0xFF, n * sizeof(float)), cudaSuccess);
    const Binding in{buffers[2 * set], n * sizeof(float), true};
    const Binding out{buffers[2 * set + 1], n * sizeof(float), true};
    ASSERT_EQ((*engine)->execute(Span<const Binding>(&in, 1), Span<const Binding>(&out, 1), stream),
              Error::Ok)
        << g_log;
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    std::vector<float> y(n);
    ASSERT_EQ(cudaMemcpy(y.data(), buffers[2 * set + 1], n * sizeof(float), cudaMemcpyDeviceToHost),
              cudaSuccess);
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(y[i], std::max(x[i], 0.0f)) << "run " << run;
  }
  for (float* p : buffers) cudaFree(p);
  cudaStreamDestroy(stream);
}

TEST_F(EngineGpu, RunsInsideACallersStreamCapture) {
  const int64_t n = 300;
  const std::vector<uint8_t> blob = relu_blob(n);
  auto engine = Engine::create(blob.data(), blob.size());
  ASSERT_TRUE(engine.ok()) << g_log;
  float* x = nullptr;
  float* y = nullptr;
  ASSERT_EQ(cudaMalloc(&x, n * sizeof(float)), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&y, n * sizeof(float)), cudaSuccess);
  std::vector<float> host(n);
  for (int64_t i = 0; i < n; ++i) host[i] = static_cast<float>(i % 5) - 2.0f;
  ASSERT_EQ(cudaMemcpy(x, host.data(), n * sizeof(float), cudaMemcpyHostToDevice), cudaSuccess);
  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  const Binding in{x, n * sizeof(float), true}, out{y, n * sizeof(float), true};
  // One ordinary run first, as any caller would warm up before capturing.
  ASSERT_EQ((*engine)->execute(Span<const Binding>(&in, 1), Span<const Binding>(&out, 1), stream),
            Error::Ok)
      << g_log;
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  const Error err =
      (*engine)->execute(Span<const Binding>(&in, 1), Span<const Binding>(&out, 1), stream);
  cudaGraph_t graph = nullptr;
  ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
  ASSERT_EQ(err, Error::Ok) << g_log;
  cudaGraphExec_t exec = nullptr;
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  ASSERT_EQ(cudaMemset(y, 0xFF, n * sizeof(float)), cudaSuccess);
  ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  std::vector<float> result(n);
  ASSERT_EQ(cudaMemcpy(result.data(), y, n * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(result[i], std::max(host[i], 0.0f));
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
  cudaFree(x);
  cudaFree(y);
}

TEST_F(EngineGpu, BadDeviceIndexIsNotFound) {
  const std::vector<uint8_t> blob = relu_blob(4);
  g_log.clear();
  auto engine = Engine::create(blob.data(), blob.size(), 1000);
  ASSERT_FALSE(engine.ok());
  EXPECT_EQ(engine.error(), Error::NotFound);
  EXPECT_NE(g_log.find("device_index 1000"), std::string::npos) << g_log;
}

TEST_F(EngineGpu, HugeArenaIsMemoryAllocationFailed) {
  BlobBuilder b;
  const int64_t x = b.input(DType::kFloat32, {4});
  const int64_t y = b.output(DType::kFloat32, {4});
  b.unary(UnaryKind::kRelu, x, y);
  std::vector<uint8_t> blob = b.build();
  const uint64_t arena = uint64_t{1} << 50;  // a petabyte
  std::memcpy(blob.data() + offsetof(blob::Header, arena_size), &arena, sizeof(arena));
  g_log.clear();
  auto engine = Engine::create(blob.data(), blob.size());
  ASSERT_FALSE(engine.ok());
  EXPECT_EQ(engine.error(), Error::MemoryAllocationFailed);
  EXPECT_NE(g_log.find("activation arena"), std::string::npos) << g_log;
}

}  // namespace
}  // namespace kiln::engine::gpu_test
