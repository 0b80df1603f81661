// What KILN_AUTOTUNE=1 shares between the library-backed ops (GEMMs, convolutions): timing one
// candidate the way the engine runs it, as a CUDA graph replay.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <initializer_list>
#include <vector>

namespace kiln::engine::kernels {

/// Graph replays timed per candidate.
inline constexpr int kAutotuneRuns = 20;

/// A timed candidate replaces the library heuristic's own first choice only when it is this many
/// times faster: an op timed alone on hot caches is a rough guide to its time inside the whole
/// graph, and smaller differences measured this way did not hold up end to end (H200).
inline constexpr float kAutotuneMargin = 1.25f;

/// Zeroed device scratch buffers of one op's sizes (a size of 0 gives a null buffer) and the two
/// events that time its candidates, all released on destruction. A device short of memory is not
/// an error: ok() is false and the caller keeps the heuristic's choice.
class AutotuneScratch {
 public:
  explicit AutotuneScratch(std::initializer_list<size_t> sizes) : buffers_(sizes.size(), nullptr) {
    size_t i = 0;
    for (size_t bytes : sizes) {
      ok_ = ok_ && (bytes == 0 || (cudaMalloc(&buffers_[i], bytes) == cudaSuccess &&
                                   cudaMemset(buffers_[i], 0, bytes) == cudaSuccess));
      ++i;
    }
    ok_ = ok_ && cudaEventCreate(&start) == cudaSuccess && cudaEventCreate(&end) == cudaSuccess;
    (void)cudaGetLastError();  // a failed allocation is not an error of the engine
  }
  ~AutotuneScratch() {
    for (void* b : buffers_) {
      if (b != nullptr) cudaFree(b);
    }
    if (start != nullptr) cudaEventDestroy(start);
    if (end != nullptr) cudaEventDestroy(end);
    (void)cudaGetLastError();
  }
  AutotuneScratch(const AutotuneScratch&) = delete;
  AutotuneScratch& operator=(const AutotuneScratch&) = delete;

  bool ok() const { return ok_; }
  void* buffer(size_t i) const { return buffers_[i]; }

  cudaEvent_t start = nullptr;
  cudaEvent_t end = nullptr;

 private:
  std::vector<void*> buffers_;
  bool ok_ = true;
};

/// Calls `launch()` (which enqueues one candidate on `stream` and says whether the library
/// accepted it) once eagerly, so the library's lazy setup never happens under capture, then
/// captures one call into a CUDA graph and times `runs` replays between `start` and `end`.
/// Returns the mean in ms, or a negative value when any step failed; either way the stream is
/// idle afterwards and the last CUDA error is cleared.
template <typename Launch>
float time_graph_replays(cudaStream_t stream, cudaEvent_t start, cudaEvent_t end, int runs,
                         Launch&& launch) {
  float ms = -1.0f;
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
  if (launch() && cudaStreamSynchronize(stream) == cudaSuccess &&
      cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal) == cudaSuccess) {
    const bool captured = launch();
    if (cudaStreamEndCapture(stream, &graph) == cudaSuccess && captured &&
        cudaGraphInstantiate(&exec, graph, 0) == cudaSuccess &&
        cudaGraphLaunch(exec, stream) == cudaSuccess &&
        cudaEventRecord(start, stream) == cudaSuccess) {
      bool launched = true;
      for (int r = 0; r < runs && launched; ++r) {
        launched = cudaGraphLaunch(exec, stream) == cudaSuccess;
      }
      if (launched && cudaEventRecord(end, stream) == cudaSuccess &&
          cudaEventSynchronize(end) == cudaSuccess &&
          cudaEventElapsedTime(&ms, start, end) == cudaSuccess) {
        ms /= static_cast<float>(runs);
      } else {
        ms = -1.0f;
      }
    }
  }
  if (exec != nullptr) cudaGraphExecDestroy(exec);
  if (graph != nullptr) cudaGraphDestroy(graph);
  cudaStreamSynchronize(stream);
  (void)cudaGetLastError();
  return ms;
}

}  // namespace kiln::engine::kernels
