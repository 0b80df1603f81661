// One way to report a failure everywhere in the engine: a formatted sentence that goes to the
// ExecuTorch log and, for callers that want it (tests, tools), into a string, plus the Error code.
#pragma once

#include <executorch/runtime/core/error.h>

#include <cstdarg>
#include <string>

namespace kiln::engine {

/// Formats the message printf-style, logs it at Error level, stores it in `*why` when `why` is not
/// null, and returns `code`. Only called on failure paths, so success never formats anything.
executorch::runtime::Error fail(std::string* why, executorch::runtime::Error code,
                                const char* format, ...) __attribute__((format(printf, 3, 4)));

/// vsnprintf into a string (messages are truncated at 1023 characters).
std::string vformat(const char* format, va_list args);

}  // namespace kiln::engine
