// kiln_runner's host and device memory (memory.h).
#include "runner/memory.h"

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "runner/diagnostics.h"

namespace kiln::runner {

HostBuffer::HostBuffer(size_t n) : nbytes(n) {
  data.reset(static_cast<uint8_t*>(std::aligned_alloc(64, ((n + 63) / 64) * 64 + 64)));
  if (!data) fail("cannot allocate " + std::to_string(n) + " bytes of host memory");
  std::memset(data.get(), 0, n);
}

std::unique_ptr<DeviceMemory> device_memory(et::etensor::Device device, size_t nbytes,
                                            const std::string& what) {
  auto m = std::make_unique<DeviceMemory>();
  m->alloc = et::get_device_allocator(device.type());
  m->index = device.index();
  if (m->alloc == nullptr) {
    fail(what + " lives on a GPU but no device allocator is registered; link "
         "kiln::executorch_backend");
  }
  auto p = m->alloc->allocate(std::max<size_t>(nbytes, 1), device.index());
  if (!p.ok()) fail("allocating " + std::to_string(nbytes) + " bytes of device memory for " + what, p.error());
  m->ptr = p.get();
  return m;
}

PlannedMemory::PlannedMemory(const et::MethodMeta& meta) {
  const size_t n = meta.num_memory_planned_buffers();
  for (size_t i = 0; i < n; ++i) {
    auto size = meta.memory_planned_buffer_size(i);
    if (!size.ok()) fail("memory_planned_buffer_size(" + std::to_string(i) + ")", size.error());
    auto device = meta.memory_planned_buffer_device(i);
    if (!device.ok()) fail("memory_planned_buffer_device(" + std::to_string(i) + ")", device.error());
    const size_t nbytes = static_cast<size_t>(size.get());
    devices_.push_back(device.get());
    if (device->type() == executorch::runtime::etensor::DeviceType::CPU) {
      host_.push_back(std::make_unique<HostBuffer>(nbytes));
      spans_.emplace_back(host_.back()->data.get(), nbytes);
      continue;
    }
    et::DeviceAllocator* alloc = et::get_device_allocator(device->type());
    if (alloc == nullptr) {
      fail("the program plans buffer " + std::to_string(i) +
           " on a GPU but no device allocator is registered for it; link "
           "kiln::executorch_backend (or preload libkiln_executorch_backend.so)");
    }
    auto p = alloc->allocate(nbytes, device->index());
    if (!p.ok() && p.error() == et::Error::NotFound) {
      fail("allocating " + std::to_string(nbytes) + " bytes of device memory failed: NotFound "
           "(0x20): no usable CUDA device (the line above says why); this program keeps Kiln "
           "delegate tensors in GPU memory and needs an NVIDIA GPU");
    }
    if (!p.ok()) fail("allocating " + std::to_string(nbytes) + " bytes of device memory", p.error());
    device_.push_back({alloc, p.get(), device->index()});
    // Zero the arena as for host memory: mutable buffers read it before anything writes it.
    std::vector<uint8_t> zeros(nbytes, 0);
    et::Error err = alloc->copy_host_to_device(p.get(), zeros.data(), nbytes, device->index());
    if (err != et::Error::Ok) fail("zeroing a device arena", err);
    spans_.emplace_back(static_cast<uint8_t*>(p.get()), nbytes);
  }
}

PlannedMemory::~PlannedMemory() {
  for (auto& d : device_) d.alloc->deallocate(d.ptr, d.index);
}

et::HierarchicalAllocator PlannedMemory::allocator() {
  return et::HierarchicalAllocator({spans_.data(), spans_.size()}, {devices_.data(), devices_.size()});
}

}  // namespace kiln::runner
