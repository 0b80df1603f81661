// Kiln's public API for CUDA streams (C functions, a C++ guard): hand KilnBackend the caller's stream for the executes of
// the current thread. Installed as <kiln/executorch/stream.h>; link kiln::executorch_backend.
//
// Which stream Kiln runs on
//   * No stream set on the calling thread (the default): each Kiln delegate instance runs on its
//     own CUDA stream, and Method::execute() returns only after that stream has finished. Nothing
//     to wait for, whatever the inputs and outputs are.
//   * A stream set with kiln::ScopedStream / kiln_executorch_set_stream(): Kiln enqueues its work on that stream, in
//     stream order after everything the caller enqueued there before execute() (device-resident
//     inputs produced on that stream are ready when Kiln reads them), and everything enqueued there
//     afterwards runs after Kiln's work.
//
// When execute returns, with a stream set
//   * Every output of the Kiln delegate is device memory (a device-resident program, see
//     examples/device_resident): execute() returns as soon as the work is enqueued; the GPU may
//     still be running it. The outputs are ready once the caller's stream reaches that point: wait
//     with cudaStreamSynchronize(stream), or cudaEventRecord(event, stream) then
//     cudaEventSynchronize(event) / cudaStreamWaitEvent(other_stream, event). Host inputs, if any,
//     have been read before execute() returns, so their memory may be reused at once.
//     One exception: a delegate that checks indices on the device (embedding, index_select) waits
//     for the stream before returning, so that an out-of-range index is reported as an error.
//   * Any output of the Kiln delegate is host memory (the default export, where et_copy operators
//     move data): execute() returns after the stream has finished, and host outputs are ready.
//   * On an error, nothing Kiln enqueued is still running when execute() returns.
//
// Threads: the stream is per thread (thread_local), so threads running different methods can
// each use their own stream. The caller keeps the stream alive while it is set. Device pointers
// passed to Kiln must be cudaMalloc'd memory on the delegate's device.
#pragma once

struct CUstream_st;  // cudaStream_t is CUstream_st*; this header does not need the CUDA headers

#if defined(__GNUC__)
#define KILN_EXECUTORCH_API __attribute__((visibility("default")))
#else
#define KILN_EXECUTORCH_API
#endif

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
