// A kernel launch that CUDA rejects, on the eager first run, while the ops are captured into a CUDA
// graph, and while they are captured again for new device pointers: execute returns
// Error::Internal with a log line naming the op index, its opcode and the CUDA error, and the same
// engine then runs valid inputs correctly, back on CUDA graphs. Built against the fault-injection
// variant of the engine (runtime/engine/fault_injection.h), which swaps an armed op's launch for
// one with too many threads per block; the error itself travels the engine's ordinary path.
// Needs a GPU (ctest label gpu).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "runtime/engine/engine.h"
#include "runtime/engine/fault_injection.h"
#include "tests/format/blob_builder.h"
#include "tests/format/log_capture.h"

namespace kiln::engine {
namespace {

using blob::DType;
using executorch::runtime::Error;
using executorch::runtime::Span;
using testing::BlobBuilder;

const auto* const kLog = ::testing::AddGlobalTestEnvironment(new testing::LogCaptureEnvironment);
std::string& g_log = testing::captured_log();

constexpr int64_t kN = 1000;

// y = -(relu(x) + x): op 0 unary (relu), op 1 binary (add), op 2 unary (neg); exact in fp32.
std::vector<uint8_t> three_op_blob() {
  BlobBuilder b;
  const int64_t x = b.input(DType::kFloat32, {kN});
  const int64_t r = b.arena(DType::kFloat32, {kN});
  const int64_t s = b.arena(DType::kFloat32, {kN});
  const int64_t y = b.output(DType::kFloat32, {kN});
  b.unary(blob::UnaryKind::kRelu, x, r);
  b.binary(blob::BinaryKind::kAdd, r, x, s, 1.0, 0.0, {kN}, {1}, {1});
  b.unary(blob::UnaryKind::kNeg, s, y);
  return b.build();
}

const char* const kOpNames[] = {"unary", "binary", "unary"};

std::vector<float> input_for(int run) {
  std::vector<float> x(kN);
  for (int64_t i = 0; i < kN; ++i) x[i] = static_cast<float>((i * 7 + run) % 23) - 11.0f;
  return x;
}

std::vector<float> expected_for(const std::vector<float>& x) {
  std::vector<float> y(x.size());
  for (size_t i = 0; i < x.size(); ++i) y[i] = -(std::fmax(x[i], 0.0f) + x[i]);
  return y;
}

class EngineFault : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(cuda_unavailable_reason().empty())
        << "engine_fault_gpu_test needs a CUDA device: " << cuda_unavailable_reason();
    const std::vector<uint8_t> blob = three_op_blob();
    auto created = Engine::create(blob.data(), blob.size());
    ASSERT_TRUE(created.ok()) << g_log;
    engine_ = std::move(created.get());
    ASSERT_EQ(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), cudaSuccess);
  }
  void TearDown() override {
    kiln_fault_fail_launch(0, 0);
    engine_.reset();
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
    stream_ = nullptr;
  }

  // Host bindings, on the engine's stream or the test's own; returns execute's error.
  Error run_host(int run, bool own_stream, std::vector<float>* y) {
    const std::vector<float> x = input_for(run);
    y->assign(kN, std::nanf(""));
    const Binding in{const_cast<float*>(x.data()), kN * sizeof(float), false};
    const Binding out{y->data(), kN * sizeof(float), false};
    return engine_->execute(Span<const Binding>(&in, 1), Span<const Binding>(&out, 1),
                            own_stream ? stream_ : nullptr);
  }

  // A valid run whose result is checked; `graph` says whether it must be a CUDA graph launch.
  void expect_valid_run(int run, bool own_stream, bool graph) {
    const unsigned long long launches = kiln_fault_graph_launches();
    std::vector<float> y;
    g_log.clear();
    ASSERT_EQ(run_host(run, own_stream, &y), Error::Ok) << "run " << run << "\n" << g_log;
    EXPECT_EQ(y, expected_for(input_for(run))) << "run " << run;
    EXPECT_EQ(kiln_fault_graph_launches() - launches, graph ? 1u : 0u)
        << "run " << run << (graph ? " should replay a CUDA graph" : " should run eagerly");
  }

  // Arms op `op` for one failed launch and expects the run to report it, with nothing launched
  // as a graph.
  void expect_failed_run(int run, size_t op, bool own_stream) {
    const unsigned long long launches = kiln_fault_graph_launches();
    kiln_fault_fail_launch(op, 1);
    std::vector<float> y;
    g_log.clear();
    EXPECT_EQ(run_host(run, own_stream, &y), Error::Internal) << "run " << run;
    const std::string want =
        "op " + std::to_string(op) + " (" + kOpNames[op] + "): kernel launch failed";
    EXPECT_NE(g_log.find(want), std::string::npos) << "run " << run << ": log was\n" << g_log;
    // CUDA reports the oversized block as cudaErrorInvalidValue (CUDA 13) or
    // cudaErrorInvalidConfiguration (older runtimes): either way the CUDA error is named.
    EXPECT_NE(g_log.find("cudaErrorInvalid"), std::string::npos) << g_log;
    EXPECT_EQ(kiln_fault_graph_launches(), launches) << "run " << run;
    kiln_fault_fail_launch(0, 0);
  }

  std::unique_ptr<Engine> engine_;
  cudaStream_t stream_ = nullptr;
};

TEST_F(EngineFault, LaunchFailureOnTheEagerFirstRunIsReportedAndTheEngineRecovers) {
  for (size_t op = 0; op < 3; ++op) {
    if (op > 0) {  // a fresh engine per op: the failure must hit its first (eager) run
      TearDown();
      ASSERT_NO_FATAL_FAILURE(SetUp());
    }
    expect_failed_run(0, op, /*own_stream=*/false);
    expect_valid_run(1, false, /*graph=*/false);  // still the eager first run
    expect_valid_run(2, false, /*graph=*/true);   // captured and launched
    expect_valid_run(3, true, /*graph=*/true);    // replayed on another stream
  }
}

TEST_F(EngineFault, LaunchFailureDuringGraphCaptureIsReportedAndGraphsStayInUse) {
  bool first = true;
  for (size_t op = 0; op < 3; ++op) {
    for (bool own_stream : {false, true}) {
      if (!first) {  // a fresh engine each time: once a graph exists, runs only replay it
        TearDown();
        ASSERT_NO_FATAL_FAILURE(SetUp());
      }
      first = false;
      expect_valid_run(0, false, /*graph=*/false);
      expect_failed_run(1, op, own_stream);  // the second run captures the graph: it fails there
      // The next run captures afresh and replays: no half-captured graph, no stream left in
      // capture mode, and no fallback to eager launches.
      expect_valid_run(2, own_stream, /*graph=*/true);
      expect_valid_run(3, !own_stream, /*graph=*/true);
    }
  }
}

TEST_F(EngineFault, RepeatedFailuresInARowThenRecovery) {
  expect_valid_run(0, false, false);
  kiln_fault_fail_launch(1, 3);
  for (int run = 1; run <= 3; ++run) {
    std::vector<float> y;
    g_log.clear();
    EXPECT_EQ(run_host(run, run % 2 == 0, &y), Error::Internal) << "run " << run;
    EXPECT_NE(g_log.find("op 1 (binary): kernel launch failed"), std::string::npos) << g_log;
  }
  expect_valid_run(4, false, /*graph=*/true);
  expect_valid_run(5, true, /*graph=*/true);
}

// New device pointers make the engine capture again (cudaGraphExecUpdate of the existing graph);
// a launch failure there must not leave the old executable graph behind for the new pointers.
TEST_F(EngineFault, LaunchFailureWhileRecapturingForNewDevicePointers) {
  float* buffers[4] = {};
  for (float*& p : buffers) ASSERT_EQ(cudaMalloc(&p, kN * sizeof(float)), cudaSuccess);
  auto run_device = [&](int run, int set, Error want) {
    const std::vector<float> x = input_for(run);
    EXPECT_EQ(cudaMemcpy(buffers[2 * set], x.data(), kN * sizeof(float), cudaMemcpyHostToDevice),
              cudaSuccess);
    EXPECT_EQ(cudaMemset(buffers[2 * set + 1], 0xFF, kN * sizeof(float)), cudaSuccess);
    const Binding in{buffers[2 * set], kN * sizeof(float), true};
    const Binding out{buffers[2 * set + 1], kN * sizeof(float), true};
    g_log.clear();
    const Error err =
        engine_->execute(Span<const Binding>(&in, 1), Span<const Binding>(&out, 1), stream_);
    EXPECT_EQ(err, want) << "run " << run << "\n" << g_log;
    EXPECT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
    if (want == Error::Ok) {
      std::vector<float> y(kN);
      EXPECT_EQ(cudaMemcpy(y.data(), buffers[2 * set + 1], kN * sizeof(float),
                           cudaMemcpyDeviceToHost),
                cudaSuccess);
      EXPECT_EQ(y, expected_for(x)) << "run " << run;
    }
  };
  run_device(0, 0, Error::Ok);  // eager
  run_device(1, 0, Error::Ok);  // captured for set 0
  kiln_fault_fail_launch(2, 1);
  run_device(2, 1, Error::Internal);  // re-capture for set 1 fails
  EXPECT_NE(g_log.find("op 2 (unary): kernel launch failed"), std::string::npos) << g_log;
  const unsigned long long launches = kiln_fault_graph_launches();
  run_device(3, 1, Error::Ok);
  run_device(4, 0, Error::Ok);
  run_device(5, 1, Error::Ok);
  EXPECT_EQ(kiln_fault_graph_launches() - launches, 3u);
  for (float* p : buffers) cudaFree(p);
}

// Inside the caller's own stream capture the failure is still reported with the op; once the
// caller has ended its capture, its stream and the engine run valid inputs again.
TEST_F(EngineFault, LaunchFailureInsideACallersCapture) {
  float* x = nullptr;
  float* y = nullptr;
  ASSERT_EQ(cudaMalloc(&x, kN * sizeof(float)), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&y, kN * sizeof(float)), cudaSuccess);
  const std::vector<float> host = input_for(7);
  ASSERT_EQ(cudaMemcpy(x, host.data(), kN * sizeof(float), cudaMemcpyHostToDevice), cudaSuccess);
  const Binding in{x, kN * sizeof(float), true}, out{y, kN * sizeof(float), true};
  auto execute = [&] {
    return engine_->execute(Span<const Binding>(&in, 1), Span<const Binding>(&out, 1), stream_);
  };
  ASSERT_EQ(execute(), Error::Ok) << g_log;  // warm up first, as a caller would
  ASSERT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
  kiln_fault_fail_launch(1, 1);
  ASSERT_EQ(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  g_log.clear();
  const Error err = execute();
  cudaGraph_t graph = nullptr;
  (void)cudaStreamEndCapture(stream_, &graph);  // the caller's capture: may be invalidated
  if (graph != nullptr) cudaGraphDestroy(graph);
  (void)cudaGetLastError();
  kiln_fault_fail_launch(0, 0);
  EXPECT_EQ(err, Error::Internal);
  EXPECT_NE(g_log.find("op 1 (binary): kernel launch failed"), std::string::npos) << g_log;
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusActive;
  ASSERT_EQ(cudaStreamIsCapturing(stream_, &status), cudaSuccess);
  EXPECT_EQ(status, cudaStreamCaptureStatusNone);
  for (int run = 0; run < 3; ++run) {
    ASSERT_EQ(cudaMemset(y, 0xFF, kN * sizeof(float)), cudaSuccess);
    ASSERT_EQ(execute(), Error::Ok) << "run " << run << "\n" << g_log;
    ASSERT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
    std::vector<float> result(kN);
    ASSERT_EQ(cudaMemcpy(result.data(), y, kN * sizeof(float), cudaMemcpyDeviceToHost),
              cudaSuccess);
    EXPECT_EQ(result, expected_for(host)) << "run " << run;
  }
  cudaFree(x);
  cudaFree(y);
}

}  // namespace
}  // namespace kiln::engine
