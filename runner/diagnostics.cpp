// kiln_runner's log filter and failure messages (diagnostics.h).
#include "runner/diagnostics.h"

#include <executorch/runtime/platform/platform.h>
#include <executorch/runtime/platform/runtime.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

namespace kiln::runner {
namespace {

const char* g_tool = "kiln_runner";

namespace et = executorch::runtime;

}  // namespace

// What to do about each error, by the stage it happened in. The ExecuTorch log line printed just
// before (when logging is on) names the exact operator, backend or tensor.
const char* hint(et::Error e) {
  switch (e) {
    case et::Error::OperatorMissing:
      return "an operator the program calls has no registered kernel (the 'Missing operator' log "
             "line above names it); link ExecuTorch's CPU kernels (executorch::kernels_optimized) "
             "for portable operators, or kiln::device_copy_kernels for et_copy::_h2d_copy.out / "
             "et_copy::_d2h_copy.out";
    case et::Error::NotFound:
      return "something the program names is not registered here: a delegate (link its backend "
             "library, e.g. kiln::executorch_backend for KilnBackend or executorch::backend_xnnpack for "
             "XnnpackBackend, with --no-as-needed) or a "
             "method (see the list of methods)";
    case et::Error::InvalidProgram:
      return "the file is not a valid ExecuTorch program (empty, truncated, corrupt or not a .pte); "
             "re-export it";
    case et::Error::InvalidArgument:
      return "an argument does not match what the program expects (dtype, shape or count); check "
             "the method's inputs";
    case et::Error::NotSupported:
      return "the program needs a feature this runtime build does not have";
    case et::Error::MemoryAllocationFailed:
    case et::Error::DelegateMemoryAllocationFailed:
      return "out of memory; free memory or use a smaller program";
    case et::Error::DelegateInvalidCompatibility:
      return "a delegate blob was built for another backend version or device; re-export with the "
             "installed Kiln";
    case et::Error::AccessFailed:
      return "the file could not be read; check the path and permissions";
    default:
      return "see the ExecuTorch log line above";
  }
}

namespace {

// ExecuTorch's log, filtered by KILN_LOG (debug, info, error; default: errors and fatals only):
// the wheel's kernels log CPU probing at info level on every load, which buries the output.
et_pal_log_level_t g_min_log_level = kError;

// What a failed method load could not find, read off ExecuTorch's own log lines ("kernel 'NAME'
// not found", "Backend NAME is not registered." / "... is not available."), so the runner's final
// message can name it and say what to do.
std::string g_missing_operator;
std::string g_backend_problem;

void remember_missing_piece(const char* message, size_t length) {
  const std::string text(message, length);
  const std::string before = "kernel '", after = "' not found";
  const size_t a = text.find(before);
  const size_t b = text.find(after);
  if (a != std::string::npos && b != std::string::npos && b > a) {
    g_missing_operator = text.substr(a + before.size(), b - a - before.size());
  }
  if (text.rfind("Backend ", 0) == 0 &&
      (text.find("is not registered") != std::string::npos || text.find("is not available") != std::string::npos)) {
    g_backend_problem = text;
  }
}

void emit_log(et_timestamp_t, et_pal_log_level_t level, const char* filename, const char*,
              size_t line, const char* message, size_t length) {
  const auto rank = [](et_pal_log_level_t l) {
    switch (l) {
      case kDebug: return 0;
      case kInfo: return 1;
      case kError: return 2;
      case kFatal: return 3;
      default: return 2;
    }
  };
  remember_missing_piece(message, length);
  if (rank(level) < rank(g_min_log_level)) return;
  std::fprintf(stderr, "%c executorch:%s:%zu] %.*s\n", static_cast<char>(level), filename, line,
               static_cast<int>(length), message);
}

}  // namespace

void install_log_filter() {
  const char* env = std::getenv("KILN_LOG");
  const std::string want = env ? env : "error";
  g_min_log_level = want == "debug" ? kDebug : want == "info" ? kInfo : kError;
  et::register_pal(et::PalImpl::create(emit_log, __FILE__));
}

// "OperatorMissing" rather than ExecuTorch's "Error::OperatorMissing".
const char* error_name(et::Error e) {
  const char* s = et::to_string(e);
  return std::strncmp(s, "Error::", 7) == 0 ? s + 7 : s;
}

[[noreturn]] void fail(const std::string& what, et::Error e) {
  std::string why = hint(e);
  if (e == et::Error::OperatorMissing && !g_missing_operator.empty()) {
    const bool device_copy = g_missing_operator.rfind("et_copy::", 0) == 0;
    why = "no kernel is registered for " + g_missing_operator + "; link " +
          (device_copy ? std::string("kiln::device_copy_kernels (libkiln_device_copy_kernels.so) or "
                                     "executorch::kernels_optimized, not both")
                       : std::string("a kernel library that provides it (executorch::kernels_optimized "
                                     "for ExecuTorch's portable ATen operators)"));
  }
  if (e == et::Error::NotFound && g_backend_problem.find("is not registered") != std::string::npos) {
    why = g_backend_problem + " Link its backend library (kiln::executorch_backend for KilnBackend, "
          "executorch::backend_xnnpack for XnnpackBackend) "
          "with --no-as-needed, or load it before the program";
  } else if (e == et::Error::NotFound && g_backend_problem.find("is not available") != std::string::npos) {
    why = g_backend_problem + " The backend is linked but cannot run on this machine; the line above "
          "says why (KilnBackend needs an NVIDIA GPU with compute capability 9.0 or newer)";
  }
  fail(what, e, why);
}

[[noreturn]] void fail(const std::string& what, et::Error e, const std::string& why) {
  std::fprintf(stderr, "%s: %s failed: %s (0x%02x): %s\n", g_tool, what.c_str(), error_name(e),
               static_cast<unsigned>(e), why.c_str());
  std::exit(1);
}

void set_tool_name(const char* name) { g_tool = name; }

[[noreturn]] void fail(const std::string& message) {
  std::fprintf(stderr, "%s: %s\n", g_tool, message.c_str());
  std::exit(1);
}

}  // namespace kiln::runner
