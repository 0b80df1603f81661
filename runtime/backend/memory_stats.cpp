// The C entry points for Kiln's device-memory totals (declared in <kiln/executorch/stats.h>), so
// apps and the Python package can read them with dlsym/ctypes without C++ types crossing the
// library boundary.
#include <kiln/executorch/stats.h>

#include "runtime/engine/engine.h"

extern "C" {

KILN_EXECUTORCH_API uint64_t kiln_executorch_weight_bytes() {
  return kiln::engine::device_memory_stats().weight_bytes;
}
KILN_EXECUTORCH_API uint64_t kiln_executorch_weight_allocated_bytes() {
  return kiln::engine::device_memory_stats().weight_allocated_bytes;
}
KILN_EXECUTORCH_API uint64_t kiln_executorch_weight_requested_bytes() {
  return kiln::engine::device_memory_stats().weight_requested_bytes;
}
KILN_EXECUTORCH_API uint64_t kiln_executorch_activation_bytes() {
  return kiln::engine::device_memory_stats().activation_bytes;
}

}
