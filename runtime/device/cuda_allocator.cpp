#include "runtime/device/cuda_allocator.h"

#include <executorch/runtime/platform/log.h>

#include <cuda_runtime_api.h>

#include "kiln/executorch/stream.h"

#include <mutex>
#include <unordered_map>

namespace kiln {
namespace {

namespace et = executorch::runtime;

// Runs `fn` with `index` as the current device and restores the caller's device afterwards, so
// the allocator never changes a thread's device behind its back.
template <typename Fn>
cudaError_t on_device(et::etensor::DeviceIndex index, Fn fn) {
  int previous = 0;
  cudaError_t err = cudaGetDevice(&previous);
  if (err != cudaSuccess) return err;
  const int want = index < 0 ? previous : index;  // -1 means "the current device"
  if (want != previous && (err = cudaSetDevice(want)) != cudaSuccess) return err;
  err = fn();
  if (want != previous) cudaSetDevice(previous);
  return err;
}

// Synchronous copy on device `index`, with one log line naming the direction when it fails.
et::Error copy(void* dst, const void* src, size_t nbytes, et::etensor::DeviceIndex index,
               cudaMemcpyKind kind) {
  cudaError_t err = on_device(index, [&] {
    // With a caller stream set (kiln/executorch/stream.h) the copy takes its place in that
    // stream's order, after the Kiln work that produced or before the work that reads the data.
    // Without one, Kiln has finished its own stream; a host-to-device cudaMemcpy from pageable
    // memory may return before its DMA lands, and Kiln's non-blocking streams would not wait for
    // it, so finish it here.
    if (cudaStream_t stream = kiln_executorch_current_stream()) {
      cudaError_t e = cudaMemcpyAsync(dst, src, nbytes, kind, stream);
      return e != cudaSuccess ? e : cudaStreamSynchronize(stream);
    }
    cudaError_t e = cudaMemcpy(dst, src, nbytes, kind);
    return e != cudaSuccess || kind != cudaMemcpyHostToDevice ? e
                                                              : cudaStreamSynchronize(cudaStreamLegacy);
  });
  if (err != cudaSuccess) {
    cudaGetLastError();
    ET_LOG(Error, "Kiln CUDA allocator: %s copy of %zu bytes on cuda:%d failed: %s",
           kind == cudaMemcpyHostToDevice ? "host-to-device" : "device-to-host", nbytes,
           static_cast<int>(index), cudaGetErrorString(err));
    return et::Error::Internal;
  }
  return et::Error::Ok;
}

// Methods on several threads allocate and free at once: g_sizes only under g_sizes_mutex, and
// in_use_ is atomic.
std::mutex g_sizes_mutex;
std::unordered_map<void*, size_t> g_sizes;  // for bytes_in_use

}  // namespace

et::Result<void*> CudaDeviceAllocator::allocate(size_t nbytes, et::etensor::DeviceIndex index,
                                                size_t alignment) {
  if (alignment > 256 || (alignment & (alignment - 1)) != 0) {
    ET_LOG(Error, "Kiln CUDA allocator: alignment %zu not supported (a power of two up to 256)",
           alignment);
    return et::Error::NotSupported;
  }
  void* p = nullptr;
  cudaError_t err = on_device(index, [&] { return cudaMalloc(&p, nbytes == 0 ? 1 : nbytes); });
  if (err != cudaSuccess) {
    cudaGetLastError();
    // No device at all is the common case on a machine without a GPU: say what the program needs.
    if (err == cudaErrorNoDevice || err == cudaErrorInsufficientDriver ||
        err == cudaErrorInvalidDevice || err == cudaErrorCompatNotSupportedOnDevice) {
      ET_LOG(Error, "Kiln CUDA allocator: no usable CUDA device cuda:%d (%s). The program keeps Kiln "
             "delegate tensors in GPU memory: it needs an NVIDIA GPU (compute capability 9.0 or "
             "newer) and a CUDA 13 driver", static_cast<int>(index), cudaGetErrorString(err));
      return et::Error::NotFound;
    }
    ET_LOG(Error, "Kiln CUDA allocator: cudaMalloc(%zu bytes) on cuda:%d failed: %s", nbytes,
           static_cast<int>(index), cudaGetErrorString(err));
    return err == cudaErrorMemoryAllocation ? et::Error::MemoryAllocationFailed : et::Error::Internal;
  }
  in_use_ += nbytes;
  std::lock_guard<std::mutex> lock(g_sizes_mutex);
  g_sizes[p] = nbytes;
  return p;
}

void CudaDeviceAllocator::deallocate(void* ptr, et::etensor::DeviceIndex index) {
  if (ptr == nullptr) return;
  {
    std::lock_guard<std::mutex> lock(g_sizes_mutex);
    auto it = g_sizes.find(ptr);
    if (it != g_sizes.end()) {
      in_use_ -= it->second;
      g_sizes.erase(it);
    }
  }
  on_device(index, [&] { return cudaFree(ptr); });
}

et::Error CudaDeviceAllocator::copy_host_to_device(void* dst, const void* src, size_t nbytes,
                                                   et::etensor::DeviceIndex index) {
  h2d_bytes_.fetch_add(nbytes, std::memory_order_relaxed);
  return copy(dst, src, nbytes, index, cudaMemcpyHostToDevice);
}

et::Error CudaDeviceAllocator::copy_device_to_host(void* dst, const void* src, size_t nbytes,
                                                   et::etensor::DeviceIndex index) {
  d2h_bytes_.fetch_add(nbytes, std::memory_order_relaxed);
  return copy(dst, src, nbytes, index, cudaMemcpyDeviceToHost);
}

et::etensor::DeviceType CudaDeviceAllocator::device_type() const {
  return et::etensor::DeviceType::CUDA;
}

CudaDeviceAllocator& cuda_device_allocator() {
  static CudaDeviceAllocator instance;
  return instance;
}

}  // namespace kiln
