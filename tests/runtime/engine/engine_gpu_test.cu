// Every op family run through Engine on a GPU and compared with a float64 reference on the CPU.
// Inputs come from a seeded generator (never all zeros), outputs are poisoned with 0xFF bytes
// first (NaN for floating dtypes), and each case runs three ways: host bindings on the first
// (eager) run, host bindings again (captured into a CUDA graph), and device bindings on a caller
// stream (new pointers, so the graph is captured again). Tolerances are stated per dtype: tight
// for fp32, looser for fp16/bf16. Needs a GPU: the `gpu` CTest label keeps it out of CPU-only CI.
#include "runtime/engine/engine.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <executorch/runtime/platform/platform.h>
#include <executorch/runtime/platform/runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "format/graph.h"
#include "tests/format/blob_builder.h"
#include "tests/format/log_capture.h"

namespace kiln::engine {
namespace {

using blob::BinaryKind;
using blob::DType;
using blob::UnaryKind;
using executorch::runtime::Error;
using executorch::runtime::Span;
using testing::BlobBuilder;
using testing::strides_of;
using Sizes = std::vector<int64_t>;

constexpr double kNan = std::numeric_limits<double>::quiet_NaN();
constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr double kPi = 3.14159265358979323846;

std::string& g_log = testing::captured_log();
const auto* const kLog = ::testing::AddGlobalTestEnvironment(new testing::LogCaptureEnvironment);

// ---------------------------------------------------------------------------------------------
// Host tensors: values kept as doubles, already rounded to the storage dtype.

double round_to(DType dtype, double v) {
  switch (dtype) {
    case DType::kFloat32: return static_cast<float>(v);
    case DType::kFloat16: return __half2float(__double2half(v));
    case DType::kBFloat16: return __bfloat162float(__double2bfloat16(v));
    case DType::kInt32: return static_cast<double>(static_cast<int32_t>(v));
    case DType::kInt64: return static_cast<double>(static_cast<int64_t>(v));
    case DType::kBool: return v != 0.0 ? 1.0 : 0.0;
  }
  return v;
}

int64_t numel(const Sizes& sizes) {
  int64_t n = 1;
  for (int64_t s : sizes) n *= s;
  return n;
}

struct HostTensor {
  DType dtype;
  Sizes sizes;
  std::vector<double> v;

  std::vector<uint8_t> bytes() const {
    const size_t es = BlobBuilder::elem_size(dtype);
    std::vector<uint8_t> out(v.size() * es);
    for (size_t i = 0; i < v.size(); ++i) {
      uint8_t* p = out.data() + i * es;
      switch (dtype) {
        case DType::kFloat32: {
          const float f = static_cast<float>(v[i]);
          std::memcpy(p, &f, es);
          break;
        }
        case DType::kFloat16: {
          const __half h = __double2half(v[i]);
          std::memcpy(p, &h, es);
          break;
        }
        case DType::kBFloat16: {
          const __nv_bfloat16 h = __double2bfloat16(v[i]);
          std::memcpy(p, &h, es);
          break;
        }
        case DType::kInt32: {
          const int32_t x = static_cast<int32_t>(v[i]);
          std::memcpy(p, &x, es);
          break;
        }
        case DType::kInt64: {
          const int64_t x = static_cast<int64_t>(v[i]);
          std::memcpy(p, &x, es);
          break;
        }
        case DType::kBool: *p = v[i] != 0.0 ? 1 : 0; break;
      }
    }
    return out;
  }

  static HostTensor decode(DType dtype, const Sizes& sizes, const uint8_t* data) {
    HostTensor t{dtype, sizes, std::vector<double>(static_cast<size_t>(numel(sizes)))};
    const size_t es = BlobBuilder::elem_size(dtype);
    for (size_t i = 0; i < t.v.size(); ++i) {
      const uint8_t* p = data + i * es;
      switch (dtype) {
        case DType::kFloat32: {
          float f;
          std::memcpy(&f, p, es);
          t.v[i] = f;
          break;
        }
        case DType::kFloat16: {
          __half h;
          std::memcpy(&h, p, es);
          t.v[i] = __half2float(h);
          break;
        }
        case DType::kBFloat16: {
          __nv_bfloat16 h;
          std::memcpy(&h, p, es);
          t.v[i] = __bfloat162float(h);
          break;
        }
        case DType::kInt32: {
          int32_t x;
          std::memcpy(&x, p, es);
          t.v[i] = x;
          break;
        }
        case DType::kInt64: {
          int64_t x;
          std::memcpy(&x, p, es);
          t.v[i] = static_cast<double>(x);
          break;
        }
        case DType::kBool:
          t.v[i] = *p;  // raw byte: anything but 0 or 1 is a bug worth seeing
          break;
      }
    }
    return t;
  }
};

std::mt19937_64 g_rng;

// Uniform in [lo, hi], rounded to `dtype`, never exactly zero for floating dtypes.
HostTensor random(DType dtype, const Sizes& sizes, double lo = -2.0, double hi = 2.0) {
  HostTensor t{dtype, sizes, std::vector<double>(static_cast<size_t>(numel(sizes)))};
  std::uniform_real_distribution<double> dist(lo, hi);
  for (double& x : t.v) {
    do {
      x = round_to(dtype, dist(g_rng));
    } while (x == 0.0 && lo < 0.0 && hi > 0.0 && dtype != DType::kBool);
  }
  return t;
}

HostTensor random_int(DType dtype, const Sizes& sizes, int64_t lo, int64_t hi) {
  HostTensor t{dtype, sizes, std::vector<double>(static_cast<size_t>(numel(sizes)))};
  std::uniform_int_distribution<int64_t> dist(lo, hi);
  for (double& x : t.v) x = static_cast<double>(dist(g_rng));
  return t;
}

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

int64_t dot(const Sizes& idx, const Sizes& strides) {
  int64_t off = 0;
  for (size_t d = 0; d < idx.size(); ++d) off += idx[d] * strides[d];
  return off;
}

// ---------------------------------------------------------------------------------------------
// Running an engine and checking its outputs.

struct Tol {
  double atol, rtol;
};

Tol tol_for(DType dtype, double scale = 1.0) {
  switch (dtype) {
    case DType::kFloat32: return {1e-5 * scale, 1e-5};
    case DType::kFloat16: return {2e-3 * scale, 2e-3};
    case DType::kBFloat16: return {1.6e-2 * scale, 1e-2};
    default: return {0.0, 0.0};
  }
}

using Outputs = std::vector<HostTensor>;
const char* const kRunNames[] = {"host bindings, eager", "host bindings, CUDA graph",
                                 "device bindings on a caller stream, re-captured graph"};

std::vector<uint8_t> device_copy_back(const void* device, size_t nbytes) {
  std::vector<uint8_t> host(nbytes);
  if (nbytes > 0) {
    EXPECT_EQ(cudaMemcpy(host.data(), device, nbytes, cudaMemcpyDeviceToHost), cudaSuccess);
  }
  return host;
}

Outputs run_host(Engine& engine, const std::vector<HostTensor>& inputs) {
  std::vector<std::vector<uint8_t>> in_bytes;
  in_bytes.reserve(inputs.size());
  std::vector<Binding> in;
  for (const HostTensor& t : inputs) {
    in_bytes.push_back(t.bytes());
    in.push_back({in_bytes.back().data(), in_bytes.back().size(), false});
  }
  std::vector<std::vector<uint8_t>> out_bytes;
  out_bytes.reserve(engine.num_outputs());
  std::vector<Binding> out;
  for (size_t o = 0; o < engine.num_outputs(); ++o) {
    out_bytes.emplace_back(engine.output(o).nbytes, uint8_t{0xFF});
    out.push_back({out_bytes.back().data(), out_bytes.back().size(), false});
  }
  const Error err = engine.execute(Span<const Binding>(in.data(), in.size()),
                                   Span<const Binding>(out.data(), out.size()));
  EXPECT_EQ(err, Error::Ok) << g_log;
  Outputs result;
  for (size_t o = 0; o < engine.num_outputs(); ++o) {
    const IoSpec spec = engine.output(o);
    result.push_back(HostTensor::decode(spec.dtype, Sizes(spec.sizes, spec.sizes + spec.rank),
                                        out_bytes[o].data()));
  }
  return result;
}

Outputs run_device(Engine& engine, const std::vector<HostTensor>& inputs) {
  cudaStream_t stream = nullptr;
  EXPECT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  std::vector<void*> buffers;
  std::vector<Binding> in;
  for (const HostTensor& t : inputs) {
    const std::vector<uint8_t> bytes = t.bytes();
    void* d = nullptr;
    if (!bytes.empty()) {
      EXPECT_EQ(cudaMalloc(&d, bytes.size()), cudaSuccess);
      EXPECT_EQ(cudaMemcpy(d, bytes.data(), bytes.size(), cudaMemcpyHostToDevice), cudaSuccess);
    }
    buffers.push_back(d);
    in.push_back({d, bytes.size(), true});
  }
  std::vector<Binding> out;
  for (size_t o = 0; o < engine.num_outputs(); ++o) {
    const size_t nbytes = engine.output(o).nbytes;
    void* d = nullptr;
    if (nbytes > 0) {
      EXPECT_EQ(cudaMalloc(&d, nbytes), cudaSuccess);
      EXPECT_EQ(cudaMemset(d, 0xFF, nbytes), cudaSuccess);
    }
    buffers.push_back(d);
    out.push_back({d, nbytes, true});
  }
  const Error err = engine.execute(Span<const Binding>(in.data(), in.size()),
                                   Span<const Binding>(out.data(), out.size()), stream);
  EXPECT_EQ(err, Error::Ok) << g_log;
  EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  Outputs result;
  for (size_t o = 0; o < engine.num_outputs(); ++o) {
    const IoSpec spec = engine.output(o);
    const std::vector<uint8_t> host = device_copy_back(out[o].data, spec.nbytes);
    result.push_back(
        HostTensor::decode(spec.dtype, Sizes(spec.sizes, spec.sizes + spec.rank), host.data()));
  }
  for (void* d : buffers) cudaFree(d);
  cudaStreamDestroy(stream);
  return result;
}

std::vector<Outputs> run_three_ways(BlobBuilder& b, const std::vector<HostTensor>& inputs) {
  const std::vector<uint8_t> blob = b.build();
  g_log.clear();
  auto engine = Engine::create(blob.data(), blob.size());
  if (!engine.ok()) {
    ADD_FAILURE() << "Engine::create failed: " << executorch::runtime::to_string(engine.error())
                  << "\n"
                  << g_log;
    return {};
  }
  std::vector<Outputs> runs;
  runs.push_back(run_host(*engine.get(), inputs));
  runs.push_back(run_host(*engine.get(), inputs));
  runs.push_back(run_device(*engine.get(), inputs));
  return runs;
}

bool close(double got, double want, Tol tol) {
  if (std::isnan(want)) return std::isnan(got);
  if (std::isinf(want)) return got == want;
  return std::fabs(got - want) <= tol.atol + tol.rtol * std::fabs(want);
}

void expect_output(const std::vector<Outputs>& runs, size_t index, const std::vector<double>& want,
                   Tol tol, const std::string& what) {
  for (size_t r = 0; r < runs.size(); ++r) {
    ASSERT_LT(index, runs[r].size()) << what;
    const HostTensor& got = runs[r][index];
    ASSERT_EQ(got.v.size(), want.size()) << what;
    int reported = 0;
    size_t bad = 0;
    for (size_t i = 0; i < want.size(); ++i) {
      if (!close(got.v[i], want[i], tol)) {
        ++bad;
        if (reported++ < 5) {
          ADD_FAILURE() << what << " [" << kRunNames[r] << "] element " << i << ": got " << got.v[i]
                        << ", want " << want[i];
        }
      }
    }
    EXPECT_EQ(bad, 0u) << what << " [" << kRunNames[r] << "]: " << bad << " of " << want.size()
                       << " elements differ";
  }
}

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
  void SetUp() override {
    ASSERT_TRUE(cuda_unavailable_reason().empty())
        << "engine_gpu_test needs a CUDA device: " << cuda_unavailable_reason();
    g_rng.seed(20240601);
  }
};

// ---------------------------------------------------------------------------------------------
// Copy.

TEST_F(EngineGpu, CopyTransposePermuteSliceExpand) {
  OneOp c;
  const HostTensor x = random(DType::kFloat32, {37, 19});
  const HostTensor p = random(DType::kFloat32, {4, 6, 8});
  const HostTensor s = random(DType::kFloat32, {10, 12});
  const HostTensor e = random(DType::kFloat32, {1, 5});
  const int64_t xi = c.add_input(x), pi = c.add_input(p), si = c.add_input(s), ei = c.add_input(e);
  const int64_t t_out = c.b.output(DType::kFloat32, {19, 37});
  const int64_t p_out = c.b.output(DType::kFloat32, {6, 4, 8});
  const int64_t s_out = c.b.output(DType::kFloat32, {4, 5});
  const int64_t e_out = c.b.output(DType::kFloat32, {3, 5});
  const int64_t cat_out = c.b.output(DType::kFloat32, {4, 10});
  c.b.copy(xi, t_out, {19, 37}, 0, {1, 19}, 0, {37, 1});         // transpose
  c.b.copy(pi, p_out, {6, 4, 8}, 0, {8, 48, 1}, 0, {32, 8, 1});  // permute, 16B words
  c.b.copy(si, s_out, {4, 5}, 3 * 12 + 2, {12, 1}, 0, {5, 1});   // s[3:7, 2:7]
  c.b.copy(ei, e_out, {3, 5}, 0, {0, 1}, 0, {5, 1});             // expand
  c.b.copy(si, cat_out, {4, 5}, 0, {12, 1}, 0, {10, 1});         // cat piece 1
  c.b.copy(si, cat_out, {4, 5}, 5 * 12, {12, 1}, 5, {10, 1});    // cat piece 2
  const auto runs = run_three_ways(c.b, c.inputs);
  std::vector<double> want_t(19 * 37), want_p(6 * 4 * 8), want_s(20), want_e(15), want_cat(40);
  for_each_index({19, 37},
                 [&](int64_t i, const Sizes& id) { want_t[i] = x.v[id[1] * 19 + id[0]]; });
  for_each_index({6, 4, 8}, [&](int64_t i, const Sizes& id) {
    want_p[i] = p.v[id[1] * 48 + id[0] * 8 + id[2]];
  });
  for_each_index({4, 5}, [&](int64_t i, const Sizes& id) {
    want_s[i] = s.v[(3 + id[0]) * 12 + 2 + id[1]];
    want_cat[id[0] * 10 + id[1]] = s.v[id[0] * 12 + id[1]];
    want_cat[id[0] * 10 + 5 + id[1]] = s.v[(5 + id[0]) * 12 + id[1]];
  });
  for_each_index({3, 5}, [&](int64_t i, const Sizes& id) { want_e[i] = e.v[id[1]]; });
  const Tol exact{0, 0};
  expect_output(runs, 0, want_t, exact, "transpose");
  expect_output(runs, 1, want_p, exact, "permute");
  expect_output(runs, 2, want_s, exact, "slice");
  expect_output(runs, 3, want_e, exact, "expand");
  expect_output(runs, 4, want_cat, exact, "cat");
}

TEST_F(EngineGpu, CopyCastsBetweenEveryDtypeFamily) {
  struct Pair {
    DType from, to;
  };
  const Pair pairs[] = {{DType::kFloat32, DType::kFloat16}, {DType::kFloat32, DType::kBFloat16},
                        {DType::kFloat16, DType::kFloat32}, {DType::kBFloat16, DType::kFloat32},
                        {DType::kFloat32, DType::kInt32},   {DType::kFloat32, DType::kInt64},
                        {DType::kInt64, DType::kFloat32},   {DType::kInt32, DType::kInt64},
                        {DType::kInt64, DType::kInt32},     {DType::kBool, DType::kFloat32},
                        {DType::kFloat32, DType::kBool},    {DType::kInt64, DType::kBool},
                        {DType::kFloat16, DType::kBFloat16}};
  for (const Pair& pair : pairs) {
    OneOp c;
    const HostTensor x = pair.from == DType::kBool ? random_int(pair.from, {33}, 0, 1)
                         : is_floating(pair.from)  ? random(pair.from, {33}, -50.0, 50.0)
                                                   : random_int(pair.from, {33}, -1000, 1000);
    const int64_t xi = c.add_input(x);
    const int64_t out = c.b.output(pair.to, {33});
    c.b.copy(xi, out, {33}, 0, {1}, 0, {1});
    const auto runs = run_three_ways(c.b, c.inputs);
    std::vector<double> want(33);
    for (size_t i = 0; i < want.size(); ++i) {
      want[i] = is_floating(pair.to)      ? round_to(pair.to, x.v[i])
                : pair.to == DType::kBool ? (x.v[i] != 0.0 ? 1.0 : 0.0)
                                          : std::trunc(x.v[i]);
    }
    expect_output(runs, 0, want, {0, 0},
                  std::string("cast ") + dtype_name(pair.from) + " -> " + dtype_name(pair.to));
  }
}

TEST_F(EngineGpu, CopyScalarEmptyAndRankEight) {
  OneOp c;
  const HostTensor scalar = random(DType::kFloat32, {});
  const HostTensor empty = random(DType::kFloat32, {0, 3});
  const Sizes big = {2, 1, 2, 1, 2, 1, 2, 3};
  const HostTensor r8 = random(DType::kFloat16, big);
  const int64_t a = c.add_input(scalar), e = c.add_input(empty), r = c.add_input(r8);
  const int64_t a_out = c.b.output(DType::kFloat32, {});
  const int64_t e_out = c.b.output(DType::kFloat32, {0, 3});
  const Sizes reversed(big.rbegin(), big.rend());
  const int64_t r_out = c.b.output(DType::kFloat16, reversed);
  c.b.copy(a, a_out, {}, 0, {}, 0, {});
  c.b.copy(e, e_out, {0, 3}, 0, {3, 1}, 0, {3, 1});
  const Sizes in_strides = strides_of(big);
  c.b.copy(r, r_out, reversed, 0, Sizes(in_strides.rbegin(), in_strides.rend()), 0,
           strides_of(reversed));
  const auto runs = run_three_ways(c.b, c.inputs);
  expect_output(runs, 0, scalar.v, {0, 0}, "rank-0 copy");
  expect_output(runs, 1, {}, {0, 0}, "empty copy");
  std::vector<double> want(static_cast<size_t>(numel(big)));
  for_each_index(reversed, [&](int64_t i, const Sizes& id) {
    want[i] = r8.v[dot(Sizes(id.rbegin(), id.rend()), in_strides)];
  });
  expect_output(runs, 2, want, {0, 0}, "rank-8 permute");
}

// ---------------------------------------------------------------------------------------------
// Binary.

double binary_ref(BinaryKind kind, double a, double b, double alpha) {
  switch (kind) {
    case BinaryKind::kAdd: return a + alpha * b;
    case BinaryKind::kSub: return a - alpha * b;
    case BinaryKind::kMul: return a * b;
    case BinaryKind::kDiv: return a / b;
    case BinaryKind::kPow: return std::pow(a, b);
    case BinaryKind::kMaximum: return std::max(a, b);
    case BinaryKind::kMinimum: return std::min(a, b);
    case BinaryKind::kEq: return a == b;
    case BinaryKind::kNe: return a != b;
    case BinaryKind::kLt: return a < b;
    case BinaryKind::kLe: return a <= b;
    case BinaryKind::kGt: return a > b;
    case BinaryKind::kGe: return a >= b;
    case BinaryKind::kLogicalAnd: return a != 0 && b != 0;
    case BinaryKind::kLogicalOr: return a != 0 || b != 0;
    case BinaryKind::kFloorDiv: {  // evaluated in fp32 like the kernel: near-integer quotients
      const float fa = static_cast<float>(a), fb = static_cast<float>(b);
      const float mod = std::fmod(fa, fb);
      float div = (fa - mod) / fb;
      if (mod != 0 && (fb < 0) != (mod < 0)) div -= 1;
      float fl = std::floor(div);
      if (div - fl > 0.5f) fl += 1;
      return fl;
    }
    case BinaryKind::kRemainder: {
      const float fa = static_cast<float>(a), fb = static_cast<float>(b);
      float mod = std::fmod(fa, fb);
      if (mod != 0 && (fb < 0) != (mod < 0)) mod += fb;
      return mod;
    }
  }
  return 0;
}

bool is_compare(BinaryKind k) { return k >= BinaryKind::kEq && k <= BinaryKind::kLogicalOr; }

TEST_F(EngineGpu, BinaryEveryKindWithBroadcast) {
  for (int k = 0; k <= static_cast<int>(BinaryKind::kRemainder); ++k) {
    const auto kind = static_cast<BinaryKind>(k);
    OneOp c;
    HostTensor a = random(DType::kFloat32, {4, 1, 5}, kind == BinaryKind::kPow ? 0.5 : -2.0, 2.0);
    HostTensor b = random(DType::kFloat32, {1, 3, 5});
    for (double& v : b.v) {
      if (std::fabs(v) < 0.25) v = 0.5;  // keep divisors away from zero
    }
    if (is_compare(kind)) {
      b.v[2] = a.v[2];  // some equal pairs
      b.v[7] = a.v[7];
    }
    const int64_t ai = c.add_input(a), bi = c.add_input(b);
    const DType out_dtype = is_compare(kind) ? DType::kBool : DType::kFloat32;
    const int64_t out = c.b.output(out_dtype, {4, 3, 5});
    const double alpha = 1.5;
    c.b.binary(kind, ai, bi, out, alpha, 0.0, {4, 3, 5}, {5, 0, 1}, {0, 5, 1});
    const auto runs = run_three_ways(c.b, c.inputs);
    std::vector<double> want(60);
    for_each_index({4, 3, 5}, [&](int64_t i, const Sizes& id) {
      want[i] = round_to(out_dtype,
                         binary_ref(kind, a.v[id[0] * 5 + id[2]], b.v[id[1] * 5 + id[2]], alpha));
    });
    expect_output(runs, 0, want, tol_for(DType::kFloat32, 10), "binary kind " + std::to_string(k));
  }
}

TEST_F(EngineGpu, BinaryHalfAndBFloat16VectorPaths) {
  for (DType dtype : {DType::kFloat16, DType::kBFloat16, DType::kFloat32}) {
    OneOp c;
    const int64_t n = 1037;  // not a multiple of any vector width
    const HostTensor a = random(dtype, {n}), b = random(dtype, {n}), one = random(dtype, {1});
    const int64_t ai = c.add_input(a), bi = c.add_input(b), oi = c.add_input(one);
    const int64_t sum = c.b.output(dtype, {n});
    const int64_t prod_uniform = c.b.output(dtype, {n});
    const int64_t max_scalar = c.b.output(dtype, {n});
    c.b.binary(BinaryKind::kAdd, ai, bi, sum, 1.0, 0.0, {n}, {1}, {1});
    c.b.binary(BinaryKind::kMul, ai, oi, prod_uniform, 1.0, 0.0, {n}, {1}, {0});
    c.b.binary(BinaryKind::kMaximum, ai, -1, max_scalar, 1.0, 0.25, {n}, {1}, {0});
    const auto runs = run_three_ways(c.b, c.inputs);
    std::vector<double> w_sum(n), w_prod(n), w_max(n);
    for (int64_t i = 0; i < n; ++i) {
      w_sum[i] = a.v[i] + b.v[i];
      w_prod[i] = a.v[i] * one.v[0];
      w_max[i] = std::max(a.v[i], 0.25);
    }
    const std::string name = dtype_name(dtype);
    expect_output(runs, 0, w_sum, tol_for(dtype, 4), name + " add");
    expect_output(runs, 1, w_prod, tol_for(dtype, 4), name + " mul by a broadcast element");
    expect_output(runs, 2, w_max, tol_for(dtype), name + " maximum with a scalar");
  }
}

int64_t py_floordiv(int64_t a, int64_t b) {
  int64_t q = a / b;
  if (a % b != 0 && ((a < 0) != (b < 0))) --q;
  return q;
}

TEST_F(EngineGpu, BinaryIntegerMathIsExact) {
  for (DType dtype : {DType::kInt64, DType::kInt32}) {
    OneOp c;
    const HostTensor a = random_int(dtype, {64}, -50, 50);
    HostTensor b = random_int(dtype, {64}, -7, 7);
    for (double& v : b.v) {
      if (v == 0) v = 3;
    }
    const HostTensor e = random_int(dtype, {64}, 0, 5);
    const int64_t ai = c.add_input(a), bi = c.add_input(b), ei = c.add_input(e);
    const BinaryKind kinds[] = {BinaryKind::kAdd,      BinaryKind::kSub,       BinaryKind::kMul,
                                BinaryKind::kFloorDiv, BinaryKind::kRemainder, BinaryKind::kMaximum,
                                BinaryKind::kMinimum,  BinaryKind::kLt,        BinaryKind::kPow};
    for (BinaryKind kind : kinds) {
      const int64_t out = c.b.output(is_compare(kind) ? DType::kBool : dtype, {64});
      c.b.binary(kind, ai, kind == BinaryKind::kPow ? ei : bi, out, 2.0, 0.0, {64}, {1}, {1});
    }
    const auto runs = run_three_ways(c.b, c.inputs);
    for (size_t k = 0; k < std::size(kinds); ++k) {
      std::vector<double> want(64);
      for (size_t i = 0; i < 64; ++i) {
        const auto x = static_cast<int64_t>(a.v[i]), y = static_cast<int64_t>(b.v[i]);
        const auto p = static_cast<int64_t>(e.v[i]);
        int64_t r = 0;
        switch (kinds[k]) {
          case BinaryKind::kAdd: r = x + 2 * y; break;
          case BinaryKind::kSub: r = x - 2 * y; break;
          case BinaryKind::kMul: r = x * y; break;
          case BinaryKind::kFloorDiv: r = py_floordiv(x, y); break;
          case BinaryKind::kRemainder: r = x - y * py_floordiv(x, y); break;
          case BinaryKind::kMaximum: r = std::max(x, y); break;
          case BinaryKind::kMinimum: r = std::min(x, y); break;
          case BinaryKind::kLt: r = x < y; break;
          case BinaryKind::kPow: {
            r = 1;
            for (int64_t j = 0; j < p; ++j) r *= x;
            break;
          }
          default: break;
        }
        want[i] = static_cast<double>(r);
      }
      expect_output(
          runs, k, want, {0, 0},
          std::string(dtype_name(dtype)) + " kind " + std::to_string(static_cast<int>(kinds[k])));
    }
  }
}

TEST_F(EngineGpu, BinaryMixedDtypesUseTheGenericPath) {
  OneOp c;
  const HostTensor a = random(DType::kFloat16, {3, 4});
  const HostTensor b = random(DType::kFloat32, {4});
  const HostTensor i = random_int(DType::kInt64, {6}, -9, 9);
  const HostTensor p = random_int(DType::kBool, {6}, 0, 1);
  const HostTensor q = random_int(DType::kBool, {6}, 0, 1);
  const int64_t ai = c.add_input(a), bi = c.add_input(b), ii = c.add_input(i);
  const int64_t pi = c.add_input(p), qi = c.add_input(q);
  const int64_t o1 = c.b.output(DType::kFloat32, {3, 4});
  const int64_t o2 = c.b.output(DType::kFloat32, {6});
  const int64_t o3 = c.b.output(DType::kBool, {6});
  c.b.binary(BinaryKind::kAdd, ai, bi, o1, 1.0, 0.0, {3, 4}, {4, 1}, {0, 1});
  c.b.binary(BinaryKind::kMul, ii, -1, o2, 1.0, 0.5, {6}, {1}, {0});
  c.b.binary(BinaryKind::kLogicalOr, pi, qi, o3, 1.0, 0.0, {6}, {1}, {1});
  const auto runs = run_three_ways(c.b, c.inputs);
  std::vector<double> w1(12), w2(6), w3(6);
  for_each_index({3, 4}, [&](int64_t k, const Sizes& id) { w1[k] = a.v[k] + b.v[id[1]]; });
  for (size_t k = 0; k < 6; ++k) {
    w2[k] = i.v[k] * 0.5;
    w3[k] = (p.v[k] != 0 || q.v[k] != 0) ? 1 : 0;
  }
  expect_output(runs, 0, w1, tol_for(DType::kFloat32), "f16 + f32 -> f32");
  expect_output(runs, 1, w2, tol_for(DType::kFloat32), "int64 * 0.5 -> f32");
  expect_output(runs, 2, w3, {0, 0}, "bool | bool");
}

// ---------------------------------------------------------------------------------------------
// Unary.

double erfinv_ref(double y) {
  double x = 0.0;  // Newton on erf(x) = y, from 0
  for (int i = 0; i < 60; ++i) x -= (std::erf(x) - y) / (2.0 / std::sqrt(kPi) * std::exp(-x * x));
  return x;
}

double unary_ref(UnaryKind kind, double x, double p0, double p1) {
  switch (kind) {
    case UnaryKind::kRelu: return std::max(x, 0.0);
    case UnaryKind::kGeluErf: return 0.5 * x * (1 + std::erf(x / std::sqrt(2.0)));
    case UnaryKind::kGeluTanh:
      return 0.5 * x * (1 + std::tanh(std::sqrt(2.0 / kPi) * (x + 0.044715 * x * x * x)));
    case UnaryKind::kSigmoid: return 1 / (1 + std::exp(-x));
    case UnaryKind::kTanh: return std::tanh(x);
    case UnaryKind::kSilu: return x / (1 + std::exp(-x));
    case UnaryKind::kExp: return std::exp(x);
    case UnaryKind::kLog: return std::log(x);
    case UnaryKind::kCos: return std::cos(x);
    case UnaryKind::kSin: return std::sin(x);
    case UnaryKind::kRsqrt: return 1 / std::sqrt(x);
    case UnaryKind::kSqrt: return std::sqrt(x);
    case UnaryKind::kNeg: return -x;
    case UnaryKind::kAbs: return std::fabs(x);
    case UnaryKind::kHardswish: return x * std::min(std::max(x + 3, 0.0), 6.0) / 6;
    case UnaryKind::kHardsigmoid: return std::min(std::max(x + 3, 0.0), 6.0) / 6;
    case UnaryKind::kClamp: return std::min(std::max(x, p0), p1);
    case UnaryKind::kLogicalNot: return x == 0;
    case UnaryKind::kErf: return std::erf(x);
    case UnaryKind::kReciprocal: return 1 / x;
    case UnaryKind::kPowScalar: return std::pow(x, p0);
    case UnaryKind::kLeakyRelu: return x > 0 ? x : p0 * x;
    case UnaryKind::kIdentity: return x;
    case UnaryKind::kErfinv: return erfinv_ref(x);
  }
  return 0;
}

struct UnaryCase {
  UnaryKind kind;
  double lo, hi, p0, p1;
};

std::vector<UnaryCase> unary_cases() {
  std::vector<UnaryCase> cases;
  for (int k = 0; k <= static_cast<int>(UnaryKind::kErfinv); ++k) {
    const auto kind = static_cast<UnaryKind>(k);
    UnaryCase u{kind, -3.0, 3.0, 0.0, 0.0};
    if (kind == UnaryKind::kLog || kind == UnaryKind::kSqrt || kind == UnaryKind::kRsqrt ||
        kind == UnaryKind::kPowScalar || kind == UnaryKind::kReciprocal) {
      u.lo = 0.2;
    }
    if (kind == UnaryKind::kErfinv) u.lo = -0.9, u.hi = 0.9;
    if (kind == UnaryKind::kClamp) u.p0 = -0.5, u.p1 = 0.7;
    if (kind == UnaryKind::kPowScalar) u.p0 = 2.5;
    if (kind == UnaryKind::kLeakyRelu) u.p0 = 0.1;
    cases.push_back(u);
  }
  return cases;
}

TEST_F(EngineGpu, UnaryEveryKind) {
  for (DType dtype : {DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
    for (const UnaryCase& u : unary_cases()) {
      OneOp c;
      const HostTensor x = random(dtype, {257}, u.lo, u.hi);
      const int64_t xi = c.add_input(x);
      const DType out_dtype = u.kind == UnaryKind::kLogicalNot ? DType::kBool : dtype;
      const int64_t out = c.b.output(out_dtype, {257});
      c.b.unary(u.kind, xi, out, u.p0, u.p1);
      const auto runs = run_three_ways(c.b, c.inputs);
      std::vector<double> want(257);
      for (size_t i = 0; i < want.size(); ++i) {
        want[i] = round_to(out_dtype, unary_ref(u.kind, x.v[i], u.p0, u.p1));
      }
      expect_output(runs, 0, want, tol_for(out_dtype, 10),
                    std::string(dtype_name(dtype)) + " unary kind " +
                        std::to_string(static_cast<int>(u.kind)));
    }
  }
}

TEST_F(EngineGpu, UnaryUnalignedOutputUsesTheScalarPath) {
  // An arena tensor two bytes off its 256-byte slot: the 16-byte path must not be taken.
  OneOp c;
  const HostTensor x = random(DType::kFloat16, {101});
  const int64_t xi = c.add_input(x);
  const int64_t mid = c.b.arena(DType::kFloat16, {101});
  c.b.tensors[mid].offset += 2;
  const int64_t out = c.b.output(DType::kFloat16, {101});
  c.b.unary(UnaryKind::kSilu, xi, mid);
  c.b.unary(UnaryKind::kIdentity, mid, out);
  const auto runs = run_three_ways(c.b, c.inputs);
  std::vector<double> want(101);
  for (size_t i = 0; i < want.size(); ++i) want[i] = unary_ref(UnaryKind::kSilu, x.v[i], 0, 0);
  expect_output(runs, 0, want, tol_for(DType::kFloat16, 4), "unaligned silu");
}

TEST_F(EngineGpu, UnaryOnIntegersStaysExact) {
  OneOp c;
  const HostTensor x = random_int(DType::kInt64, {40}, -9, 9);
  const int64_t xi = c.add_input(x);
  const UnaryKind kinds[] = {UnaryKind::kRelu,  UnaryKind::kNeg,        UnaryKind::kAbs,
                             UnaryKind::kClamp, UnaryKind::kLogicalNot, UnaryKind::kIdentity};
  const DType outs[] = {DType::kInt64, DType::kInt64, DType::kInt32,
                        DType::kInt64, DType::kBool,  DType::kFloat32};
  for (size_t k = 0; k < std::size(kinds); ++k) {
    c.b.unary(kinds[k], xi, c.b.output(outs[k], {40}), -3.5, 4.2);
  }
  const auto runs = run_three_ways(c.b, c.inputs);
  for (size_t k = 0; k < std::size(kinds); ++k) {
    std::vector<double> want(40);
    for (size_t i = 0; i < 40; ++i) {
      const double v = x.v[i];
      switch (kinds[k]) {
        case UnaryKind::kClamp: want[i] = std::min(std::max(v, -3.0), 4.0); break;
        default: want[i] = unary_ref(kinds[k], v, 0, 0); break;
      }
    }
    expect_output(runs, k, want, {0, 0}, "integer unary " + std::to_string(k));
  }
}

// ---------------------------------------------------------------------------------------------
// Where.

TEST_F(EngineGpu, WhereBroadcastsAndMixesDtypes) {
  OneOp c;
  const HostTensor cond = random_int(DType::kBool, {3, 1}, 0, 1);
  const HostTensor a = random(DType::kFloat32, {3, 4});
  const HostTensor b = random(DType::kFloat32, {1, 4});
  const HostTensor h = random(DType::kFloat16, {1, 4});
  const int64_t ci = c.add_input(cond), ai = c.add_input(a), bi = c.add_input(b),
                hi = c.add_input(h);
  const int64_t same = c.b.output(DType::kFloat32, {3, 4});
  const int64_t mixed = c.b.output(DType::kFloat32, {3, 4});
  c.b.where(ci, ai, bi, same, {3, 4}, {1, 0}, {4, 1}, {0, 1});
  c.b.where(ci, hi, ai, mixed, {3, 4}, {1, 0}, {0, 1}, {4, 1});
  const auto runs = run_three_ways(c.b, c.inputs);
  std::vector<double> w1(12), w2(12);
  for_each_index({3, 4}, [&](int64_t i, const Sizes& id) {
    const bool t = cond.v[id[0]] != 0;
    w1[i] = t ? a.v[i] : b.v[id[1]];
    w2[i] = t ? h.v[id[1]] : a.v[i];
  });
  expect_output(runs, 0, w1, {0, 0}, "where");
  expect_output(runs, 1, w2, {0, 0}, "where f16/f32");
}

// ---------------------------------------------------------------------------------------------
// Fused elementwise programs.

// out = where(cond, sigmoid(x * clamp(x + 3, 0, 6) / 6 + 0.5 * bias), x) over [2, 3, 8], bias
// [3] and cond [2, 1, 8] broadcast through strides, every step rounded to `dtype`. The same
// chain also runs unfused (one op per step, intermediates in the arena): the fused output must be
// bit-identical to it and close to a float64 host reference.
void run_fused_chain(DType dtype) {
  using Instr = BlobBuilder::Instr;
  using Form = blob::FusedForm;
  const auto k = [](auto kind) { return static_cast<int64_t>(kind); };
  OneOp c;
  const Sizes sizes = {2, 3, 8};
  const HostTensor x = random(dtype, sizes, -5, 5);
  const HostTensor bias = random(dtype, {3});
  const HostTensor cond = random_int(DType::kBool, {2, 1, 8}, 0, 1);
  const int64_t xi = c.add_input(x), bi = c.add_input(bias), ci = c.add_input(cond);
  const Sizes dense = {24, 8, 1}, bias_st = {0, 1, 0}, cond_st = {8, 0, 1}, none = {0, 0, 0};
  const int64_t fused = c.b.output(dtype, sizes);
  c.b.fused(fused, sizes, {xi, bi, ci}, {dense, bias_st, cond_st},
            {Instr{Form::kBinary, k(BinaryKind::kAdd), 0, -1, -1, 1.0, 3.0, dtype},      // r3
             Instr{Form::kUnary, k(UnaryKind::kClamp), 3, -1, -1, 0.0, 6.0, dtype},      // r4
             Instr{Form::kBinary, k(BinaryKind::kMul), 0, 4, -1, 1.0, 0.0, dtype},       // r5
             Instr{Form::kBinary, k(BinaryKind::kDiv), 5, -1, -1, 1.0, 6.0, dtype},      // r6
             Instr{Form::kBinary, k(BinaryKind::kAdd), 6, 1, -1, 0.5, 0.0, dtype},       // r7
             Instr{Form::kUnary, k(UnaryKind::kSigmoid), 7, -1, -1, 0.0, 0.0, dtype},    // r8
             Instr{Form::kWhere, 0, 2, 8, 0, 0.0, 0.0, dtype}});                         // r9
  int64_t t[7];
  for (int64_t& id : t) id = c.b.arena(dtype, sizes);
  c.b.binary(BinaryKind::kAdd, xi, -1, t[0], 1.0, 3.0, sizes, dense, none);
  c.b.unary(UnaryKind::kClamp, t[0], t[1], 0.0, 6.0);
  c.b.binary(BinaryKind::kMul, xi, t[1], t[2], 1.0, 0.0, sizes, dense, dense);
  c.b.binary(BinaryKind::kDiv, t[2], -1, t[3], 1.0, 6.0, sizes, dense, none);
  c.b.binary(BinaryKind::kAdd, t[3], bi, t[4], 0.5, 0.0, sizes, dense, bias_st);
  c.b.unary(UnaryKind::kSigmoid, t[4], t[5]);
  const int64_t unfused = c.b.output(dtype, sizes);
  c.b.where(ci, t[5], xi, unfused, sizes, cond_st, dense, dense);
  const auto runs = run_three_ways(c.b, c.inputs);
  std::vector<double> want(2 * 3 * 8);
  for_each_index(sizes, [&](int64_t i, const Sizes& id) {
    const auto r = [&](double v) { return round_to(dtype, v); };
    const double xv = x.v[i];
    double v = r(std::min(std::max(r(xv + 3.0), 0.0), 6.0));
    v = r(r(xv * v) / 6.0);
    v = r(v + 0.5 * bias.v[id[1]]);
    v = r(1.0 / (1.0 + std::exp(-v)));
    want[i] = cond.v[id[0] * 8 + id[2]] != 0 ? v : xv;
  });
  const std::string name = dtype == DType::kFloat32 ? "fp32" : "bf16";
  expect_output(runs, 0, want, tol_for(dtype, 2), "fused chain " + name);
  for (size_t r = 0; r < runs.size(); ++r) {
    ASSERT_EQ(runs[r].size(), 2u);
    const std::vector<uint8_t> a = runs[r][0].bytes(), b = runs[r][1].bytes();
    EXPECT_EQ(a, b) << "fused and unfused " << name << " differ [" << kRunNames[r] << "]";
  }
}

TEST_F(EngineGpu, FusedElementwiseFp32MatchesTheUnfusedChain) { run_fused_chain(DType::kFloat32); }

TEST_F(EngineGpu, FusedElementwiseBf16MatchesTheUnfusedChain) {
  run_fused_chain(DType::kBFloat16);
}

TEST_F(EngineGpu, FusedElementwiseMixedInputDtypesAndRank0) {
  // fp16 and fp32 inputs into an fp32 output; then a one-element (rank 0) program.
  using Instr = BlobBuilder::Instr;
  using Form = blob::FusedForm;
  OneOp c;
  const HostTensor h = random(DType::kFloat16, {5, 7});
  const HostTensor f = random(DType::kFloat32, {7, 5});  // read transposed
  const HostTensor s = random(DType::kFloat32, {1});
  const int64_t hi = c.add_input(h), fi = c.add_input(f), si = c.add_input(s);
  const int64_t out = c.b.output(DType::kFloat32, {5, 7});
  c.b.fused(out, {5, 7}, {hi, fi}, {{7, 1}, {1, 5}},
            {Instr{Form::kBinary, static_cast<int64_t>(BinaryKind::kMaximum), 0, 1},
             Instr{Form::kUnary, static_cast<int64_t>(UnaryKind::kTanh), 2}});
  const int64_t one = c.b.output(DType::kFloat32, {1});
  c.b.fused(one, {}, {si}, {{}},
            {Instr{Form::kUnary, static_cast<int64_t>(UnaryKind::kExp), 0},
             Instr{Form::kBinary, static_cast<int64_t>(BinaryKind::kSub), 1, -1, -1, 1.0, 1.0}});
  const auto runs = run_three_ways(c.b, c.inputs);
  std::vector<double> want(35);
  for_each_index({5, 7}, [&](int64_t i, const Sizes& id) {
    want[i] = std::tanh(std::max(h.v[i], f.v[id[1] * 5 + id[0]]));
  });
  expect_output(runs, 0, want, tol_for(DType::kFloat32), "fused max/tanh, mixed dtypes");
  expect_output(runs, 1, {std::exp(s.v[0]) - 1.0}, tol_for(DType::kFloat32), "fused rank 0");
}

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
        v = mc.epilogue == blob::Epilogue::kNone ? v
            : mc.epilogue == blob::Epilogue::kRelu
                ? std::max(v, 0.0)
                : unary_ref(mc.epilogue == blob::Epilogue::kGeluErf ? UnaryKind::kGeluErf
                                                                    : UnaryKind::kGeluTanh,
                            v, 0, 0);
        want[(g * mc.m + i) * mc.n + j] = v;
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

struct ConvCase {
  int64_t n, c_in, h, w, c_out, kh, kw;
  int64_t stride = 1, pad_h = 0, pad_w = 0, dil = 1, groups = 1;
  bool bias = true;
};

void run_conv(const ConvCase& cc, DType dtype, const std::string& name) {
  OneOp c;
  BlobBuilder::Conv2d conv;
  conv.n = cc.n, conv.c_in = cc.c_in, conv.h = cc.h, conv.w = cc.w, conv.c_out = cc.c_out;
  conv.kh = cc.kh, conv.kw = cc.kw, conv.stride_h = conv.stride_w = cc.stride;
  conv.pad_h = cc.pad_h, conv.pad_w = cc.pad_w, conv.dil_h = conv.dil_w = cc.dil;
  conv.groups = cc.groups;
  const int64_t cig = cc.c_in / cc.groups, cog = cc.c_out / cc.groups;
  const HostTensor x = random(dtype, {cc.n, cc.c_in, cc.h, cc.w}, -1.0, 1.0);
  const HostTensor wt = random(dtype, {cc.c_out, cig, cc.kh, cc.kw}, -1.0, 1.0);
  const HostTensor bias = random(dtype, {cc.c_out}, -1.0, 1.0);
  conv.x = c.add_input(x);
  const std::vector<uint8_t> w_bytes = wt.bytes(), b_bytes = bias.bytes();
  conv.weight = c.b.weight(dtype, wt.sizes, w_bytes.data());
  if (cc.bias) conv.bias = c.b.weight(dtype, bias.sizes, b_bytes.data());
  const int64_t ho = conv.h_out(), wo = conv.w_out();
  conv.out = c.b.output(dtype, {cc.n, cc.c_out, ho, wo});
  c.b.conv2d(conv);
  const auto runs = run_three_ways(c.b, c.inputs);
  std::vector<double> want(static_cast<size_t>(cc.n * cc.c_out * ho * wo));
  for_each_index({cc.n, cc.c_out, ho, wo}, [&](int64_t i, const Sizes& id) {
    const int64_t g = id[1] / cog;
    double acc = cc.bias ? bias.v[id[1]] : 0.0;
    for (int64_t ci = 0; ci < cig; ++ci) {
      for (int64_t ky = 0; ky < cc.kh; ++ky) {
        for (int64_t kx = 0; kx < cc.kw; ++kx) {
          const int64_t iy = id[2] * cc.stride - cc.pad_h + ky * cc.dil;
          const int64_t ix = id[3] * cc.stride - cc.pad_w + kx * cc.dil;
          if (iy < 0 || iy >= cc.h || ix < 0 || ix >= cc.w) continue;
          acc += x.v[((id[0] * cc.c_in + g * cig + ci) * cc.h + iy) * cc.w + ix] *
                 wt.v[((id[1] * cig + ci) * cc.kh + ky) * cc.kw + kx];
        }
      }
    }
    want[i] = acc;
  });
  expect_output(runs, 0, want, tol_for(dtype, std::sqrt(double(cig * cc.kh * cc.kw)) * 4), name);
}

TEST_F(EngineGpu, Conv2dStridedDilatedGroupedDepthwise) {
  const std::pair<ConvCase, const char*> cases[] = {
      {{1, 3, 9, 9, 4, 3, 3, 1, 1, 1, 1, 1, true}, "3x3 pad 1"},
      {{2, 3, 11, 10, 5, 3, 3, 2, 1, 1, 1, 1, true}, "stride 2, N 2"},
      {{1, 2, 12, 12, 3, 3, 3, 1, 2, 2, 2, 1, false}, "dilation 2"},
      {{1, 4, 8, 8, 4, 3, 3, 1, 1, 1, 1, 4, true}, "depthwise"},
      {{1, 4, 7, 7, 6, 3, 3, 1, 0, 0, 1, 2, true}, "groups 2"},
      {{1, 8, 5, 5, 3, 1, 1, 1, 0, 0, 1, 1, true}, "1x1"},
      {{1, 2, 6, 7, 2, 3, 1, 1, 1, 0, 1, 1, true}, "3x1 kernel, pad (1, 0)"},
  };
  for (const auto& [cc, name] : cases) {
    run_conv(cc, DType::kFloat32, std::string("f32 ") + name);
  }
  run_conv(cases[0].first, DType::kFloat16, "f16 3x3 pad 1");
  run_conv(cases[3].first, DType::kBFloat16, "bf16 depthwise");
}

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

void run_pool(BlobBuilder::Pool2d p, DType dtype, const std::string& name) {
  OneOp c;
  const HostTensor x = random(dtype, {p.n, p.c, p.h, p.w});
  p.x = c.add_input(x);
  const int64_t ho = p.h_out(), wo = p.w_out();
  p.out = c.b.output(dtype, {p.n, p.c, ho, wo});
  c.b.pool2d(p);
  const auto runs = run_three_ways(c.b, c.inputs);
  std::vector<double> want(static_cast<size_t>(p.n * p.c * ho * wo));
  for_each_index({p.n * p.c, ho, wo}, [&](int64_t i, const Sizes& id) {
    const double* plane = x.v.data() + id[0] * p.h * p.w;
    if (p.kind == blob::PoolKind::kMax) {
      double best = -kInf;
      for (int64_t ky = 0; ky < p.kh; ++ky) {
        for (int64_t kx = 0; kx < p.kw; ++kx) {
          const int64_t iy = id[1] * p.stride_h - p.pad_h + ky * p.dil_h;
          const int64_t ix = id[2] * p.stride_w - p.pad_w + kx * p.dil_w;
          if (iy >= 0 && iy < p.h && ix >= 0 && ix < p.w)
            best = std::max(best, plane[iy * p.w + ix]);
        }
      }
      want[i] = best;
    } else {
      int64_t h0 = id[1] * p.stride_h - p.pad_h, w0 = id[2] * p.stride_w - p.pad_w;
      int64_t h1 = std::min(h0 + p.kh, p.h + p.pad_h), w1 = std::min(w0 + p.kw, p.w + p.pad_w);
      const int64_t padded = (h1 - h0) * (w1 - w0);
      h0 = std::max<int64_t>(h0, 0), w0 = std::max<int64_t>(w0, 0);
      h1 = std::min(h1, p.h), w1 = std::min(w1, p.w);
      double sum = 0;
      for (int64_t iy = h0; iy < h1; ++iy)
        for (int64_t ix = w0; ix < w1; ++ix) sum += plane[iy * p.w + ix];
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
  }
}

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
    for (int64_t cols : {16, 3000, 1}) {
      for (bool affine : {true, false}) {
        OneOp c;
        const int64_t rows = 5;
        const HostTensor x = random(dtype, {rows, cols}, -3.0, 5.0);
        const HostTensor w = random(DType::kFloat32, {cols});
        const HostTensor bias = random(dtype, {cols});
        const int64_t xi = c.add_input(x);
        const std::vector<uint8_t> wb = w.bytes(), bb = bias.bytes();
        const int64_t wi = affine ? c.b.weight(DType::kFloat32, {cols}, wb.data()) : -1;
        const int64_t bi = affine ? c.b.weight(dtype, {cols}, bb.data()) : -1;
        const int64_t out = c.b.output(dtype, {rows, cols});
        c.b.layer_norm(xi, wi, bi, out, rows, cols, 1e-5);
        const auto runs = run_three_ways(c.b, c.inputs);
        std::vector<double> want(x.v.size());
        for (int64_t r = 0; r < rows; ++r) {
          double mean = 0, var = 0;
          for (int64_t k = 0; k < cols; ++k) mean += x.v[r * cols + k];
          mean /= static_cast<double>(cols);
          for (int64_t k = 0; k < cols; ++k) var += std::pow(x.v[r * cols + k] - mean, 2);
          var /= static_cast<double>(cols);
          for (int64_t k = 0; k < cols; ++k) {
            double y = (x.v[r * cols + k] - mean) / std::sqrt(var + 1e-5);
            if (affine) y = y * w.v[k] + bias.v[k];
            want[r * cols + k] = y;
          }
        }
        expect_output(runs, 0, want, tol_for(dtype, 20),
                      std::string(dtype_name(dtype)) + " layer_norm cols " + std::to_string(cols) +
                          (affine ? " affine" : ""));
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
  for (const Case& rc : {Case{3, 50, 1}, Case{2, 40, 6}, Case{2, 5000, 1}, Case{4, 1, 3}}) {
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

// ---------------------------------------------------------------------------------------------
// Embedding and fill.

TEST_F(EngineGpu, EmbeddingGathersRows) {
  for (DType index_dtype : {DType::kInt64, DType::kInt32}) {
    for (DType dtype : {DType::kFloat32, DType::kFloat16}) {
      for (int64_t dim : {8, 3}) {  // 8 fp32 = 32-byte rows (16-byte words); 3 = element moves
        OneOp c;
        const int64_t vocab = 10;
        const HostTensor table = random(dtype, {vocab, dim});
        const std::vector<uint8_t> tb = table.bytes();
        const int64_t wi = c.b.weight(dtype, {vocab, dim}, tb.data());
        const HostTensor idx = random_int(index_dtype, {6}, 0, vocab - 1);
        const int64_t ii = c.add_input(idx);
        const int64_t out = c.b.output(dtype, {6, dim});
        c.b.embedding(wi, ii, out, 6, dim, vocab);
        const auto runs = run_three_ways(c.b, c.inputs);
        std::vector<double> want(static_cast<size_t>(6 * dim));
        for (int64_t r = 0; r < 6; ++r)
          for (int64_t k = 0; k < dim; ++k)
            want[r * dim + k] = table.v[static_cast<int64_t>(idx.v[r]) * dim + k];
        expect_output(runs, 0, want, {0, 0}, "embedding");
      }
    }
  }
}

TEST_F(EngineGpu, EmbeddingIndexOutOfRangeIsReportedAndTheEngineRecovers) {
  BlobBuilder b;
  const HostTensor table = random(DType::kFloat32, {10, 4});
  const std::vector<uint8_t> tb = table.bytes();
  const int64_t wi = b.weight(DType::kFloat32, {10, 4}, tb.data());
  const int64_t ii = b.input(DType::kInt64, {3});
  const int64_t out = b.output(DType::kFloat32, {3, 4});
  b.embedding(wi, ii, out, 3, 4, 10);
  const std::vector<uint8_t> blob = b.build();
  auto engine = Engine::create(blob.data(), blob.size());
  ASSERT_TRUE(engine.ok()) << g_log;
  for (int round = 0; round < 3;
       ++round) {  // eager, then graph replays: the flag is reset each run
    for (int64_t bad : {int64_t{10}, int64_t{-1}}) {
      const int64_t indices[3] = {1, bad, 2};
      std::vector<float> result(12, -7.0f);
      const Binding in{const_cast<int64_t*>(indices), sizeof(indices), false};
      const Binding o{result.data(), result.size() * sizeof(float), false};
      g_log.clear();
      EXPECT_EQ((*engine)->execute(Span<const Binding>(&in, 1), Span<const Binding>(&o, 1)),
                Error::InvalidArgument);
      EXPECT_NE(g_log.find("embedding index out of range"), std::string::npos) << g_log;
      EXPECT_NE(g_log.find("index " + std::to_string(bad) + " at position 1"), std::string::npos)
          << g_log;
      const int64_t good[3] = {9, 0, 4};
      const Binding gin{const_cast<int64_t*>(good), sizeof(good), false};
      ASSERT_EQ((*engine)->execute(Span<const Binding>(&gin, 1), Span<const Binding>(&o, 1)),
                Error::Ok)
          << g_log;
      for (int r = 0; r < 3; ++r)
        for (int k = 0; k < 4; ++k)
          EXPECT_EQ(result[r * 4 + k], static_cast<float>(table.v[good[r] * 4 + k]));
    }
  }
}

TEST_F(EngineGpu, FillEveryDtype) {
  struct Case {
    DType dtype;
    int64_t n;
    double value;
  };
  const Case cases[] = {{DType::kFloat32, 1000, 1.5}, {DType::kFloat32, 13, 0.0},
                        {DType::kInt64, 7, -3.0},     {DType::kInt32, 9, 123456.0},
                        {DType::kBool, 5, 1.0},       {DType::kFloat16, 33, 0.1},
                        {DType::kBFloat16, 64, -2.5}};
  OneOp c;
  for (const Case& fc : cases) c.b.fill(c.b.output(fc.dtype, {fc.n}), fc.value);
  const auto runs = run_three_ways(c.b, c.inputs);
  for (size_t k = 0; k < std::size(cases); ++k) {
    expect_output(runs, k,
                  std::vector<double>(static_cast<size_t>(cases[k].n),
                                      round_to(cases[k].dtype, cases[k].value)),
                  {0, 0}, std::string("fill ") + dtype_name(cases[k].dtype));
  }
}

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
}  // namespace kiln::engine
