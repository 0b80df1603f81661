// kiln_runner --device-timing (device_timing.h).
#include "runner/device_timing.h"

#include <cuda_runtime.h>
#include <dlfcn.h>
#include <kiln/executorch/stream.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "runner/diagnostics.h"

namespace kiln::runner {
namespace {

void cuda_ok(cudaError_t status, const char* what) {
  if (status != cudaSuccess) fail(std::string(what) + " failed: " + cudaGetErrorString(status));
}

}  // namespace

void device_timing(et::Method& method, std::vector<InputTensor>& inputs, const Options& opts) {
  // Looked up at run time like the stats (kiln_stats.cpp), typed as stream.h declares it.
  const auto set_stream = reinterpret_cast<decltype(&kiln_executorch_set_stream)>(
      dlsym(RTLD_DEFAULT, "kiln_executorch_set_stream"));
  if (set_stream == nullptr) {
    fail("--device-timing: no kiln_executorch_set_stream in the process (load "
         "libkiln_executorch_backend.so)");
  }
  cudaStream_t stream = nullptr;
  cudaEvent_t start = nullptr, end = nullptr;
  cuda_ok(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
  cuda_ok(cudaEventCreate(&start), "cudaEventCreate");
  cuda_ok(cudaEventCreate(&end), "cudaEventCreate");
  CUstream_st* previous = set_stream(stream);
  auto execute = [&](const char* what) {
    bind_inputs(method, inputs);
    et::Error err = method.execute();
    if (err != et::Error::Ok) fail(std::string("execute('") + opts.method + "') " + what, err);
  };
  for (int w = 0; w < std::max(opts.warmup, 3); ++w) execute("(device-timing warm-up)");
  cuda_ok(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  const int n = opts.device_timing;
  std::vector<double> span_ms;
  for (int i = 0; i < n; ++i) {
    cuda_ok(cudaEventRecord(start, stream), "cudaEventRecord");
    execute("(device-timing)");
    cuda_ok(cudaEventRecord(end, stream), "cudaEventRecord");
    cuda_ok(cudaEventSynchronize(end), "cudaEventSynchronize");
    float ms = 0.0f;
    cuda_ok(cudaEventElapsedTime(&ms, start, end), "cudaEventElapsedTime");
    span_ms.push_back(ms);
  }
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < n; ++i) execute("(device-timing, back to back)");
  const auto t1 = std::chrono::steady_clock::now();
  cuda_ok(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  const auto t2 = std::chrono::steady_clock::now();
  set_stream(previous);
  cudaEventDestroy(start);
  cudaEventDestroy(end);
  cudaStreamDestroy(stream);
  std::sort(span_ms.begin(), span_ms.end());
  const double per = std::chrono::duration<double, std::milli>(t2 - t0).count() / n;
  const double enqueue = std::chrono::duration<double, std::milli>(t1 - t0).count() / n;
  std::printf("device_timing event_span_ms median=%.4f min=%.4f executes=%d\n", span_ms[span_ms.size() / 2],
              span_ms.front(), n);
  std::printf("device_timing back_to_back_ms_per_execute=%.4f enqueue_ms_per_execute=%.4f executes=%d\n",
              per, enqueue, n);
}

}  // namespace kiln::runner
