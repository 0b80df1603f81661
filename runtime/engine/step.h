// The executor's unit of work: one op of the graph, prepared once at init (shapes simplified,
// library descriptors and algorithms chosen) and enqueued on every run. Each kernel family
// (kernels/*.cuh) provides the factory for its opcode(s).
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>
#include <cudnn.h>
#include <executorch/runtime/core/error.h>
#include <executorch/runtime/core/result.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "runtime/engine/algo_cache.h"
#include "format/graph.h"

namespace kiln::engine {

/// Device-side record of the first out-of-range index of a run (embedding, gather, index_put...).
/// The executor clears it before the ops run and reads it back afterwards.
struct DeviceErrorFlag {
  unsigned long long op_plus_one;  // 0: no error; otherwise the failing op's index + 1
  long long index;                 // the offending index value
  long long position;              // where it sits in the indices tensor
  long long tensor;                // which of the op's index tensors (kScatter's indices[k])
};

/// What a step may use while it is being prepared.
struct InitContext {
  const Graph& graph;
  size_t op_index;
  cublasLtHandle_t lt;  // null unless the graph has a matmul
  cudnnHandle_t cudnn;  // null unless the graph has a conv2d
  /// Alignment in bytes that each tensor's device address has on every run, by tensor id.
  const std::vector<uint32_t>& alignment;
  /// KILN_AUTOTUNE=1: steps with a choice of library algorithm time the candidates and keep the
  /// fastest, remembered in `algos` (from earlier loads of this blob on this kind of device).
  bool autotune;
  AlgoCache& algos;
  cudaStream_t stream;  // the engine's own stream, for searches that run the library at init
};

/// What a step uses while it is being enqueued.
struct RunContext {
  cudaStream_t stream;
  void* const* tensors;  // device address of each tensor for this run, by tensor id
  cublasLtHandle_t lt;
  cudnnHandle_t cudnn;
  void* workspace;  // shared by all steps; they run one after another on one stream
  size_t workspace_bytes;
  DeviceErrorFlag* error_flag;
  int max_blocks;  // grid size that fills the device for a grid-stride loop of 256 threads
  size_t op_index;

  template <typename T = void>
  T* ptr(int64_t id) const {
    return static_cast<T*>(tensors[id]);
  }
};

class Step {
 public:
  virtual ~Step() = default;

  /// Enqueues the op on ctx.stream. Must not synchronise or allocate: it may run under stream
  /// capture. Launch errors are picked up by the executor after the call; errors a library
  /// returns are logged here with the op index and returned.
  virtual executorch::runtime::Error enqueue(const RunContext& ctx) = 0;

  /// Bytes of the shared workspace this step needs.
  virtual size_t workspace_bytes() const { return 0; }
};

using StepResult = executorch::runtime::Result<std::unique_ptr<Step>>;

/// The alignment an address of alignment `base` keeps `offset_bytes` further on (base or less).
inline uint32_t min_alignment(uint32_t base, int64_t offset_bytes) {
  uint32_t align = base;
  while (align > 1 && offset_bytes % align != 0) {
    align /= 2;
  }
  return align;
}

/// Bytes `address` is aligned to, capped at 256 (what cudaMalloc guarantees).
inline uint32_t alignment_of(const void* address) {
  return min_alignment(256, static_cast<int64_t>(reinterpret_cast<uintptr_t>(address) % 256));
}

}  // namespace kiln::engine
