// kiln_runner: the reference runner. Loads a .pte with the ExecuTorch runtime from the pinned wheel,
// runs one method and prints its outputs in the format kiln-verify reads:
//
//   output[0] shape=[64,64] dtype=Float
//   2 2 2 2 2 2 2 2
//
// Whatever registered itself in this process (ExecuTorch's CPU kernels, which this binary links;
// Kiln's backend and device pieces when linked or preloaded) is what runs the program.
//
// This file is the run itself: load, execute, time. The rest sits beside it by job: options.h (the
// command line), diagnostics.h (log filter and failure messages), memory.h (host, device and
// planned memory), tensor_io.h (inputs and printed outputs), kiln_stats.h (Kiln's copy counters,
// device memory and per-op profile) and device_timing.h (--device-timing).

#include <executorch/runtime/executor/method.h>
#include <executorch/runtime/executor/program.h>
#include <executorch/runtime/platform/runtime.h>
#include <cuda_profiler_api.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "runner/device_timing.h"
#include "runner/diagnostics.h"
#include "runner/kiln_stats.h"
#include "runner/memory.h"
#include "runner/options.h"
#include "runner/program_loader.h"
#include "runner/tensor_io.h"

namespace kiln::runner {
namespace {

using executorch::runtime::etensor::DeviceType;

// A device-resident program's outputs that have no memory of their own get device buffers.
std::vector<std::unique_ptr<DeviceMemory>> bind_device_outputs(et::Method& method) {
  std::vector<std::unique_ptr<DeviceMemory>> output_memory;
  for (size_t i = 0; i < method.outputs_size(); ++i) {
    const et::EValue& v = method.get_output(i);
    const et::etensor::Device device = value_device(v);
    if (device.type() == DeviceType::CPU || v.toTensor().const_data_ptr() != nullptr) continue;
    const size_t nbytes = v.toTensor().nbytes();
    output_memory.push_back(device_memory(device, nbytes, "output " + std::to_string(i)));
    et::Error err = method.set_output_data_ptr(output_memory.back()->ptr, nbytes, i);
    if (err != et::Error::Ok) fail("set_output_data_ptr(" + std::to_string(i) + ") with device memory", err);
  }
  return output_memory;
}

void cuda_profiler(cudaError_t status, const char* what) {
  if (status != cudaSuccess) fail(std::string("--profiler-range: ") + what + " failed: " +
                                  cudaGetErrorString(status));
}

// One run of the method (the inputs of one --next group): warm-up, the executes, its outputs and
// the lines --copy-stats, --iterations, --profile and --device-timing ask for.
void execute_run(et::Method& method, const et::MethodMeta& meta, const Options& opts, size_t r,
                 const std::vector<et::etensor::Device>& input_devices, bool device_io,
                 double load_ms, std::vector<InputTensor>& inputs) {
  make_inputs(meta, opts.runs[r], opts, input_devices, inputs);
  CopyCounts before;
  const bool counted = opts.copy_stats && read_copy_counters(before);
  // Profiled warm-up too (the first eager run loads kernels lazily), then only the timed runs count.
  if (opts.profile && profiler().available()) profiler().set(1);
  for (int w = 0; w < opts.warmup; ++w) {
    bind_inputs(method, inputs);
    et::Error err = method.execute();
    if (err != et::Error::Ok) fail("execute('" + opts.method + "') (warm-up)", err);
  }
  if (opts.profile && profiler().available()) profiler().reset();
  std::vector<double> ms;
  if (opts.profiler_range) cuda_profiler(cudaProfilerStart(), "cudaProfilerStart");
  for (int it = 0; it < std::max(1, opts.iterations); ++it) {
    bind_inputs(method, inputs);
    const auto t0 = std::chrono::steady_clock::now();
    et::Error err = method.execute();
    const auto t1 = std::chrono::steady_clock::now();
    if (err != et::Error::Ok) fail("execute('" + opts.method + "')", err);
    ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
  }
  if (opts.profiler_range) cuda_profiler(cudaProfilerStop(), "cudaProfilerStop");
  if (opts.runs.size() > 1) std::printf("# run %zu\n", r);
  print_outputs(method, opts, r);
  if (opts.copy_stats) {
    CopyCounts after;
    if (counted && read_copy_counters(after)) {
      const uint64_t n = after.executes - before.executes;
      std::printf("copy_bytes host_to_device=%" PRIu64 " device_to_host=%" PRIu64
                  " kiln_executes=%" PRIu64 " method_executes=%d\n",
                  after.host_to_device - before.host_to_device,
                  after.device_to_host - before.device_to_host, n,
                  opts.warmup + std::max(1, opts.iterations));
    } else {
      std::printf("copy_bytes unavailable (no kiln_executorch_copy_counters in the process)\n");
    }
  }
  if (opts.iterations > 0) {
    std::sort(ms.begin(), ms.end());
    std::printf("latency_ms min=%.4f median=%.4f max=%.4f iterations=%zu warmup=%d\n", ms.front(),
                ms[ms.size() / 2], ms.back(), ms.size(), opts.warmup);
    if (opts.profile) {
      std::printf("latency measured with --profile on: ops ran eagerly with CUDA events and a "
                  "sync per Kiln execute; run without --profile for real latency\n");
    }
    if (r == 0) {
      std::printf("load_method_ms=%.3f\n", load_ms);
      print_kiln_device_memory();
    }
  }
  if (opts.profile) {
    if (profiler().available()) profiler().set(0);
    print_profile(r, opts.method, ms);
  }
  if (opts.device_timing > 0) {
    if (!device_io) {
      fail("--device-timing needs a device-resident program (export it with "
           "device_resident=True); this one takes host tensors");
    }
    device_timing(method, inputs, opts);
  }
}

// A second load in this warm process (CUDA context, libraries and kernels already loaded): what an
// application pays for each further method or program it loads.
void print_warm_load(et::Program& program, const Options& opts) {
  LoadedMethod again(program, opts.method, opts.model);
  std::printf("load_method_warm_ms=%.3f\n", again.load_ms());
}

int run_main(int argc, char** argv) {
  Options opts;
  std::string error;
  if (!parse_options(argc, argv, opts, error)) {
    std::fprintf(stderr, "kiln_runner: %s\n%s", error.c_str(), kUsage);
    return 2;
  }
  start_runtime();

  LoadedProgram loaded = load_program(opts.model);
  LoadedMethod method_slot(*loaded.program, opts.method, opts.model);
  et::Method& method = method_slot.method();
  const et::MethodMeta& meta = method_slot.meta();
  const double load_ms = method_slot.load_ms();

  // A device-resident program (exported with device_resident=True) takes and returns device
  // tensors: its inputs are copied to device memory once per run, outside the timed executes, and
  // its outputs get device buffers of their own; the copies back happen only for printing.
  const std::vector<et::etensor::Device> input_devices = kiln::runner::input_devices(method);
  const std::vector<std::unique_ptr<DeviceMemory>> output_memory = bind_device_outputs(method);
  const bool device_io = !output_memory.empty() ||
                         std::any_of(input_devices.begin(), input_devices.end(),
                                     [](const auto& d) { return d.type() != DeviceType::CPU; });
  if (device_io && opts.iterations > 0) {
    std::printf("device_io inputs and outputs stay in device memory; each timed execute returns "
                "once Kiln's stream has finished\n");
  }

  std::vector<InputTensor> inputs;
  for (size_t r = 0; r < opts.runs.size(); ++r) {
    execute_run(method, meta, opts, r, input_devices, device_io, load_ms, inputs);
  }
  if (opts.iterations > 0) print_warm_load(*loaded.program, opts);
  std::fflush(stdout);
  return 0;
}

}  // namespace
}  // namespace kiln::runner

int main(int argc, char** argv) { return kiln::runner::run_main(argc, argv); }
