// What the engine's GPU tests share (one binary per op family: engine_copy_gpu_test,
// engine_elementwise_gpu_test, engine_matmul_conv_gpu_test, engine_reduce_gpu_test and
// engine_executor_gpu_test, all from engine_gpu_fixture.cu plus their own file): every op family
// runs through Engine on a GPU and is compared with a float64 reference on the CPU.
// Inputs come from a seeded generator (never all zeros), outputs are poisoned with 0xFF bytes
// first (NaN for floating dtypes), and each case runs three ways: host bindings on the first
// (eager) run, host bindings again (captured into a CUDA graph), and device bindings on a caller
// stream (new pointers, so the graph is captured again). Tolerances are stated per dtype: tight
// for fp32, looser for fp16/bf16. Needs a GPU: the `gpu` CTest label keeps it out of CPU-only CI.
#pragma once

#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "runtime/engine/engine.h"
#include "format/graph.h"
#include "tests/format/blob_builder.h"
#include "tests/format/log_capture.h"

namespace kiln::engine::gpu_test {

using blob::BinaryKind;
using blob::DType;
using blob::UnaryKind;
using executorch::runtime::Error;
using executorch::runtime::Span;
using testing::BlobBuilder;
using testing::strides_of;
using Sizes = std::vector<int64_t>;

inline constexpr double kNan = std::numeric_limits<double>::quiet_NaN();
inline constexpr double kInf = std::numeric_limits<double>::infinity();
inline constexpr double kPi = 3.14159265358979323846;

// ExecuTorch's log since the test cleared it (engine_gpu_fixture.cu registers the capture).
inline std::string& g_log = testing::captured_log();

// ---------------------------------------------------------------------------------------------
// Host tensors: values kept as doubles, already rounded to the storage dtype.

double round_to(DType dtype, double v);

int64_t numel(const Sizes& sizes);

struct HostTensor {
  DType dtype;
  Sizes sizes;
  std::vector<double> v;

  std::vector<uint8_t> bytes() const;
  static HostTensor decode(DType dtype, const Sizes& sizes, const uint8_t* data);
};

// Seeded by EngineGpu::SetUp, so every test draws the same values however the tests are run.
extern std::mt19937_64 g_rng;

// Uniform in [lo, hi], rounded to `dtype`, never exactly zero for floating dtypes.
HostTensor random(DType dtype, const Sizes& sizes, double lo = -2.0, double hi = 2.0);

HostTensor random_int(DType dtype, const Sizes& sizes, int64_t lo, int64_t hi);

// Calls f(linear, index) for every index of `sizes` in row-major order.
template <typename F>
void for_each_index(const Sizes& sizes, F f) {
  const int64_t n = numel(sizes);
  Sizes idx(sizes.size(), 0);
  for (int64_t i = 0; i < n; ++i) {
    f(i, idx);
    for (size_t d = sizes.size(); d-- > 0;) {
      if (++idx[d] < sizes[d]) break;
      idx[d] = 0;
    }
  }
}

int64_t dot(const Sizes& idx, const Sizes& strides);

// The float64 reference of a unary kind (p0, p1: its scalar parameters), also the matmul
// epilogues' activations.
double unary_ref(UnaryKind kind, double x, double p0, double p1);

// ---------------------------------------------------------------------------------------------
// Running an engine and checking its outputs.

struct Tol {
  double atol, rtol;
};

Tol tol_for(DType dtype, double scale = 1.0);

using Outputs = std::vector<HostTensor>;

/// What each of run_three_ways' runs is called in failure messages, in their order.
extern const char* const kRunNames[3];

/// One execute with host bindings (outputs poisoned with 0xFF first); the outputs decoded.
Outputs run_host(Engine& engine, const std::vector<HostTensor>& inputs);

/// Builds the blob, creates an engine and runs it the three ways (see the top); empty, with a
/// failure recorded, when the engine cannot be created.
std::vector<Outputs> run_three_ways(BlobBuilder& b, const std::vector<HostTensor>& inputs);

/// Output `index` of every run matches `want` within `tol` (NaN matches NaN, inf matches inf).
void expect_output(const std::vector<Outputs>& runs, size_t index, const std::vector<double>& want,
                   Tol tol, const std::string& what);

// One-op blob: inputs by id, single output.
struct OneOp {
  BlobBuilder b;
  std::vector<HostTensor> inputs;
  int64_t add_input(const HostTensor& t) {
    inputs.push_back(t);
    return b.input(t.dtype, t.sizes);
  }
};

class EngineGpu : public ::testing::Test {
 protected:
  void SetUp() override;
};

}  // namespace kiln::engine::gpu_test
