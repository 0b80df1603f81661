// Versions baked into the backend library, so a loader can refuse a library built against another
// executorch than the one in the process. KILN_VERSION and KILN_EXECUTORCH_BUILD_VERSION come from
// CMake.
#pragma once

#include <stdint.h>

#define KILN_EXPORT __attribute__((visibility("default")))

extern "C" {
/// 1 when this library's static initializer registered KilnBackend.
KILN_EXPORT int kiln_executorch_backend_registered();
/// Kiln's own version, e.g. "0.1.0".
KILN_EXPORT const char* kiln_executorch_version();
/// The executorch version the library was compiled against (EXECUTORCH_BUILD_VERSION).
KILN_EXPORT const char* kiln_executorch_built_against();
/// Cumulative host<->device bytes that Kiln engines copied in execute() in this process (inputs
/// in, outputs and the error flag out; weights and initial state at init excluded), and the
/// number of executions. Any pointer may be null. Program state (e.g. a KV cache) stays on the
/// device, so the difference across one decode step is its inputs and outputs only.
KILN_EXPORT void kiln_executorch_copy_counters(uint64_t* host_to_device_bytes,
                                               uint64_t* device_to_host_bytes,
                                               uint64_t* executes);
}
