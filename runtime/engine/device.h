// Owning wrappers for CUDA objects and device selection. Every CUDA resource the engine holds is
// one of these, so each failure path releases exactly what was created.
#pragma once

#include <cuda_runtime.h>
#include <executorch/runtime/core/error.h>
#include <executorch/runtime/core/result.h>

#include <cstddef>
#include <memory>
#include <type_traits>

namespace kiln::engine {

/// Calls `kDestroy` on a non-null handle; the return status is ignored (nothing useful can be
/// done with a failed destroy in a destructor).
template <auto kDestroy>
struct HandleDeleter {
  template <typename Handle>
  void operator()(Handle handle) const {
    if (handle != nullptr) {
      kDestroy(handle);
    }
  }
};

/// unique_ptr over an opaque CUDA handle type such as cudaStream_t.
template <typename Handle, auto kDestroy>
using UniqueHandle = std::unique_ptr<std::remove_pointer_t<Handle>, HandleDeleter<kDestroy>>;

using UniqueStream = UniqueHandle<cudaStream_t, cudaStreamDestroy>;
using UniqueEvent = UniqueHandle<cudaEvent_t, cudaEventDestroy>;
using UniqueGraph = UniqueHandle<cudaGraph_t, cudaGraphDestroy>;
using UniqueGraphExec = UniqueHandle<cudaGraphExec_t, cudaGraphExecDestroy>;

/// Device memory from cudaMalloc, freed on destruction. Zero bytes gives a null, valid buffer.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(DeviceBuffer&& other) noexcept;
  DeviceBuffer& operator=(DeviceBuffer&& other) noexcept;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer();

  /// MemoryAllocationFailed, logged with `what` and the size, when the device is out of memory.
  static executorch::runtime::Result<DeviceBuffer> allocate(size_t bytes, const char* what);

  void* get() const { return ptr_; }
  size_t size() const { return size_; }

 private:
  void* ptr_ = nullptr;
  size_t size_ = 0;
};

/// Page-locked host memory from cudaHostAlloc, freed on destruction.
class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  PinnedBuffer(PinnedBuffer&& other) noexcept;
  PinnedBuffer& operator=(PinnedBuffer&& other) noexcept;
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;
  ~PinnedBuffer();

  static executorch::runtime::Result<PinnedBuffer> allocate(size_t bytes, const char* what);

  void* get() const { return ptr_; }

 private:
  void* ptr_ = nullptr;
};

/// Makes `device` current for its lifetime and restores the caller's device afterwards, so the
/// engine works whatever device the calling thread had selected.
class ScopedDevice {
 public:
  explicit ScopedDevice(int device);
  ~ScopedDevice();
  ScopedDevice(const ScopedDevice&) = delete;
  ScopedDevice& operator=(const ScopedDevice&) = delete;

  /// Ok, or Internal (already logged) when the device could not be selected.
  executorch::runtime::Error status() const { return status_; }

 private:
  int previous_ = -1;
  bool switched_ = false;
  executorch::runtime::Error status_ = executorch::runtime::Error::Ok;
};

/// Checks that `device_index` names a CUDA device this build can run on. NotFound when there is
/// no usable device or the index is out of range (the message carries CUDA's reason);
/// NotSupported when its compute capability is below 9.0 (the build targets sm_90).
executorch::runtime::Error check_device(int device_index);

/// Number of streaming multiprocessors of `device`, for sizing grid-stride launches.
int multiprocessor_count(int device);

}  // namespace kiln::engine
