// The engine's KILN_* switches: environment variables read where a choice is made (plan build or
// launch), so one process can compare two kernels by setting one variable.
#pragma once

#include <cstdlib>
#include <cstring>

namespace kiln::engine {

/// Whether the environment variable `name` is set to exactly `value` ("off", "on", "1", ...).
inline bool env_is(const char* name, const char* value) {
  const char* env = std::getenv(name);
  return env != nullptr && std::strcmp(env, value) == 0;
}

/// Whether `name` leaves the choice to Kiln or picks `choice`: unset, empty, "auto" or `choice`.
inline bool env_auto_or(const char* name, const char* choice) {
  const char* env = std::getenv(name);
  return env == nullptr || env[0] == '\0' || std::strcmp(env, "auto") == 0 ||
         std::strcmp(env, choice) == 0;
}

}  // namespace kiln::engine
