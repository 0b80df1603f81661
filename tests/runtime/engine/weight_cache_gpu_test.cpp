// The device weight cache on a GPU: engines whose blobs share weight tensors hold those bytes on
// the device once (checked with Kiln's own totals and with cudaMemGetInfo), every engine computes
// correctly, destroying one leaves the others correct, destroying all frees the memory, and
// engines created on several threads at once still upload each shared tensor once.
// Needs a GPU: the `gpu` CTest label keeps it out of CPU-only CI.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <random>
#include <thread>
#include <vector>

#include "runtime/engine/engine.h"
#include "tests/format/blob_builder.h"
#include "tests/format/log_capture.h"

namespace kiln::engine {
namespace {

using blob::DType;
using executorch::runtime::Error;
using executorch::runtime::Span;
using testing::BlobBuilder;

std::string& g_log = testing::captured_log();
const auto* const kLog = ::testing::AddGlobalTestEnvironment(new testing::LogCaptureEnvironment);

// y = gelu(x @ W1 + b1) @ W2 + b2. W1/b1 are "the shared Linear", W2/b2 differ per engine.
// W1 is 8 MiB and W2 4 MiB (each its own allocation); b1 (8 KiB) and b2 (2 KiB) are packed.
constexpr int64_t kM = 4, kK = 1024, kN = 2048, kP = 512;
constexpr uint64_t kW1 = kK * kN * 4, kB1 = kN * 4, kW2 = kN * kP * 4, kB2 = kP * 4;
constexpr uint64_t kMiB = 1 << 20;

std::vector<float> random_floats(size_t n, uint32_t seed, float scale) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-scale, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = u(rng);
  return v;
}

struct Weights {
  std::vector<float> w1, b1, w2, b2;
};

Weights make_weights(uint32_t shared_seed, uint32_t own_seed) {
  return {random_floats(kK * kN, shared_seed, 1.0f / 32), random_floats(kN, shared_seed + 1, 0.5f),
          random_floats(kN * kP, own_seed, 1.0f / 45), random_floats(kP, own_seed + 1, 0.5f)};
}

std::vector<uint8_t> make_blob(const Weights& w) {
  BlobBuilder b;
  const int64_t x = b.input(DType::kFloat32, {kM, kK});
  const int64_t w1 = b.weight(DType::kFloat32, {kK, kN}, w.w1.data());
  const int64_t b1 = b.weight(DType::kFloat32, {kN}, w.b1.data());
  const int64_t w2 = b.weight(DType::kFloat32, {kN, kP}, w.w2.data());
  const int64_t b2 = b.weight(DType::kFloat32, {kP}, w.b2.data());
  const int64_t h = b.arena(DType::kFloat32, {kM, kN});
  const int64_t y = b.output(DType::kFloat32, {kM, kP});
  BlobBuilder::Matmul m1;
  m1.a = x, m1.b = w1, m1.bias = b1, m1.out = h, m1.m = kM, m1.n = kN, m1.k = kK;
  m1.epilogue = blob::Epilogue::kGeluErf;
  b.matmul(m1);
  BlobBuilder::Matmul m2;
  m2.a = h, m2.b = w2, m2.bias = b2, m2.out = y, m2.m = kM, m2.n = kP, m2.k = kN;
  b.matmul(m2);
  return b.build();
}

std::vector<double> reference(const Weights& w, const std::vector<float>& x) {
  std::vector<double> h(kM * kN), y(kM * kP);
  for (int64_t i = 0; i < kM; ++i) {
    for (int64_t j = 0; j < kN; ++j) {
      double s = w.b1[j];
      for (int64_t k = 0; k < kK; ++k) s += double(x[i * kK + k]) * w.w1[k * kN + j];
      h[i * kN + j] = 0.5 * s * (1.0 + std::erf(s / std::sqrt(2.0)));
    }
    for (int64_t j = 0; j < kP; ++j) {
      double s = w.b2[j];
      for (int64_t k = 0; k < kN; ++k) s += h[i * kN + k] * w.w2[k * kP + j];
      y[i * kP + j] = s;
    }
  }
  return y;
}

std::unique_ptr<Engine> create(const Weights& w) {
  const std::vector<uint8_t> blob = make_blob(w);
  auto engine = Engine::create(blob.data(), blob.size());
  EXPECT_TRUE(engine.ok()) << g_log;
  return engine.ok() ? std::move(engine.get()) : nullptr;
}

// Runs twice (eager, then the captured graph) and compares both with the float64 reference.
void expect_correct(Engine* engine, const Weights& w, const char* what) {
  ASSERT_NE(engine, nullptr) << what;
  const std::vector<float> x = random_floats(kM * kK, 7, 1.0f);
  const std::vector<double> want = reference(w, x);
  for (int run = 0; run < 2; ++run) {
    std::vector<float> y(kM * kP, std::nanf(""));
    const Binding in{const_cast<float*>(x.data()), x.size() * 4, false};
    const Binding out{y.data(), y.size() * 4, false};
    ASSERT_EQ(engine->execute(Span<const Binding>(&in, 1), Span<const Binding>(&out, 1)), Error::Ok)
        << what << ": " << g_log;
    double worst = 0;
    for (size_t i = 0; i < y.size(); ++i) {
      worst = std::max(worst, std::abs(y[i] - want[i]) / (1e-3 + 1e-3 * std::abs(want[i])));
    }
    EXPECT_LE(worst, 1.0) << what << ", run " << run << ": worst error / tolerance";
  }
}

size_t free_bytes() {
  size_t free = 0, total = 0;
  EXPECT_EQ(cudaMemGetInfo(&free, &total), cudaSuccess);
  return free;
}

double mib(double bytes) { return bytes / kMiB; }

class WeightCacheGpu : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(cuda_unavailable_reason().empty())
        << "weight_cache_gpu_test needs a CUDA device: " << cuda_unavailable_reason();
    // Load the kernels and the libraries once, with weights no test uses, so the device deltas
    // below measure the engines and not one-time initialisation.
    const Weights warm = make_weights(1000, 2000);
    auto engine = create(warm);
    expect_correct(engine.get(), warm, "warm-up engine");
    engine.reset();
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    before_ = device_memory_stats();
    free_before_ = free_bytes();
  }

  void TearDown() override {
    // Every engine of the test is gone: so is every byte Kiln held for it.
    const DeviceMemoryStats after = device_memory_stats();
    EXPECT_EQ(after.weight_bytes, before_.weight_bytes);
    EXPECT_EQ(after.weight_allocated_bytes, before_.weight_allocated_bytes);
    EXPECT_EQ(after.weight_tensors, before_.weight_tensors);
    EXPECT_EQ(after.weight_requested_bytes, before_.weight_requested_bytes);
    EXPECT_EQ(after.activation_bytes, before_.activation_bytes);
    const double leaked = double(free_before_) - double(free_bytes());
    std::printf("[weight cache] device memory not returned after destroying every engine: %.2f MiB\n",
                mib(leaked));
    EXPECT_LE(leaked, 4.0 * kMiB);  // allocator granularity
  }

  DeviceMemoryStats before_;
  size_t free_before_ = 0;
};

TEST_F(WeightCacheGpu, SharedTensorsAreResidentOnceAndOutliveEitherEngine) {
  const Weights wa = make_weights(1, 100);  // shared W1/b1 from seed 1, own W2/b2
  const Weights wb = make_weights(1, 200);

  auto a = create(wa);
  const DeviceMemoryStats sa = device_memory_stats();
  const size_t free_a = free_bytes();
  auto b = create(wb);
  const DeviceMemoryStats sb = device_memory_stats();
  const size_t free_b = free_bytes();

  // Kiln's totals: A uploaded all four tensors, B only its own two.
  EXPECT_EQ(sa.weight_bytes - before_.weight_bytes, kW1 + kB1 + kW2 + kB2);
  EXPECT_EQ(sa.weight_tensors - before_.weight_tensors, 4u);
  // Small tensors are packed at 256-byte offsets; large ones have their own allocation.
  EXPECT_EQ(sa.weight_allocated_bytes - before_.weight_allocated_bytes, kW1 + kW2 + kB1 + kB2);
  EXPECT_EQ(sb.weight_bytes - sa.weight_bytes, kW2 + kB2);
  EXPECT_EQ(sb.weight_tensors - sa.weight_tensors, 2u);
  EXPECT_EQ(sb.weight_requested_bytes - before_.weight_requested_bytes,
            2 * (kW1 + kB1 + kW2 + kB2));
  EXPECT_GT(sb.activation_bytes, sa.activation_bytes);

  // The device's own count: B's footprint is A's less the shared 8 MiB matrix.
  const double used_a = double(free_before_) - double(free_a);
  const double used_b = double(free_a) - double(free_b);
  std::printf("[weight cache] engine A: %.2f MiB of device memory (Kiln: weights %.2f MiB, "
              "activations %.2f MiB)\n",
              mib(used_a), mib(double(sa.weight_bytes - before_.weight_bytes)),
              mib(double(sa.activation_bytes - before_.activation_bytes)));
  std::printf("[weight cache] engine B sharing W1/b1 with A: %.2f MiB (Kiln: weights +%.2f MiB, "
              "activations +%.2f MiB)\n",
              mib(used_b), mib(double(sb.weight_bytes - sa.weight_bytes)),
              mib(double(sb.activation_bytes - sa.activation_bytes)));
  std::printf("[weight cache] both: weights resident %.2f MiB, requested by the engines %.2f MiB, "
              "saved %.2f MiB\n",
              mib(double(sb.weight_bytes - before_.weight_bytes)),
              mib(double(sb.weight_requested_bytes - before_.weight_requested_bytes)),
              mib(double(sb.weight_requested_bytes - sb.weight_bytes) -
                  double(before_.weight_requested_bytes - before_.weight_bytes)));
  EXPECT_GE(used_a, double(kW1 + kW2));
  EXPECT_LE(used_b, used_a - double(kW1) + 4.0 * kMiB);  // slack: allocator granularity
  EXPECT_GE(used_b, double(kW2));

  expect_correct(a.get(), wa, "engine A");
  expect_correct(b.get(), wb, "engine B");

  a.reset();  // B keeps W1/b1 alive
  // A's W2 is freed. A's b2 stays: it shares A's pack with b1, which B uses (the packing trade-off
  // in weight_cache.cpp, bounded by the small tensors).
  const DeviceMemoryStats sb_only = device_memory_stats();
  EXPECT_EQ(sb_only.weight_bytes - before_.weight_bytes, kW1 + kB1 + kW2 + 2 * kB2);
  EXPECT_EQ(sb_only.weight_tensors - before_.weight_tensors, 5u);
  EXPECT_EQ(sb_only.weight_requested_bytes - before_.weight_requested_bytes,
            kW1 + kB1 + kW2 + kB2);
  expect_correct(b.get(), wb, "engine B after A was destroyed");

  // A new engine with A's weights finds W1, b1 and A's b2 still resident and uploads only W2.
  auto a2 = create(wa);
  EXPECT_EQ(device_memory_stats().weight_bytes - sb_only.weight_bytes, kW2);
  expect_correct(a2.get(), wa, "engine A re-created");
  b.reset();
  a2.reset();
}

TEST_F(WeightCacheGpu, EnginesCreatedOnManyThreadsUploadSharedTensorsOnce) {
  constexpr int kThreads = 8;
  std::vector<Weights> weights;
  for (int t = 0; t < kThreads; ++t) weights.push_back(make_weights(3, 300 + 10 * t));
  std::vector<std::unique_ptr<Engine>> engines(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      const std::vector<uint8_t> blob = make_blob(weights[t]);
      auto engine = Engine::create(blob.data(), blob.size());
      if (engine.ok()) engines[t] = std::move(engine.get());
    });
  }
  for (auto& th : threads) th.join();
  const DeviceMemoryStats s = device_memory_stats();
  EXPECT_EQ(s.weight_tensors - before_.weight_tensors, 2u + 2u * kThreads);
  EXPECT_EQ(s.weight_bytes - before_.weight_bytes, kW1 + kB1 + kThreads * (kW2 + kB2));
  for (int t = 0; t < kThreads; ++t) {
    expect_correct(engines[t].get(), weights[t], "engine created on a thread");
  }
  // Destroy on threads too, in an order unrelated to creation.
  threads.clear();
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] { engines[(t * 3) % kThreads].reset(); });
  }
  for (auto& th : threads) th.join();
}

TEST_F(WeightCacheGpu, RepeatedBytesInOneBlobAreUploadedOnce) {
  // Both matmuls of this blob use a W2 whose bytes equal W1 reshaped: one resident tensor.
  Weights w = make_weights(5, 500);
  std::vector<float> same(w.w1);
  BlobBuilder b;
  const int64_t x = b.input(DType::kFloat32, {kM, kK});
  const int64_t w1 = b.weight(DType::kFloat32, {kK, kN}, w.w1.data());
  const int64_t w1_again = b.weight(DType::kFloat32, {kK, kN}, same.data());
  const int64_t h = b.arena(DType::kFloat32, {kM, kN});
  const int64_t y = b.output(DType::kFloat32, {kM, kN});
  BlobBuilder::Matmul m1;
  m1.a = x, m1.b = w1, m1.out = h, m1.m = kM, m1.n = kN, m1.k = kK;
  b.matmul(m1);
  BlobBuilder::Matmul m2 = m1;
  m2.b = w1_again, m2.out = y;
  m2.beta = 1;
  m2.bias = h;
  m2.bias_row_stride = kN;
  b.matmul(m2);  // y = x @ W1 + h = 2 (x @ W1)
  const std::vector<uint8_t> blob = b.build();
  auto engine = Engine::create(blob.data(), blob.size());
  ASSERT_TRUE(engine.ok()) << g_log;
  const DeviceMemoryStats s = device_memory_stats();
  EXPECT_EQ(s.weight_tensors - before_.weight_tensors, 1u);
  EXPECT_EQ(s.weight_bytes - before_.weight_bytes, kW1);
  EXPECT_EQ(s.weight_requested_bytes - before_.weight_requested_bytes, 2 * kW1);

  const std::vector<float> xs = random_floats(kM * kK, 9, 1.0f);
  std::vector<float> ys(kM * kN, std::nanf(""));
  const Binding in{const_cast<float*>(xs.data()), xs.size() * 4, false};
  const Binding out{ys.data(), ys.size() * 4, false};
  ASSERT_EQ((*engine)->execute(Span<const Binding>(&in, 1), Span<const Binding>(&out, 1)),
            Error::Ok)
      << g_log;
  for (int64_t i = 0; i < kM; ++i) {
    for (int64_t j = 0; j < kN; j += 97) {
      double s1 = 0;
      for (int64_t k = 0; k < kK; ++k) s1 += double(xs[i * kK + k]) * w.w1[k * kN + j];
      EXPECT_NEAR(ys[i * kN + j], 2 * s1, 2e-3 + 2e-3 * std::abs(s1)) << i << "," << j;
    }
  }
}

TEST_F(WeightCacheGpu, ViewsOfAWeightPointIntoItsMemory) {
  // W [K, N] and a view of its second half of rows [K/2, N] stored at W's offset + half: one
  // region, uploaded once, the view reading W's bytes.
  const Weights w = make_weights(7, 700);
  BlobBuilder b;
  const int64_t x = b.input(DType::kFloat32, {kM, kK / 2});
  const int64_t whole = b.weight(DType::kFloat32, {kK, kN}, w.w1.data());
  blob::TensorRecord view = b.tensors[whole];
  view.sizes[0] = kK / 2;
  view.nbytes /= 2;
  view.offset += view.nbytes;
  b.tensors.push_back(view);
  const int64_t half = static_cast<int64_t>(b.tensors.size()) - 1;
  const int64_t y = b.output(DType::kFloat32, {kM, kN});
  BlobBuilder::Matmul m;
  m.a = x, m.b = half, m.out = y, m.m = kM, m.n = kN, m.k = kK / 2;
  b.matmul(m);
  const std::vector<uint8_t> blob = b.build();
  auto engine = Engine::create(blob.data(), blob.size());
  ASSERT_TRUE(engine.ok()) << g_log;
  const DeviceMemoryStats s = device_memory_stats();
  EXPECT_EQ(s.weight_tensors - before_.weight_tensors, 1u);
  EXPECT_EQ(s.weight_bytes - before_.weight_bytes, kW1);
  EXPECT_EQ(s.weight_requested_bytes - before_.weight_requested_bytes, kW1);

  const std::vector<float> xs = random_floats(kM * kK / 2, 11, 1.0f);
  std::vector<float> ys(kM * kN, std::nanf(""));
  const Binding in{const_cast<float*>(xs.data()), xs.size() * 4, false};
  const Binding out{ys.data(), ys.size() * 4, false};
  ASSERT_EQ((*engine)->execute(Span<const Binding>(&in, 1), Span<const Binding>(&out, 1)),
            Error::Ok)
      << g_log;
  for (int64_t i = 0; i < kM; ++i) {
    for (int64_t j = 0; j < kN; j += 89) {
      double s1 = 0;
      for (int64_t k = 0; k < kK / 2; ++k) {
        s1 += double(xs[i * kK / 2 + k]) * w.w1[(kK / 2 + k) * kN + j];
      }
      EXPECT_NEAR(ys[i * kN + j], s1, 1e-3 + 1e-3 * std::abs(s1)) << i << "," << j;
    }
  }
}

}  // namespace
}  // namespace kiln::engine
