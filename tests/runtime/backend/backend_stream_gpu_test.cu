// KilnBackend on the caller's CUDA stream (kiln/executorch/stream.h), with device-resident
// bindings: work the caller enqueued before execute (a long spin kernel, then the copies that
// write the inputs) is observed by Kiln; execute returns while that work is still running; the
// outputs are right once the caller synchronises its stream. Without a caller stream, execute
// returns after the work is done. Needs a CUDA device (ctest label gpu).

#include <executorch/extension/memory_allocator/malloc_memory_allocator.h>
#include <executorch/runtime/backend/interface.h>
#include <executorch/runtime/core/freeable_buffer.h>
#include <executorch/runtime/platform/runtime.h>

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <memory>
#include <thread>
#include <vector>

#include "kiln/executorch/stream.h"
#include "tests/format/blob_builder.h"
#include "tests/format/log_capture.h"

namespace kiln::engine {
namespace {

namespace et = executorch::runtime;
using executorch::aten::ScalarType;
using executorch::aten::Tensor;
using executorch::aten::TensorImpl;
using testing::BlobBuilder;

const auto* const kLog = ::testing::AddGlobalTestEnvironment(new testing::LogCaptureEnvironment);

constexpr int64_t kRows = 512, kCols = 1024, kN = kRows * kCols;

// Busy-waits on the device for `ns` nanoseconds (the global timer, so clock rates do not matter).
__global__ void spin(unsigned long long ns) {
  unsigned long long start = 0, now = 0;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  do {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  } while (now - start < ns);
}

// A device buffer of kN floats wrapped as an ExecuTorch tensor argument.
struct DeviceArg {
  float* data = nullptr;
  std::vector<TensorImpl::SizesType> sizes{kRows, kCols};
  std::vector<TensorImpl::DimOrderType> order{0, 1};
  std::unique_ptr<TensorImpl> impl;
  et::EValue value;
  DeviceArg() {
    EXPECT_EQ(cudaMalloc(&data, kN * sizeof(float)), cudaSuccess);
    EXPECT_EQ(cudaMemset(data, 0, kN * sizeof(float)), cudaSuccess);
    impl = std::make_unique<TensorImpl>(ScalarType::Float, 2, sizes.data(), data, order.data());
    value = et::EValue(Tensor(impl.get()));
  }
  ~DeviceArg() { cudaFree(data); }
};

class BackendStream : public ::testing::Test {
 public:
  void SetUp() override {
    backend_ = et::get_backend_class("KilnBackend");
    ASSERT_NE(backend_, nullptr) << "libkiln_executorch_backend.so is not linked";
    ASSERT_TRUE(backend_->is_available()) << "needs a CUDA device: " << testing::captured_log();
    BlobBuilder b;  // out = x + y
    const int64_t x = b.input(blob::DType::kFloat32, {kRows, kCols});
    const int64_t y = b.input(blob::DType::kFloat32, {kRows, kCols});
    const int64_t out = b.output(blob::DType::kFloat32, {kRows, kCols});
    b.binary(blob::BinaryKind::kAdd, x, y, out, 1.0, 0.0, {kN}, {1}, {1});
    blob_ = b.build();
    et::FreeableBuffer buffer(blob_.data(), blob_.size(), nullptr);
    et::BackendInitContext context(&allocator_);
    auto h = backend_->init(context, &buffer, {});
    ASSERT_TRUE(h.ok()) << testing::captured_log();
    handle_ = h.get();
    ASSERT_EQ(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), cudaSuccess);
    ASSERT_EQ(cudaMallocHost(&host_x_, kN * sizeof(float)), cudaSuccess);
    ASSERT_EQ(cudaMallocHost(&host_y_, kN * sizeof(float)), cudaSuccess);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  }
  void TearDown() override {
    if (handle_ != nullptr) backend_->destroy(handle_);
    cudaStreamDestroy(stream_);
    cudaFreeHost(host_x_);
    cudaFreeHost(host_y_);
  }
  et::Error execute() {
    std::vector<et::EValue*> args{&x_.value, &y_.value, &out_.value};
    et::BackendExecutionContext context;
    return backend_->execute(context, handle_, {args.data(), args.size()});
  }
  // What the caller's stream does before execute: a long kernel, then the inputs are written.
  void produce_inputs_late(float xv, float yv) {
    for (int64_t i = 0; i < kN; ++i) {
      host_x_[i] = xv + static_cast<float>(i % 7);
      host_y_[i] = yv;
    }
    spin<<<1, 1, 0, stream_>>>(300ull * 1000 * 1000);  // 300 ms
    ASSERT_EQ(cudaGetLastError(), cudaSuccess);
    ASSERT_EQ(cudaMemcpyAsync(x_.data, host_x_, kN * sizeof(float), cudaMemcpyHostToDevice, stream_),
              cudaSuccess);
    ASSERT_EQ(cudaMemcpyAsync(y_.data, host_y_, kN * sizeof(float), cudaMemcpyHostToDevice, stream_),
              cudaSuccess);
  }
  void expect_sum(float xv, float yv, cudaStream_t read_on) {
    std::vector<float> got(kN);
    ASSERT_EQ(cudaMemcpyAsync(got.data(), out_.data, kN * sizeof(float), cudaMemcpyDeviceToHost,
                              read_on), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(read_on), cudaSuccess);
    for (int64_t i = 0; i < kN; ++i) {
      ASSERT_EQ(got[i], xv + static_cast<float>(i % 7) + yv) << "element " << i;
    }
  }

  et::BackendInterface* backend_ = nullptr;
  executorch::extension::MallocMemoryAllocator allocator_;
  std::vector<uint8_t> blob_;
  et::DelegateHandle* handle_ = nullptr;
  cudaStream_t stream_ = nullptr;
  float* host_x_ = nullptr;
  float* host_y_ = nullptr;
  DeviceArg x_, y_, out_;
};

TEST_F(BackendStream, CallerStreamOrdersInputsAndExecuteReturnsBeforeTheGpuIsDone) {
  // The first run is eager and may wait while CUDA loads Kiln's kernels (lazy module loading
  // blocks until the device is idle); the second captures the engine's CUDA graph and the rest
  // replay it. From the second run on, execute must only enqueue.
  int run = 0;
  for (float base : {1.0f, 10.0f, 100.0f, 1000.0f}) {
    produce_inputs_late(base, 2.0f * base);
    cudaEvent_t after = nullptr;
    ASSERT_EQ(cudaEventCreateWithFlags(&after, cudaEventDisableTiming), cudaSuccess);
    {
      ScopedStream on(stream_);
      ASSERT_EQ(kiln_executorch_current_stream(), stream_);
      ASSERT_EQ(execute(), et::Error::Ok) << testing::captured_log();
      ASSERT_EQ(cudaEventRecord(after, stream_), cudaSuccess);
      // The spin kernel is still running: execute only enqueued Kiln's work behind it.
      const cudaError_t busy = cudaStreamQuery(stream_);
      std::printf("run %d: the caller's stream was %s when execute returned\n", run,
                  busy == cudaErrorNotReady ? "still busy" : "idle");
      if (run > 0) {
        EXPECT_EQ(busy, cudaErrorNotReady) << "run " << run;
        EXPECT_EQ(cudaEventQuery(after), cudaErrorNotReady) << "run " << run;
      }
    }
    ++run;
    EXPECT_EQ(kiln_executorch_current_stream(), nullptr);
    ASSERT_EQ(cudaEventSynchronize(after), cudaSuccess);  // the documented way to wait
    ASSERT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
    expect_sum(base, 2.0f * base, stream_);
    cudaEventDestroy(after);
  }
}

TEST_F(BackendStream, WithoutACallerStreamExecuteReturnsAfterTheWork) {
  std::vector<float> hx(kN), hy(kN, 5.0f);
  for (int64_t i = 0; i < kN; ++i) hx[i] = 3.0f + static_cast<float>(i % 7);
  ASSERT_EQ(cudaMemcpy(x_.data, hx.data(), kN * sizeof(float), cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(y_.data, hy.data(), kN * sizeof(float), cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  ASSERT_EQ(kiln_executorch_current_stream(), nullptr);
  for (int run = 0; run < 2; ++run) {
    ASSERT_EQ(execute(), et::Error::Ok) << testing::captured_log();
    // Read on an unrelated non-blocking stream: nothing orders it after Kiln's own stream, so the
    // values are right only because execute had finished.
    expect_sum(3.0f, 5.0f, stream_);
  }
}

TEST_F(BackendStream, StreamIsPerThreadAndGuardsNest) {
  cudaStream_t other = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&other, cudaStreamNonBlocking), cudaSuccess);
  {
    ScopedStream outer(stream_);
    {
      ScopedStream inner(other);
      EXPECT_EQ(kiln_executorch_current_stream(), other);
    }
    EXPECT_EQ(kiln_executorch_current_stream(), stream_);
    CUstream_st* seen = stream_;
    std::thread([&] { seen = kiln_executorch_current_stream(); }).join();
    EXPECT_EQ(seen, nullptr);
  }
  EXPECT_EQ(kiln_executorch_current_stream(), nullptr);
  cudaStreamDestroy(other);
}

}  // namespace
}  // namespace kiln::engine
