// Kiln's public API for CUDA streams (C functions and a C++ guard): hand KilnBackend the caller's
// CUDA stream for the executes of the current thread. Installed as <kiln/executorch/stream.h>;
// link kiln::executorch_backend, which defines the functions.
//
// Which stream Kiln runs on
//   * No stream set on the calling thread (the default): each Kiln delegate instance runs on its
//     own CUDA stream and returns only after that stream has finished, so Method::execute()
//     returns with every output ready, whatever memory the inputs and outputs are in.
//   * A stream set with kiln::ScopedStream / kiln_executorch_set_stream(): Kiln enqueues its work
//     on that stream, in stream order after everything the caller enqueued there before
//     execute() (device-resident inputs produced on that stream are ready when Kiln reads them);
//     work the caller enqueues there afterwards runs after Kiln's. The et_copy operators of a
//     default export copy on that stream too, and wait for it.
//
// When execute returns, with a stream set (one Kiln delegate call; Method::execute() returns
// after the last operator of the program returns)
//   * Every output binding of the delegate is device memory: it returns as soon as the work is
//     enqueued, and the GPU may still be running it. A device-resident program (exported with
//     device_resident=True, see examples/device_resident) is this case for the whole method: the
//     outputs are ready once the caller's stream gets there. Wait with
//     cudaStreamSynchronize(stream), or cudaEventRecord(event, stream) and then
//     cudaEventSynchronize(event) or cudaStreamWaitEvent(other_stream, event). Host inputs, if
//     any, have been read before it returns, so their memory may be reused at once.
//     Exceptions: a delegate that checks indices on the device (embedding, a KV-cache write)
//     waits for the stream before returning, so that an out-of-range index is reported as an
//     error; and the first execute of a delegate may wait for the device to go idle while CUDA
//     loads Kiln's kernels (lazy module loading). From the second execute on, it only enqueues.
//   * Any output binding of the delegate is host memory: it returns after the stream has
//     finished, and the host outputs are ready. In a default export (et_copy operators around the
//     delegate) the delegate's bindings are device memory, and et_copy::_d2h_copy waits for the
//     stream, so Method::execute() returns with the method's host outputs ready.
//   * On an error, nothing Kiln enqueued is still running when it returns.
//
// Threads: the stream is per thread (thread_local), so threads running different methods can
// each use their own stream. The caller keeps the stream alive while it is set. Device pointers
// given to Kiln must be cudaMalloc'd memory on the delegate's device.
#pragma once

#include <kiln/executorch/api.h>

struct CUstream_st;  // cudaStream_t is CUstream_st*; this header does not need the CUDA headers

#ifdef __cplusplus
extern "C" {
#endif

/// Sets the stream Kiln executes on for the calling thread (NULL: back to each delegate's own
/// stream). Returns the stream that was set before.
KILN_EXECUTORCH_API struct CUstream_st* kiln_executorch_set_stream(struct CUstream_st* stream);

/// The stream set for the calling thread, or NULL when none is.
KILN_EXECUTORCH_API struct CUstream_st* kiln_executorch_current_stream(void);

#ifdef __cplusplus
}  // extern "C"

namespace kiln {

/// Sets `stream` for the calling thread for the guard's lifetime and restores the previous one.
class ScopedStream {
 public:
  explicit ScopedStream(CUstream_st* stream) noexcept
      : previous_(kiln_executorch_set_stream(stream)) {}
  ~ScopedStream() { kiln_executorch_set_stream(previous_); }
  ScopedStream(const ScopedStream&) = delete;
  ScopedStream& operator=(const ScopedStream&) = delete;

 private:
  CUstream_st* previous_;
};

}  // namespace kiln
#endif
