// The CUDA DeviceAllocator Kiln registers with ExecuTorch's device allocator registry, so that
// programs exported with device memory planning get their device arenas, and the et_copy kernels
// can move bytes, through one allocator that counts every byte.
#pragma once

#include <executorch/runtime/core/device_allocator.h>

#include <atomic>
#include <cstddef>

namespace kiln {

class CudaDeviceAllocator final : public executorch::runtime::DeviceAllocator {
 public:
  /// cudaMalloc on device `index`. Alignment up to 256 bytes is what cudaMalloc guarantees; larger
  /// requests are NotSupported. Out of memory is MemoryAllocationFailed with the CUDA message.
  executorch::runtime::Result<void*> allocate(size_t nbytes,
                                              executorch::runtime::etensor::DeviceIndex index,
                                              size_t alignment) override;
  void deallocate(void* ptr, executorch::runtime::etensor::DeviceIndex index) override;
  /// Synchronous copies (the caller reads or reuses the host memory right after), on the calling
  /// thread's Kiln stream when one is set (kiln/executorch/stream.h).
  executorch::runtime::Error copy_host_to_device(void* dst, const void* src, size_t nbytes,
                                                 executorch::runtime::etensor::DeviceIndex index) override;
  executorch::runtime::Error copy_device_to_host(void* dst, const void* src, size_t nbytes,
                                                 executorch::runtime::etensor::DeviceIndex index) override;
  executorch::runtime::etensor::DeviceType device_type() const override;

  /// Bytes currently allocated through this allocator.
  size_t bytes_in_use() const { return in_use_.load(); }
  /// Bytes copied through copy_host_to_device / copy_device_to_host since the process started:
  /// ExecuTorch's et_copy kernels at the delegate boundary of programs with device memory.
  uint64_t host_to_device_bytes() const { return h2d_bytes_.load(std::memory_order_relaxed); }
  uint64_t device_to_host_bytes() const { return d2h_bytes_.load(std::memory_order_relaxed); }

 private:
  std::atomic<size_t> in_use_{0};
  std::atomic<uint64_t> h2d_bytes_{0};
  std::atomic<uint64_t> d2h_bytes_{0};
};

/// The process-wide instance (static lifetime, as the registry requires).
CudaDeviceAllocator& cuda_device_allocator();

}  // namespace kiln
