// The C entry points for per-op profiling (declared in <kiln/executorch/stats.h>), so the runner
// and apps can reach the engine's profile through dlsym/ctypes without C++ types crossing the
// library boundary.
#include <kiln/executorch/stats.h>

#include <cstring>
#include <string>

#include "runtime/engine/profile.h"

extern "C" {

KILN_EXECUTORCH_API void kiln_executorch_set_profiling(int on) {
  kiln::engine::profile::set_enabled(on != 0);
}

KILN_EXECUTORCH_API void kiln_executorch_reset_profile(void) { kiln::engine::profile::reset(); }

KILN_EXECUTORCH_API size_t kiln_executorch_profile_report(char* buffer, size_t size) {
  const std::string text = kiln::engine::profile::report();
  if (buffer != nullptr && size > 0) {
    const size_t n = text.size() < size - 1 ? text.size() : size - 1;
    std::memcpy(buffer, text.data(), n);
    buffer[n] = '\0';
  }
  return text.size();
}

KILN_EXECUTORCH_API double kiln_executorch_profile_total_ms(void) {
  return kiln::engine::profile::total_ms();
}

}
