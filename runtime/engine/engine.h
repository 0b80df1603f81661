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
#include <vector>

#include "format/blob_format.h"

struct CUstream_st;  // cudaStream_t without including the CUDA headers here

namespace kiln::engine {

struct WeightsView;  // blob_reader.h

/// How an engine's program state (kState tensors) is shared with other engines: `keys[i]` names
/// the blob's i-th distinct state (format/state_keys.h) and `scope` is the loaded program they
/// belong to; engines of one scope that name the same key use one device buffer
/// (shared_state.h). A null scope or no keys: the engine's state is its own.
struct StateSharing {
  const void* scope = nullptr;
  const std::vector<std::string>* keys = nullptr;  // borrowed for the duration of create()
  std::string who;                                 // for messages: the method name
};

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
  /// `device_index`, makes the weights resident (through the process-wide weight cache: a tensor
  /// whose bytes are already on that device for another engine is shared, not uploaded again), allocates the activation arena and creates the
  /// engine's stream and library handles. The blob is copied where needed: the caller may free it
  /// when this returns. On failure returns an Error and logs one line naming the cause:
  /// InvalidProgram for a malformed blob, DelegateInvalidCompatibility for another format
  /// version, NotFound when there is no usable CUDA device, MemoryAllocationFailed when the device
  /// is out of memory. Nothing is leaked on any failure path.
  ///
  /// A blob whose weights are external (blob::kFlagExternalWeights, a variant of a variant set)
  /// needs `external_weights`: the set's shared weights section, validated against and uploaded
  /// like a blob's own; the caller may free it when this returns too.
  ///
  /// `sharing` (optional) names the blob's states so engines of one program share them: a state
  /// another engine of the scope already holds is used as it is (its current contents, not the
  /// initial value); a different dtype or shape for it is InvalidProgram with a log line, and so
  /// is a key count that differs from the blob's number of states.
  static executorch::runtime::Result<std::unique_ptr<Engine>> create(
      const void* blob, size_t nbytes, int device_index = 0,
      const WeightsView* external_weights = nullptr, const StateSharing* sharing = nullptr);
  virtual ~Engine() = default;

  virtual size_t num_inputs() const = 0;
  virtual size_t num_outputs() const = 0;
  virtual IoSpec input(size_t i) const = 0;
  virtual IoSpec output(size_t i) const = 0;

  /// Runs the engine. Host inputs are copied to the device and host outputs back on the engine's
  /// stream; device bindings are used in place. Sizes are checked against input()/output().
  /// Returns after the work is enqueued on `stream` and, when any output binding is host memory
  /// or the engine checks indices on the device (embedding), after that stream has finished.
  /// With a null `stream` the engine runs on its own stream and always returns after it has
  /// finished (kiln/executorch/stream.h states this contract for callers). Kernel failures
  /// surface as Error::Internal with a log line naming the op; the engine stays usable.
  /// Threading: one engine runs one execute() at a time (its arena, staging buffers and CUDA
  /// graph serve every run), so calls on one engine must not overlap; different engines share no
  /// mutable state and may execute concurrently from different threads.
  /// Profiling (profile.h; kiln_executorch_set_profiling): while it is on, a run outside a
  /// caller's stream capture is eager (no graph replay), records a CUDA event between ops and
  /// returns after its stream has finished.
  virtual executorch::runtime::Error execute(executorch::runtime::Span<const Binding> inputs,
                                             executorch::runtime::Span<const Binding> outputs,
                                             CUstream_st* stream = nullptr) = 0;

  /// How init chose its convolution algorithms: taken from the persistent algorithm cache
  /// (algo_cache.h) or searched by timing on the device.
  struct AlgoChoices {
    size_t from_cache = 0;
    size_t searched = 0;
  };
  virtual AlgoChoices algo_choices() const = 0;

  /// Ops whose work runs inside another op's kernel, decided at init (a layer norm or a gated
  /// activation folded into the GEMV that reads it: KILN_GEMV_NORM, KILN_GEMV_GLU; the ropes and
  /// KV-cache writes after the first of a rope-and-append group: KILN_ROPE_APPEND). Their
  /// profile rows show no time of their own.
  virtual size_t folded_ops() const = 0;
};

/// Device memory held by the live engines of this process, over all devices, in bytes.
struct DeviceMemoryStats {
  /// Weight tensors resident on the device, each distinct tensor once however many engines (methods,
  /// delegates, programs) share it.
  uint64_t weight_bytes = 0;
  /// Device memory allocated for them: weight_bytes plus the alignment padding between packed
  /// small tensors.
  uint64_t weight_allocated_bytes = 0;
  /// Distinct weight regions resident: a tensor, or a tensor together with its views.
  uint64_t weight_tensors = 0;
  /// The sum over live engines of the weight bytes each uses: what the engines would hold without
  /// sharing. weight_requested_bytes - weight_bytes is what sharing saves.
  uint64_t weight_requested_bytes = 0;
  /// Per-engine activation memory: arenas, input/output staging buffers, library workspaces.
  uint64_t activation_bytes = 0;
};

/// A snapshot of the totals; cheap and safe to call from any thread at any time.
DeviceMemoryStats device_memory_stats();

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
