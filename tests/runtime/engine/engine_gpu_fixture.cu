// The engine GPU tests' shared helpers (engine_gpu_fixture.h), compiled once and linked into
// each engine_*_gpu_test binary; registers the log capture of each of those binaries.
#include "tests/runtime/engine/engine_gpu_fixture.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>

namespace kiln::engine::gpu_test {

const auto* const kLog = ::testing::AddGlobalTestEnvironment(new testing::LogCaptureEnvironment);

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

std::vector<uint8_t> HostTensor::bytes() const {
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

HostTensor HostTensor::decode(DType dtype, const Sizes& sizes, const uint8_t* data) {
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

std::mt19937_64 g_rng;

// Uniform in [lo, hi], rounded to `dtype`, never exactly zero for floating dtypes.
HostTensor random(DType dtype, const Sizes& sizes, double lo, double hi) {
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

int64_t dot(const Sizes& idx, const Sizes& strides) {
  int64_t off = 0;
  for (size_t d = 0; d < idx.size(); ++d) off += idx[d] * strides[d];
  return off;
}

namespace {

double erfinv_ref(double y) {
  double x = 0.0;  // Newton on erf(x) = y, from 0
  for (int i = 0; i < 60; ++i) x -= (std::erf(x) - y) / (2.0 / std::sqrt(kPi) * std::exp(-x * x));
  return x;
}

}  // namespace

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
    case UnaryKind::kCeil: return std::ceil(x);
    case UnaryKind::kFloor: return std::floor(x);
    case UnaryKind::kTrunc: return std::trunc(x);
    case UnaryKind::kRound: return std::nearbyint(x);  // half to even in the default mode
    case UnaryKind::kLog1p: return std::log1p(x);
    case UnaryKind::kLog2: return std::log2(x);
    case UnaryKind::kLog10: return std::log10(x);
    case UnaryKind::kElu: return p1 * (x > 0 ? x : p0 * std::expm1(x));
  }
  return 0;
}

Tol tol_for(DType dtype, double scale) {
  switch (dtype) {
    case DType::kFloat32: return {1e-5 * scale, 1e-5};
    case DType::kFloat16: return {2e-3 * scale, 2e-3};
    case DType::kBFloat16: return {1.6e-2 * scale, 1e-2};
    default: return {0.0, 0.0};
  }
}

const char* const kRunNames[3] = {"host bindings, eager", "host bindings, CUDA graph",
                                  "device bindings on a caller stream, re-captured graph"};

namespace {

std::vector<uint8_t> device_copy_back(const void* device, size_t nbytes) {
  std::vector<uint8_t> host(nbytes);
  if (nbytes > 0) {
    EXPECT_EQ(cudaMemcpy(host.data(), device, nbytes, cudaMemcpyDeviceToHost), cudaSuccess);
  }
  return host;
}

}  // namespace

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

namespace {

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
      // On the caller's stream: a plain cudaMemset runs on the legacy stream, which a
      // non-blocking stream does not wait for, and could land after the engine's writes.
      EXPECT_EQ(cudaMemsetAsync(d, 0xFF, nbytes, stream), cudaSuccess);
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

bool close(double got, double want, Tol tol) {
  if (std::isnan(want)) return std::isnan(got);
  if (std::isinf(want)) return got == want;
  return std::fabs(got - want) <= tol.atol + tol.rtol * std::fabs(want);
}

}  // namespace

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

void EngineGpu::SetUp() {
  ASSERT_TRUE(cuda_unavailable_reason().empty())
      << "the engine's GPU tests need a CUDA device: " << cuda_unavailable_reason();
  g_rng.seed(20240601);
}

}  // namespace kiln::engine::gpu_test
