// Versions baked into the backend library, so a loader can refuse a library built against another
// executorch than the one in the process. KILN_VERSION and KILN_EXECUTORCH_BUILD_VERSION come from
// CMake.
#pragma once

#define KILN_EXPORT __attribute__((visibility("default")))

extern "C" {
/// 1 when this library's static initializer registered KilnBackend.
KILN_EXPORT int kiln_executorch_backend_registered();
/// Kiln's own version, e.g. "0.1.0".
KILN_EXPORT const char* kiln_executorch_version();
/// The executorch version the library was compiled against (EXECUTORCH_BUILD_VERSION).
KILN_EXPORT const char* kiln_executorch_built_against();
}
