// What KILN_AUTOTUNE=1 shares between the library-backed ops (GEMMs, convolutions): timing one
// candidate the way the engine runs it, as a CUDA graph replay.
#pragma once

#include <cuda_runtime.h>

namespace kiln::engine::kernels {

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
