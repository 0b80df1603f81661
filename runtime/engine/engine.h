// The Kiln engine: one validated blob made runnable on one CUDA device. KilnBackend owns one Engine
// per delegate instance; nothing here knows about ExecuTorch's EValues.
#pragma once

#include <executorch/runtime/core/error.h>
#include <executorch/runtime/core/result.h>
#include <executorch/runtime/core/span.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "runtime/engine/blob_format.h"

struct CUstream_st;  // cudaStream_t without including the CUDA headers here

namespace kiln::engine {

/// One delegate argument as the runtime hands it over.
struct Binding {
  void* data = nullptr;       // host or device pointer; borrowed for the duration of execute()
  size_t nbytes = 0;          // bytes available at `data`
  bool on_device = false;     // true: `data` is device memory on the engine's device
};

/// Shape and dtype of a delegate input or output, as the blob declares it.
struct IoSpec {
  blob::DType dtype;
  uint32_t rank;
  const int64_t* sizes;       // `rank` entries, owned by the Engine
  size_t nbytes;
};

class Engine {
 public:
  /// Validates `blob` (every offset, extent, tensor id and operand count) and, if valid, selects
  /// `device_index`, uploads the weights once, allocates the activation arena and creates the
  /// engine's stream and library handles. The blob is copied where needed: the caller may free it
  /// when this returns. On failure returns an Error and logs one line naming the cause:
  /// InvalidProgram for a malformed blob, DelegateInvalidCompatibility for another format
  /// version, NotFound when there is no usable CUDA device, MemoryAllocationFailed when the device
  /// is out of memory. Nothing is leaked on any failure path.
  static executorch::runtime::Result<std::unique_ptr<Engine>> create(const void* blob,
                                                                     size_t nbytes,
                                                                     int device_index = 0);
  virtual ~Engine() = default;

  virtual size_t num_inputs() const = 0;
  virtual size_t num_outputs() const = 0;
  virtual IoSpec input(size_t i) const = 0;
  virtual IoSpec output(size_t i) const = 0;

  /// Runs the engine. Host inputs are copied to the device and host outputs back on the engine's
  /// stream; device bindings are used in place. Sizes are checked against input()/output().
  /// Returns after the work is enqueued on `stream` (the engine's own stream when null) and,
  /// when any output binding is host memory, after that stream has finished. Kernel failures
  /// surface as Error::Internal with a log line naming the op.
  virtual executorch::runtime::Error execute(executorch::runtime::Span<const Binding> inputs,
                                             executorch::runtime::Span<const Binding> outputs,
                                             CUstream_st* stream = nullptr) = 0;
};

/// Host<->device bytes copied by execute() of every engine in the process since it started:
/// input uploads, output downloads and the error-flag read-back of range-checked graphs. Weights
/// and initial state uploaded at init are not counted. Program state (kState tensors) stays on
/// the device, so it never appears here.
struct CopyCounters {
  uint64_t host_to_device_bytes;
  uint64_t device_to_host_bytes;
  uint64_t executes;  // execute() calls that reached the device
};
CopyCounters copy_counters();

/// Why there is no usable CUDA device here, or an empty string when there is one. Cheap after the
/// first call (the answer is cached).
const std::string& cuda_unavailable_reason();

}  // namespace kiln::engine
