#include "runtime/engine/device.h"

#include <cstdarg>
#include <cstdio>
#include <string>
#include <utility>

#include "runtime/engine/cuda_check.h"
#include "runtime/engine/engine.h"
#include "format/fail.h"

namespace kiln::engine {

using executorch::runtime::Error;
using executorch::runtime::Result;

namespace {

// The build's target: sm_90 machine code plus compute_90 PTX for newer GPUs (CMakeLists.txt).
constexpr int kMinMajor = 9;
constexpr int kMinMinor = 0;

bool capability_supported(int major, int minor) {
  return major > kMinMajor || (major == kMinMajor && minor >= kMinMinor);
}

std::string device_name(int device) {
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, device) != cudaSuccess) {
    (void)cudaGetLastError();
    return "unknown";
  }
  return prop.name;
}

std::string compute_unavailable_reason() {
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess) {
    (void)cudaGetLastError();
    return std::string("cudaGetDeviceCount failed: ") + cudaGetErrorString(status) +
           " (is the NVIDIA driver installed and a GPU visible to this process?)";
  }
  if (count == 0) {
    return "no CUDA device is visible to this process (check CUDA_VISIBLE_DEVICES)";
  }
  std::string seen;
  for (int d = 0; d < count; ++d) {
    int major = 0;
    int minor = 0;
    cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, d);
    cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, d);
    if (capability_supported(major, minor)) {
      return "";
    }
    seen += (d == 0 ? "" : ", ") + std::string("device ") + std::to_string(d) + " (" +
            device_name(d) + ") is compute capability " + std::to_string(major) + "." +
            std::to_string(minor);
  }
  (void)cudaGetLastError();
  return "no CUDA device with compute capability 9.0 or newer; Kiln is built for sm_90: " + seen;
}

}  // namespace

Error cuda_status(cudaError_t status, Error code, const char* format, ...) {
  if (status == cudaSuccess) {
    return Error::Ok;
  }
  (void)cudaGetLastError();
  char context[768];
  va_list args;
  va_start(args, format);
  std::vsnprintf(context, sizeof(context), format, args);
  va_end(args);
  return fail(nullptr, code, "%s: %s (%s)", context, cudaGetErrorString(status),
              cudaGetErrorName(status));
}

const std::string& cuda_unavailable_reason() {
  // Safe from any thread: a function-local static is initialised exactly once (C++11), and
  // threads arriving meanwhile wait for it, so engines created on several threads at once all
  // read the one finished string.
  static const std::string reason = compute_unavailable_reason();
  return reason;
}

DeviceBuffer::DeviceBuffer(DeviceBuffer&& other) noexcept
    : ptr_(std::exchange(other.ptr_, nullptr)), size_(std::exchange(other.size_, 0)) {}

DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& other) noexcept {
  if (this != &other) {
    if (ptr_ != nullptr) {
      cudaFree(ptr_);
    }
    ptr_ = std::exchange(other.ptr_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

DeviceBuffer::~DeviceBuffer() {
  if (ptr_ != nullptr) {
    cudaFree(ptr_);
  }
}

Result<DeviceBuffer> DeviceBuffer::allocate(size_t bytes, const char* what) {
  DeviceBuffer buffer;
  if (bytes == 0) {
    return buffer;
  }
  KILN_TRY(cuda_status(cudaMalloc(&buffer.ptr_, bytes), Error::MemoryAllocationFailed,
                       "Kiln engine: cannot allocate %zu bytes of device memory for %s", bytes,
                       what));
  buffer.size_ = bytes;
  return buffer;
}

PinnedBuffer::PinnedBuffer(PinnedBuffer&& other) noexcept
    : ptr_(std::exchange(other.ptr_, nullptr)) {}

PinnedBuffer& PinnedBuffer::operator=(PinnedBuffer&& other) noexcept {
  if (this != &other) {
    if (ptr_ != nullptr) {
      cudaFreeHost(ptr_);
    }
    ptr_ = std::exchange(other.ptr_, nullptr);
  }
  return *this;
}

PinnedBuffer::~PinnedBuffer() {
  if (ptr_ != nullptr) {
    cudaFreeHost(ptr_);
  }
}

Result<PinnedBuffer> PinnedBuffer::allocate(size_t bytes, const char* what) {
  PinnedBuffer buffer;
  KILN_TRY(cuda_status(
      cudaHostAlloc(&buffer.ptr_, bytes, cudaHostAllocDefault), Error::MemoryAllocationFailed,
      "Kiln engine: cannot allocate %zu bytes of pinned host memory for %s", bytes, what));
  return buffer;
}

ScopedDevice::ScopedDevice(int device) {
  status_ =
      cuda_status(cudaGetDevice(&previous_), Error::Internal, "Kiln engine: cudaGetDevice failed");
  if (status_ == Error::Ok && previous_ != device) {
    status_ = cuda_status(cudaSetDevice(device), Error::Internal,
                          "Kiln engine: cannot make CUDA device %d current", device);
    switched_ = status_ == Error::Ok;
  }
}

ScopedDevice::~ScopedDevice() {
  if (switched_) {
    cudaSetDevice(previous_);
  }
}

Error check_device(int device_index) {
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess) {
    (void)cudaGetLastError();
    return fail(nullptr, Error::NotFound,
                "Kiln engine: no usable CUDA device: cudaGetDeviceCount failed: %s (%s); is the "
                "NVIDIA driver installed and a GPU visible to this process?",
                cudaGetErrorString(status), cudaGetErrorName(status));
  }
  if (count == 0) {
    return fail(nullptr, Error::NotFound,
                "Kiln engine: no usable CUDA device: none is visible to this process (check "
                "CUDA_VISIBLE_DEVICES)");
  }
  if (device_index < 0 || device_index >= count) {
    return fail(nullptr, Error::NotFound,
                "Kiln engine: device_index %d is out of range; this process sees %d CUDA "
                "device(s)",
                device_index, count);
  }
  int major = 0;
  int minor = 0;
  KILN_TRY(
      cuda_status(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device_index),
                  Error::NotFound, "Kiln engine: cannot query CUDA device %d", device_index));
  KILN_TRY(
      cuda_status(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device_index),
                  Error::NotFound, "Kiln engine: cannot query CUDA device %d", device_index));
  if (!capability_supported(major, minor)) {
    return fail(nullptr, Error::NotSupported,
                "Kiln engine: CUDA device %d (%s) has compute capability %d.%d; this Kiln is "
                "built for sm_90 and needs compute capability %d.%d or newer",
                device_index, device_name(device_index).c_str(), major, minor, kMinMajor,
                kMinMinor);
  }
  return Error::Ok;
}

int multiprocessor_count(int device) {
  int count = 0;
  if (cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device) != cudaSuccess) {
    (void)cudaGetLastError();
    return 132;  // an H100/H200; only sizes grid-stride launches
  }
  return count;
}

}  // namespace kiln::engine
