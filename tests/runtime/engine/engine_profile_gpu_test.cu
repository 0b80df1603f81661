// Per-op profiling (runtime/engine/profile.h): with profiling on, every run of an engine is eager
// (no CUDA graph launch), correct, and adds one GPU time per op; the report lists each op once,
// sorted, with shares summing to 100%; turned off again, the engine is back on graph replay.
// Built against the fault-injection variant of the engine only for its graph-launch counter
// (kiln_fault_graph_launches); no fault is armed. Needs a GPU (ctest label gpu).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <sstream>
#include <string>
#include <vector>

#include "runtime/engine/engine.h"
#include "runtime/engine/fault_injection.h"
#include "runtime/engine/profile.h"
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

// Large enough that every op's kernel takes well over the events' resolution (about 0.5 us).
constexpr int64_t kN = 1 << 22;

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

std::vector<float> input_for(int run) {
  std::vector<float> x(kN);
  for (int64_t i = 0; i < kN; ++i) x[i] = static_cast<float>((i * 7 + run) % 23) - 11.0f;
  return x;
}

bool matches(const std::vector<float>& x, const std::vector<float>& y) {
  for (size_t i = 0; i < x.size(); ++i) {
    if (y[i] != -(std::fmax(x[i], 0.0f) + x[i])) return false;
  }
  return true;
}

class EngineProfile : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(cuda_unavailable_reason().empty())
        << "engine_profile_gpu_test needs a CUDA device: " << cuda_unavailable_reason();
    profile::set_enabled(false);
    const std::vector<uint8_t> blob = three_op_blob();
    auto created = Engine::create(blob.data(), blob.size());
    ASSERT_TRUE(created.ok()) << g_log;
    engine_ = std::move(created.get());
    ASSERT_EQ(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), cudaSuccess);
  }
  void TearDown() override {
    profile::set_enabled(false);
    engine_.reset();
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
    stream_ = nullptr;
  }

  // One run with host bindings; checks the result and whether it was a graph launch.
  void run(int index, bool own_stream, bool graph) {
    const std::vector<float> x = input_for(index);
    std::vector<float> y(kN, std::nanf(""));
    const Binding in{const_cast<float*>(x.data()), kN * sizeof(float), false};
    const Binding out{y.data(), kN * sizeof(float), false};
    const unsigned long long launches = kiln_fault_graph_launches();
    g_log.clear();
    ASSERT_EQ(engine_->execute(Span<const Binding>(&in, 1), Span<const Binding>(&out, 1),
                               own_stream ? stream_ : nullptr),
              Error::Ok)
        << "run " << index << "\n" << g_log;
    EXPECT_TRUE(matches(x, y)) << "run " << index;
    EXPECT_EQ(kiln_fault_graph_launches() - launches, graph ? 1u : 0u)
        << "run " << index << (graph ? " should replay a CUDA graph" : " should run eagerly");
  }

  std::unique_ptr<Engine> engine_;
  cudaStream_t stream_ = nullptr;
};

// The profiled engines of the process (this test's engine is the only live one).
std::vector<profile::EngineStats> profiled() {
  std::vector<profile::EngineStats> out;
  for (profile::EngineStats& e : profile::snapshot()) {
    if (e.runs > 0) out.push_back(std::move(e));
  }
  return out;
}

TEST_F(EngineProfile, ProfiledRunsAreEagerTimedPerOpAndGraphsResumeWhenOff) {
  run(0, false, false);  // first run: eager, as always
  run(1, false, true);   // then a graph
  EXPECT_TRUE(profiled().empty()) << "nothing is recorded while profiling is off";

  profile::set_enabled(true);
  run(2, false, false);  // warm-up, then forgotten
  profile::reset();
  constexpr int kRuns = 5;
  for (int i = 0; i < kRuns; ++i) run(10 + i, i % 2 == 1, false);  // both streams

  const std::vector<profile::EngineStats> engines = profiled();
  ASSERT_EQ(engines.size(), 1u);
  const profile::EngineStats& e = engines[0];
  EXPECT_EQ(e.runs, static_cast<uint64_t>(kRuns));
  ASSERT_EQ(e.ops.size(), 3u);
  const char* const names[] = {"unary", "binary", "unary"};
  double op_sum = 0.0;
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(e.ops[i].index, i);
    EXPECT_EQ(e.ops[i].opcode, names[i]);
    EXPECT_EQ(e.ops[i].output, "Float32[" + std::to_string(kN) + "]");
    EXPECT_EQ(e.ops[i].calls, static_cast<uint64_t>(kRuns));
    EXPECT_GT(e.ops[i].total_ms, 0.0) << "op " << i;
    op_sum += e.ops[i].total_ms;
  }
  EXPECT_GT(e.wall_ms, op_sum) << "the host time of a run includes its ops";
  EXPECT_DOUBLE_EQ(profile::total_ms(), op_sum);

  // The report: one row per op, sorted by total time, shares adding up to 100%.
  const std::string text = profile::report();
  std::istringstream lines(text);
  std::string line;
  int rows = 0;
  double share_sum = 0.0, previous = 1e300;
  bool total_line = false, per_run_line = false;
  while (std::getline(lines, line)) {
    unsigned rank = 0, op = 0;
    char opcode[32], output[64];
    double total = 0, mean = 0, share = 0;
    if (std::sscanf(line.c_str(), " %u %u %31s %63s %lf %lf %lf%%", &rank, &op, opcode, output,
                    &total, &mean, &share) == 7) {
      ++rows;
      EXPECT_EQ(rank, static_cast<unsigned>(rows)) << line;
      EXPECT_LE(total, previous + 1e-3) << "rows are sorted by total time:\n" << text;
      EXPECT_NEAR(mean, total / kRuns, 1e-3) << line;
      previous = total;
      share_sum += share;
    }
    total_line |= line.find("  total ") == 0;
    per_run_line |= line.find("per run: op time") != std::string::npos;
  }
  EXPECT_EQ(rows, 3) << text;
  EXPECT_NEAR(share_sum, 100.0, 0.5) << text;
  EXPECT_TRUE(total_line) << text;
  EXPECT_TRUE(per_run_line) << text;
  EXPECT_NE(text.find("Kiln engine"), std::string::npos) << text;
  EXPECT_NE(text.find("5 profiled runs"), std::string::npos) << text;

  profile::set_enabled(false);
  run(20, false, true);  // back on the captured graph, nothing more recorded
  run(21, true, true);
  EXPECT_EQ(profiled()[0].runs, static_cast<uint64_t>(kRuns));

  profile::reset();
  EXPECT_TRUE(profiled().empty());
  EXPECT_EQ(profile::report(), "");
}

TEST_F(EngineProfile, ADestroyedEngineLeavesTheReport) {
  profile::set_enabled(true);
  run(0, false, false);
  ASSERT_EQ(profiled().size(), 1u);
  engine_.reset();
  EXPECT_TRUE(profile::snapshot().empty());
  EXPECT_EQ(profile::report(), "");
}

}  // namespace
}  // namespace kiln::engine
