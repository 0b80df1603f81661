// The one static initializer of libkiln_executorch_backend.so: registers KilnBackend with the
// ExecuTorch runtime already in the process (the wheel's libexecutorch.so) and, unless something
// registered one first, Kiln's CUDA device allocator. Nothing else in the library has global side
// effects.

#include <executorch/runtime/backend/interface.h>
#include <executorch/runtime/core/device_allocator.h>
#include <executorch/runtime/platform/log.h>
#include <kiln/executorch/stats.h>
#include <kiln/executorch/version.h>

#include "runtime/backend/kiln_backend.h"
#include "runtime/device/cuda_allocator.h"
#include "runtime/engine/engine.h"

namespace kiln {
namespace {

namespace et = executorch::runtime;

bool register_everything() {
  static KilnBackend backend;
  et::Error err = et::register_backend({kBackendId, &backend});
  if (err != et::Error::Ok) {
    // A second copy of this library in the process: the first registration stays in force.
    ET_LOG(Error, "KilnBackend: registration failed (0x%x): is the library loaded twice?",
           static_cast<unsigned>(err));
  }
  // The registry aborts on a second allocator for one device type, so defer to one that exists.
  if (et::get_device_allocator(et::etensor::DeviceType::CUDA) == nullptr) {
    et::register_device_allocator(&cuda_device_allocator());
  }
  return err == et::Error::Ok;
}

const bool g_registered = register_everything();

}  // namespace
}  // namespace kiln

extern "C" {

KILN_EXECUTORCH_API int kiln_executorch_backend_registered() { return kiln::g_registered ? 1 : 0; }
KILN_EXECUTORCH_API const char* kiln_executorch_version() { return KILN_VERSION; }
KILN_EXECUTORCH_API const char* kiln_executorch_built_against() { return KILN_EXECUTORCH_BUILD_VERSION; }

KILN_EXECUTORCH_API void kiln_executorch_copy_counters(uint64_t* host_to_device_bytes,
                                                       uint64_t* device_to_host_bytes,
                                                       uint64_t* executes) {
  // Both places bytes cross: the engines' own staging of host bindings, and ExecuTorch's et_copy
  // kernels, which copy through Kiln's allocator around each delegate call.
  const kiln::engine::CopyCounters c = kiln::engine::copy_counters();
  const kiln::CudaDeviceAllocator& a = kiln::cuda_device_allocator();
  if (host_to_device_bytes != nullptr) *host_to_device_bytes = c.host_to_device_bytes + a.host_to_device_bytes();
  if (device_to_host_bytes != nullptr) *device_to_host_bytes = c.device_to_host_bytes + a.device_to_host_bytes();
  if (executes != nullptr) *executes = c.executes;
}

}
