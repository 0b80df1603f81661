// Engines from different blobs executed from several threads at once, each on its own streams,
// hundreds of times, with fresh inputs every run and every output checked against a float64
// reference. One engine is used by one thread (an engine runs one execute at a time); what the
// test looks for is interference between engines: shared state in the engine, the libraries'
// handles, graph capture on one thread while another launches or synchronises. Needs a GPU
// (ctest label gpu).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
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

const auto* const kLog = ::testing::AddGlobalTestEnvironment(new testing::LogCaptureEnvironment);

std::vector<float> uniform(std::mt19937_64& rng, size_t n, float lo, float hi) {
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

template <typename T>
std::vector<uint8_t> bytes_of(const std::vector<T>& v) {
  std::vector<uint8_t> b(v.size() * sizeof(T));
  std::memcpy(b.data(), v.data(), b.size());
  return b;
}

// One kind of engine: its blob, and per run a fresh input set with the float64 answer.
struct Case {
  std::vector<std::vector<uint8_t>> inputs;
  std::vector<double> want;
};

struct Model {
  std::string name;
  std::vector<uint8_t> blob;
  std::function<Case(std::mt19937_64&)> make_case;
  double atol, rtol;
};

// relu(x @ w + bias), x [16, 32], w [32, 24]: cuBLASLt.
Model matmul_model() {
  constexpr int64_t m = 16, k = 32, n = 24;
  std::mt19937_64 rng(11);
  auto w = std::make_shared<std::vector<float>>(uniform(rng, k * n, -1, 1));
  auto bias = std::make_shared<std::vector<float>>(uniform(rng, n, -1, 1));
  BlobBuilder b;
  BlobBuilder::Matmul mm;
  mm.a = b.input(DType::kFloat32, {m, k});
  mm.b = b.weight(DType::kFloat32, {k, n}, w->data());
  mm.bias = b.weight(DType::kFloat32, {n}, bias->data());
  mm.out = b.arena(DType::kFloat32, {m, n});
  mm.m = m, mm.n = n, mm.k = k;
  b.matmul(mm);
  const int64_t y = b.output(DType::kFloat32, {m, n});
  b.unary(blob::UnaryKind::kRelu, mm.out, y);
  auto make = [w, bias](std::mt19937_64& r) {
    const std::vector<float> x = uniform(r, m * k, -1, 1);
    Case c{{bytes_of(x)}, std::vector<double>(m * n)};
    for (int64_t i = 0; i < m; ++i) {
      for (int64_t j = 0; j < n; ++j) {
        double acc = (*bias)[j];
        for (int64_t p = 0; p < k; ++p) acc += double(x[i * k + p]) * (*w)[p * n + j];
        c.want[i * n + j] = std::max(acc, 0.0);
      }
    }
    return c;
  };
  return {"matmul+relu", b.build(), make, 1e-4, 1e-4};
}

// softmax(table[indices]) over rows, indices int64 [6] into a [50, 40] table: the embedding's
// range check synchronises and reads a device flag back on every run.
Model embedding_model() {
  constexpr int64_t rows = 6, vocab = 50, dim = 40;
  std::mt19937_64 rng(12);
  auto table = std::make_shared<std::vector<float>>(uniform(rng, vocab * dim, -3, 3));
  BlobBuilder b;
  const int64_t t = b.weight(DType::kFloat32, {vocab, dim}, table->data());
  const int64_t idx = b.input(DType::kInt64, {rows});
  const int64_t gathered = b.arena(DType::kFloat32, {rows, dim});
  const int64_t y = b.output(DType::kFloat32, {rows, dim});
  b.embedding(t, idx, gathered, rows, dim, vocab);
  b.softmax(gathered, y, rows, dim, 1, false);
  auto make = [table](std::mt19937_64& r) {
    std::uniform_int_distribution<int64_t> pick(0, vocab - 1);
    std::vector<int64_t> indices(rows);
    for (int64_t& i : indices) i = pick(r);
    Case c{{bytes_of(indices)}, std::vector<double>(rows * dim)};
    for (int64_t i = 0; i < rows; ++i) {
      const float* row = table->data() + indices[i] * dim;
      const double mx = *std::max_element(row, row + dim);
      double sum = 0;
      for (int64_t j = 0; j < dim; ++j) sum += std::exp(row[j] - mx);
      for (int64_t j = 0; j < dim; ++j) c.want[i * dim + j] = std::exp(row[j] - mx) / sum;
    }
    return c;
  };
  return {"embedding+softmax", b.build(), make, 1e-6, 1e-5};
}

// conv2d 3x3, padding 1, with bias, [1, 3, 8, 8] -> [1, 4, 8, 8]: cuDNN.
Model conv_model() {
  constexpr int64_t ci = 3, co = 4, hw = 8, kk = 3;
  std::mt19937_64 rng(13);
  auto w = std::make_shared<std::vector<float>>(uniform(rng, co * ci * kk * kk, -1, 1));
  auto bias = std::make_shared<std::vector<float>>(uniform(rng, co, -1, 1));
  BlobBuilder b;
  BlobBuilder::Conv2d conv;
  conv.n = 1, conv.c_in = ci, conv.h = hw, conv.w = hw, conv.c_out = co, conv.kh = kk, conv.kw = kk;
  conv.pad_h = conv.pad_w = 1;
  conv.x = b.input(DType::kFloat32, {1, ci, hw, hw});
  conv.weight = b.weight(DType::kFloat32, {co, ci, kk, kk}, w->data());
  conv.bias = b.weight(DType::kFloat32, {co}, bias->data());
  conv.out = b.output(DType::kFloat32, {1, co, hw, hw});
  b.conv2d(conv);
  auto make = [w, bias](std::mt19937_64& r) {
    const std::vector<float> x = uniform(r, ci * hw * hw, -1, 1);
    Case c{{bytes_of(x)}, std::vector<double>(co * hw * hw)};
    for (int64_t o = 0; o < co; ++o) {
      for (int64_t y = 0; y < hw; ++y) {
        for (int64_t xx = 0; xx < hw; ++xx) {
          double acc = (*bias)[o];
          for (int64_t c_ = 0; c_ < ci; ++c_) {
            for (int64_t ky = 0; ky < kk; ++ky) {
              for (int64_t kx = 0; kx < kk; ++kx) {
                const int64_t iy = y - 1 + ky, ix = xx - 1 + kx;
                if (iy < 0 || iy >= hw || ix < 0 || ix >= hw) continue;
                acc += double(x[(c_ * hw + iy) * hw + ix]) * (*w)[((o * ci + c_) * kk + ky) * kk + kx];
              }
            }
          }
          c.want[(o * hw + y) * hw + xx] = acc;
        }
      }
    }
    return c;
  };
  return {"conv2d", b.build(), make, 2e-4, 1e-4};
}

// What one thread saw.
struct Report {
  int runs = 0;     // executes that returned Ok
  int correct = 0;  // ... and whose every output element was within tolerance
  int failures = 0;
  double max_error = 0;
  std::string first_failure;
};

// Runs `engine` `iterations` times from the calling thread, rotating through three ways of
// binding: host memory on the engine's stream, host memory on this thread's stream, and device
// memory on this thread's stream (two buffer sets in turn, so the graph is captured again).
void drive(Engine& engine, const Model& model, int iterations, uint64_t seed, Report& report) {
  auto fail = [&](const std::string& what) {
    if (report.failures++ == 0) report.first_failure = model.name + ": " + what;
  };
  std::mt19937_64 rng(seed);
  cudaStream_t stream = nullptr;
  if (cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) != cudaSuccess) {
    fail("cannot create a stream");
    return;
  }
  const size_t out_bytes = engine.output(0).nbytes;
  std::vector<void*> device(2 * (engine.num_inputs() + 1), nullptr);
  for (size_t s = 0; s < 2; ++s) {
    for (size_t i = 0; i <= engine.num_inputs(); ++i) {
      const size_t n = i < engine.num_inputs() ? engine.input(i).nbytes : out_bytes;
      if (cudaMalloc(&device[s * (engine.num_inputs() + 1) + i], n) != cudaSuccess) {
        fail("cudaMalloc failed");
      }
    }
  }
  for (int run = 0; run < iterations && report.failures < 5; ++run) {
    const Case c = model.make_case(rng);
    std::vector<float> out(out_bytes / sizeof(float), std::nanf(""));
    const int way = run % 3;
    const size_t set = (run / 3) % 2;
    std::vector<Binding> in;
    Binding o{out.data(), out_bytes, false};
    for (size_t i = 0; i < c.inputs.size(); ++i) {
      if (way == 2) {
        void* d = device[set * (engine.num_inputs() + 1) + i];
        cudaMemcpyAsync(d, c.inputs[i].data(), c.inputs[i].size(), cudaMemcpyHostToDevice, stream);
        in.push_back({d, c.inputs[i].size(), true});
      } else {
        in.push_back({const_cast<uint8_t*>(c.inputs[i].data()), c.inputs[i].size(), false});
      }
    }
    if (way == 2) {
      o = {device[set * (engine.num_inputs() + 1) + engine.num_inputs()], out_bytes, true};
      cudaMemsetAsync(o.data, 0xFF, out_bytes, stream);
    }
    const Error err = engine.execute(Span<const Binding>(in.data(), in.size()),
                                     Span<const Binding>(&o, 1), way == 0 ? nullptr : stream);
    if (err != Error::Ok) {
      fail("run " + std::to_string(run) + ": execute returned " +
           executorch::runtime::to_string(err));
      continue;
    }
    if (way == 2) {
      cudaMemcpyAsync(out.data(), o.data, out_bytes, cudaMemcpyDeviceToHost, stream);
    }
    const cudaError_t synced = cudaStreamSynchronize(stream);
    if (synced != cudaSuccess) {
      fail("run " + std::to_string(run) + ": " + cudaGetErrorName(synced));
      continue;
    }
    ++report.runs;
    bool good = true;
    for (size_t i = 0; i < c.want.size() && good; ++i) {
      const double e = std::fabs(out[i] - c.want[i]);
      report.max_error = std::max(report.max_error, std::isnan(e) ? INFINITY : e);
      if (!(e <= model.atol + model.rtol * std::fabs(c.want[i]))) {
        fail("run " + std::to_string(run) + " (way " + std::to_string(way) + ") element " +
             std::to_string(i) + ": got " + std::to_string(out[i]) + ", want " +
             std::to_string(c.want[i]));
        good = false;
      }
    }
    report.correct += good ? 1 : 0;
  }
  for (void* d : device) cudaFree(d);
  cudaStreamDestroy(stream);
}

class EngineThreads : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(cuda_unavailable_reason().empty())
        << "engine_threads_gpu_test needs a CUDA device: " << cuda_unavailable_reason();
  }

  // One engine per model, each driven by its own thread, all at once.
  void run_together(const std::vector<Model>& models, int iterations) {
    std::vector<std::unique_ptr<Engine>> engines;
    for (const Model& m : models) {
      auto e = Engine::create(m.blob.data(), m.blob.size());
      ASSERT_TRUE(e.ok()) << m.name << ": " << testing::captured_log();
      engines.push_back(std::move(e.get()));
    }
    std::vector<Report> reports(models.size());
    std::vector<std::thread> threads;
    for (size_t t = 0; t < models.size(); ++t) {
      threads.emplace_back(drive, std::ref(*engines[t]), std::cref(models[t]), iterations,
                           1000 + t, std::ref(reports[t]));
    }
    for (std::thread& t : threads) t.join();
    for (size_t t = 0; t < models.size(); ++t) {
      const Report& r = reports[t];
      std::printf("thread %zu %s: %d/%d runs correct, max abs error %.3g\n", t,
                  models[t].name.c_str(), r.correct, iterations,
                  r.max_error);
      EXPECT_EQ(r.failures, 0) << "thread " << t << ": " << r.first_failure << "\n"
                               << testing::captured_log();
      EXPECT_EQ(r.correct, iterations) << "thread " << t;
    }
  }
};

TEST_F(EngineThreads, TwoEnginesFromDifferentBlobsOnTwoThreads) {
  run_together({matmul_model(), embedding_model()}, 300);
}

TEST_F(EngineThreads, FourEnginesOfThreeKindsOnFourThreads) {
  run_together({matmul_model(), embedding_model(), conv_model(), matmul_model()}, 200);
}

// Engines created, run and destroyed on their threads while the other threads run theirs: init
// (weight upload, library handles, allocation) overlapping capture and replay elsewhere.
TEST_F(EngineThreads, EnginesCreatedAndDestroyedWhileOthersRun) {
  const std::vector<Model> models = {matmul_model(), embedding_model(), conv_model()};
  std::vector<Report> reports(models.size());
  std::vector<std::thread> threads;
  for (size_t t = 0; t < models.size(); ++t) {
    threads.emplace_back([&, t] {
      for (int round = 0; round < 5; ++round) {
        auto e = Engine::create(models[t].blob.data(), models[t].blob.size());
        if (!e.ok()) {
          if (reports[t].failures++ == 0) reports[t].first_failure = "Engine::create failed";
          return;
        }
        drive(*e.get(), models[t], 40, 2000 + 10 * t + round, reports[t]);
      }
    });
  }
  for (std::thread& t : threads) t.join();
  for (size_t t = 0; t < models.size(); ++t) {
    EXPECT_EQ(reports[t].failures, 0) << models[t].name << ": " << reports[t].first_failure
                                      << "\n" << testing::captured_log();
    EXPECT_EQ(reports[t].correct, 5 * 40) << models[t].name;
  }
}

}  // namespace
}  // namespace kiln::engine
