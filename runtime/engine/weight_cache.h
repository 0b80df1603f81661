// The process-wide device weight cache. Every kWeight tensor an engine needs is looked up by
// (device, content hash, byte count); identical bytes already resident on that device are shared
// instead of uploaded again, so two methods (or two programs) holding the same Linear keep one
// copy on the GPU. Engines own their weights through shared pointers: a tensor's memory is freed
// when the last engine using it is destroyed. Safe to use from several threads at once.
// Sharing is sound because weights are read-only: read_blob refuses a blob with an op that writes
// a kWeight tensor. State an engine writes must never live in kWeight storage.
#pragma once

#include <executorch/runtime/core/result.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "runtime/engine/engine.h"
#include "format/graph.h"

namespace kiln::engine {

/// The weights one engine uses: a device pointer per tensor id (null for tensors that are not
/// kWeight) and the shared ownership that keeps them resident. Counted in
/// DeviceMemoryStats::weight_requested_bytes while it lives.
class EngineWeights {
 public:
  EngineWeights() = default;
  EngineWeights(EngineWeights&& other) noexcept;
  EngineWeights& operator=(EngineWeights&& other) noexcept;
  EngineWeights(const EngineWeights&) = delete;
  EngineWeights& operator=(const EngineWeights&) = delete;
  ~EngineWeights();

  void* pointer(size_t tensor_id) const {
    return tensor_id < pointers_.size() ? pointers_[tensor_id] : nullptr;
  }

 private:
  friend executorch::runtime::Result<EngineWeights> acquire_weights(const Graph& graph,
                                                                    int device);
  std::vector<void*> pointers_;
  std::vector<std::shared_ptr<void>> holds_;  // one per distinct tensor this engine uses
  uint64_t requested_bytes_ = 0;
};

/// Makes every kWeight tensor of `graph` resident on `device` (the current device), reading the
/// bytes through graph.weights / graph.weights_size only, and returns the engine's pointers.
/// MemoryAllocationFailed when the device is out of memory, Internal when an upload fails; what
/// was acquired before the failure is released.
executorch::runtime::Result<EngineWeights> acquire_weights(const Graph& graph, int device);

/// Adds (or, with a negative delta, removes) activation memory to the process totals.
void count_activation_bytes(int64_t delta);

}  // namespace kiln::engine
