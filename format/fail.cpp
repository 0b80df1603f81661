#include "format/fail.h"

#include <executorch/runtime/platform/log.h>

#include <cstdarg>
#include <cstdio>

namespace kiln::engine {

std::string vformat(const char* format, va_list args) {
  char buffer[1024];
  std::vsnprintf(buffer, sizeof(buffer), format, args);
  return buffer;
}

executorch::runtime::Error fail(std::string* why, executorch::runtime::Error code,
                                const char* format, ...) {
  char buffer[1024];
  va_list args;
  va_start(args, format);
  std::vsnprintf(buffer, sizeof(buffer), format, args);
  va_end(args);
  ET_LOG(Error, "%s", buffer);
  if (why != nullptr) {
    *why = buffer;
  }
  return code;
}

}  // namespace kiln::engine
