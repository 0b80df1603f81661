// CUDA graph capture and replay: from the second run on, CudaEngine replays its ops as one
// captured graph (updated in place when the bound pointers change), and falls back to eager runs
// when a capture fails for reasons outside the ops.
#include <cuda_runtime.h>
#include <executorch/runtime/platform/log.h>

#include "runtime/engine/cuda_check.h"
#include "runtime/engine/cuda_engine.h"
#include "runtime/engine/device.h"
#include "format/fail.h"
#ifdef KILN_ENGINE_FAULT_INJECTION
#include "runtime/engine/fault_injection.h"
#endif

namespace kiln::engine {
namespace {

// Captures that fail for reasons outside the ops (a library call that refuses capture, another
// thread's call invalidating it) run eagerly; after this many in a row the engine stops trying.
constexpr int kMaxCaptureFailures = 3;

}  // namespace

using executorch::runtime::Error;

// Errors that say a stream capture went wrong rather than the launch itself.
bool is_capture_error(cudaError_t e) {
  switch (e) {
    case cudaErrorStreamCaptureUnsupported:
    case cudaErrorStreamCaptureInvalidated:
    case cudaErrorStreamCaptureMerge:
    case cudaErrorStreamCaptureUnmatched:
    case cudaErrorStreamCaptureUnjoined:
    case cudaErrorStreamCaptureIsolation:
    case cudaErrorStreamCaptureImplicit:
    case cudaErrorCapturedEvent:
    case cudaErrorStreamCaptureWrongThread:
      return true;
    default:
      return false;
  }
}

Error CudaEngine::launch_graph(cudaStream_t stream) {
  DeviceState& s = *state_;
  if (empty_graph_ && captured_ptrs_ == io_ptrs_) {
    return Error::Ok;
  }
  if (s.graph_exec == nullptr || captured_ptrs_ != io_ptrs_) {
    const Error captured = capture();
    if (captured != Error::Ok) {
      // Whatever failed, no graph from this attempt survives: the next run captures afresh.
      s.graph_exec.reset();
      if (launch_failed_) {
        // An op's kernel launch was rejected (logged above with the op): that is this run's
        // error, reported like an eager run's, and no reason to give up graphs for later runs.
        return captured;
      }
      // The capture itself failed: a library call refused it (it will again) or another thread
      // invalidated it (it may not next time). Run this one eagerly; after a few failures in a
      // row, every run.
      graphs_disabled_ = ++capture_failures_ >= kMaxCaptureFailures;
      ET_LOG(Info, "Kiln engine: CUDA graph capture failed (logged above); running ops eagerly%s",
             graphs_disabled_ ? " from now on" : " this time");
      return enqueue_ops(stream);
    }
    capture_failures_ = 0;
    if (empty_graph_) {
      return Error::Ok;
    }
  }
#ifdef KILN_ENGINE_FAULT_INJECTION
  fault::count_graph_launch();
#endif
  return cuda_status(cudaGraphLaunch(s.graph_exec.get(), stream), Error::Internal,
                     "Kiln engine: cudaGraphLaunch failed");
}

Error CudaEngine::capture() {
  DeviceState& s = *state_;
  // Capture on the engine's own stream (capture only records; nothing runs), launch on any.
  cudaStream_t capture_stream = s.stream.get();
  launch_failed_ = false;  // BeginCapture may fail before enqueue_ops resets it
  KILN_TRY(cuda_status(cudaStreamBeginCapture(capture_stream, cudaStreamCaptureModeThreadLocal),
                       Error::Internal, "Kiln engine: cudaStreamBeginCapture failed"));
  capturing_ = true;
  const Error recorded = enqueue_ops(capture_stream);
  capturing_ = false;
  // Always end the capture, also after a failure: the stream leaves capture mode (an invalidated
  // capture returns an error and no graph) and stays usable for the next run.
  cudaGraph_t raw = nullptr;
  const cudaError_t ended = cudaStreamEndCapture(capture_stream, &raw);
  UniqueGraph graph(raw);
  if (recorded != Error::Ok) {
    (void)cudaGetLastError();  // an invalidated capture's error is part of the failure logged
    return recorded;
  }
  KILN_TRY(cuda_status(ended, Error::Internal, "Kiln engine: capturing the ops as a CUDA graph"));
  size_t nodes = 0;
  KILN_TRY(cuda_status(cudaGraphGetNodes(graph.get(), nullptr, &nodes), Error::Internal,
                       "Kiln engine: inspecting the captured CUDA graph"));
  if (nodes == 0) {  // every op was empty: there is nothing to launch
    s.graph_exec.reset();
    empty_graph_ = true;
    captured_ptrs_ = io_ptrs_;
    return Error::Ok;
  }
  empty_graph_ = false;
  if (s.graph_exec != nullptr) {
    // Same topology, new pointers: updating the executable graph is much cheaper than
    // instantiating a new one.
    cudaGraphExecUpdateResultInfo info{};
    if (cudaGraphExecUpdate(s.graph_exec.get(), graph.get(), &info) == cudaSuccess) {
      captured_ptrs_ = io_ptrs_;
      return Error::Ok;
    }
    (void)cudaGetLastError();
  }
  cudaGraphExec_t exec = nullptr;
  KILN_TRY(cuda_status(cudaGraphInstantiate(&exec, graph.get(), 0), Error::Internal,
                       "Kiln engine: cudaGraphInstantiate failed"));
  s.graph_exec.reset(exec);
  captured_ptrs_ = io_ptrs_;
  return Error::Ok;
}

}  // namespace kiln::engine
