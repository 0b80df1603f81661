// What Kiln's backend reports to kiln_runner (<kiln/executorch/stats.h>): copy counters for
// --copy-stats, the device memory line after the latency, and the per-op profile for --profile.
// The functions are looked up at run time (dlsym), so the runner also runs with a backend library
// that lacks them, or without Kiln at all.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace kiln::runner {

// Kiln's copy counters, summed over the process since it started.
struct CopyCounts {
  uint64_t host_to_device = 0, device_to_host = 0, executes = 0;
};

/// Fills `c` from kiln_executorch_copy_counters(). Returns false when there are none.
bool read_copy_counters(CopyCounts& c);

// Device memory Kiln holds after load_method, when Kiln's backend is in the process.
void print_kiln_device_memory();

// Kiln's per-op profiler. All four or nothing.
struct Profiler {
  void (*set)(int) = nullptr;
  void (*reset)(void) = nullptr;
  size_t (*report)(char*, size_t) = nullptr;
  double (*total_ms)(void) = nullptr;
  bool available() const { return set && reset && report && total_ms; }
};

/// The profiler of the Kiln backend in the process, looked up once.
const Profiler& profiler();

// The --profile section of one run: every Kiln engine's ops sorted by GPU time, then the sum of
// op time per method execute against the execute's wall time.
void print_profile(size_t run_index, const std::string& method, const std::vector<double>& ms);

}  // namespace kiln::runner
