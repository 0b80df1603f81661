// Memory kiln_runner owns for a method: host buffers, device memory from the registered device
// allocator (device-resident inputs and outputs), and the memory-planned arenas.
#pragma once

#include <executorch/runtime/core/device_allocator.h>
#include <executorch/runtime/core/hierarchical_allocator.h>
#include <executorch/runtime/core/span.h>
#include <executorch/runtime/executor/method_meta.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

namespace kiln::runner {

namespace et = executorch::runtime;

// Host memory for one input or arena; 64-byte aligned because kernels may vectorise.
struct HostBuffer {
  std::unique_ptr<uint8_t, decltype(&std::free)> data{nullptr, &std::free};
  size_t nbytes = 0;
  explicit HostBuffer(size_t n);  // zeroed; fails the run when the host is out of memory
};

// Device memory from the registered allocator of a device-resident program's input or output.
struct DeviceMemory {
  et::DeviceAllocator* alloc = nullptr;
  void* ptr = nullptr;
  int index = 0;
  DeviceMemory() = default;
  DeviceMemory(const DeviceMemory&) = delete;
  DeviceMemory& operator=(const DeviceMemory&) = delete;
  ~DeviceMemory() {
    if (ptr != nullptr) alloc->deallocate(ptr, index);
  }
};

/// Device memory of `nbytes` (at least 1) on `device`; `what` names it in the failure message.
std::unique_ptr<DeviceMemory> device_memory(et::etensor::Device device, size_t nbytes,
                                            const std::string& what);

// Memory-planned arenas, each on the device the program asks for. Host arenas start zeroed, which
// is what stateful programs (mutable buffers) expect on a fresh load.
class PlannedMemory {
 public:
  explicit PlannedMemory(const et::MethodMeta& meta);
  ~PlannedMemory();
  PlannedMemory(const PlannedMemory&) = delete;
  PlannedMemory& operator=(const PlannedMemory&) = delete;
  et::HierarchicalAllocator allocator();

 private:
  struct DeviceArena {
    et::DeviceAllocator* alloc;
    void* ptr;
    executorch::runtime::etensor::DeviceIndex index;
  };
  std::vector<std::unique_ptr<HostBuffer>> host_;
  std::vector<DeviceArena> device_;
  std::vector<et::Span<uint8_t>> spans_;
  std::vector<executorch::runtime::etensor::Device> devices_;
};

}  // namespace kiln::runner
