// kiln_runner's view of Kiln's stats and profile (kiln_stats.h), through dlsym on the C API of
// <kiln/executorch/stats.h>: the declarations there give each function pointer its type.
#include "runner/kiln_stats.h"

#include <dlfcn.h>
#include <kiln/executorch/stats.h>

#include <cstdio>
#include <string>
#include <vector>

// The C function `name` of stats.h in the process, typed as stats.h declares it, or null when no
// library in the process defines it. decltype names the declaration without referencing the
// symbol, so the runner links and starts without it.
#define KILN_LOOKUP(name) reinterpret_cast<decltype(&name)>(dlsym(RTLD_DEFAULT, #name))

namespace kiln::runner {

bool read_copy_counters(CopyCounts& c) {
  static const auto fn = KILN_LOOKUP(kiln_executorch_copy_counters);
  if (fn == nullptr) return false;
  fn(&c.host_to_device, &c.device_to_host, &c.executes);
  return true;
}

void print_kiln_device_memory() {
  static const auto weights = KILN_LOOKUP(kiln_executorch_weight_bytes);
  static const auto activations = KILN_LOOKUP(kiln_executorch_activation_bytes);
  if (weights != nullptr && activations != nullptr) {
    std::printf("kiln_device_bytes weights=%llu activations=%llu\n",
                static_cast<unsigned long long>(weights()),
                static_cast<unsigned long long>(activations()));
  }
}

const Profiler& profiler() {
  static const Profiler p = [] {
    Profiler f;
    f.set = KILN_LOOKUP(kiln_executorch_set_profiling);
    f.reset = KILN_LOOKUP(kiln_executorch_reset_profile);
    f.report = KILN_LOOKUP(kiln_executorch_profile_report);
    f.total_ms = KILN_LOOKUP(kiln_executorch_profile_total_ms);
    return f;
  }();
  return p;
}

void print_profile(size_t run_index, const std::string& method, const std::vector<double>& ms) {
  const Profiler& p = profiler();
  std::printf("# profile of run %zu: %zu executes of '%s'; Kiln ops run eagerly (no CUDA graph "
              "replay), each timed with CUDA events\n",
              run_index, ms.size(), method.c_str());
  if (!p.available()) {
    std::printf("profile unavailable: no kiln_executorch_set_profiling in the process (load "
                "libkiln_executorch_backend.so)\n");
    return;
  }
  std::string text(p.report(nullptr, 0) + 1, '\0');
  text.resize(p.report(text.data(), text.size()));
  if (text.empty()) {
    std::printf("profile: no Kiln engine ran (the program has no Kiln delegates, or none "
                "executed); nothing to profile\n");
    return;
  }
  std::printf("%s", text.c_str());
  double wall = 0.0;
  for (double v : ms) wall += v;
  const double n = static_cast<double>(ms.size());
  const double op_ms = p.total_ms();
  std::printf("profile_total kiln_op_ms_per_execute=%.4f wall_ms_per_execute=%.4f "
              "kiln_op_share=%.1f%% (wall: the whole method execute, CPU ops, copies and "
              "profiling syncs included)\n",
              op_ms / n, wall / n, wall > 0 ? 100.0 * op_ms / wall : 0.0);
}

}  // namespace kiln::runner
