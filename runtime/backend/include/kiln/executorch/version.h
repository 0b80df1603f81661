// Which Kiln backend library this is, so a loader can refuse a library built against another
// executorch than the one in the process. Installed as <kiln/executorch/version.h>; link
// kiln::executorch_backend (or dlsym the names from libkiln_executorch_backend.so). C and C++.
// KILN_VERSION and KILN_EXECUTORCH_BUILD_VERSION come from CMake when the library is built.
#pragma once

#include <kiln/executorch/api.h>

#ifdef __cplusplus
extern "C" {
#endif

/// 1 when this library's static initializer registered KilnBackend.
KILN_EXECUTORCH_API int kiln_executorch_backend_registered(void);
/// Kiln's own version, e.g. "0.1.0".
KILN_EXECUTORCH_API const char* kiln_executorch_version(void);
/// The executorch version the library was compiled against (EXECUTORCH_BUILD_VERSION).
KILN_EXECUTORCH_API const char* kiln_executorch_built_against(void);

#ifdef __cplusplus
}  // extern "C"
#endif
