// The Engine implementation's shared declarations, internal to runtime/engine (not installed):
// the device state, the CudaEngine class whose members are defined by job in engine_init.cu
// (setup and device resources), engine_execute.cu (binding and execution), engine_graph.cu (CUDA
// graph capture and replay) and engine_profile.cu (per-op profiling), and the step registry
// (step_registry.cu) that turns each op into its kernel family's Step.
#pragma once

#include <cuda_runtime.h>
#include <executorch/runtime/core/error.h>
#include <executorch/runtime/core/span.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "runtime/engine/content_hash.h"
#include "runtime/engine/device.h"
#include "runtime/engine/engine.h"
#include "format/graph.h"
#include "runtime/engine/kernels/conv2d.cuh"
#include "runtime/engine/kernels/matmul.cuh"
#include "runtime/engine/profile.h"
#include "runtime/engine/step.h"
#include "runtime/engine/weight_cache.h"

namespace kiln::engine {

/// The Step that runs `op`, from its kernel family's factory (step_registry.cu); InvalidProgram
/// for an opcode no family handles.
StepResult make_step(const Op& op, const InitContext& ctx);

/// Whether `e` says a stream capture went wrong rather than the launch itself (engine_graph.cu).
bool is_capture_error(cudaError_t e);

// Everything the engine holds on the device. Members are destroyed in reverse order: the graph
// and the steps (library descriptors) before the handles, the handles before the memory.
struct DeviceState {
  EngineWeights weights;  // shared with other engines through the weight cache
  DeviceBuffer arena;
  DeviceBuffer state;  // kState tensors of this engine alone: kept across runs, not in the arena
  std::vector<std::shared_ptr<void>> shared_states;  // named states (shared_state.h), by order
  DeviceBuffer workspace;
  std::vector<DeviceBuffer> input_staging;
  std::vector<DeviceBuffer> output_staging;
  DeviceBuffer error_flag;  // DeviceErrorFlag, only when the graph has range-checked ops
  PinnedBuffer error_host;  // where the flag is read back
  UniqueStream stream;
  UniqueEvent done;  // recorded at the end of each run on the stream it used
  kernels::UniqueCublasLt lt;
  kernels::UniqueCudnn cudnn;
  std::vector<std::unique_ptr<Step>> steps;
  UniqueGraphExec graph_exec;
  std::vector<UniqueEvent> profile_events;  // ops + 1 timing events, made on the first profiled run
};

// One engine runs one execute() at a time (the arena, staging buffers and captured graph are
// shared by all runs); successive runs may use different streams and are ordered by an event.
// Graphs with an embedding or index_put op synchronise at the end of every run to report
// out-of-range indices, except under a caller's stream capture, where they cannot be read back.
// State tensors keep their device addresses for the engine's lifetime, so a captured graph stays
// valid across runs; the ops in it are not pure (index_put writes state that later ops and runs
// read), which the single stream's order preserves.
class CudaEngine final : public Engine {
 public:
  using Error = executorch::runtime::Error;
  template <typename T>
  using Span = executorch::runtime::Span<T>;

  CudaEngine(Graph graph, int device, bool autotune, Hash128 graph_hash, StateSharing sharing)
      : graph_(std::move(graph)), device_(device), autotune_(autotune), graph_hash_(graph_hash),
        sharing_(std::move(sharing)) {
    if (sharing_.keys != nullptr) state_keys_ = *sharing_.keys;
    sharing_.keys = nullptr;  // borrowed only during create(); state_keys_ is the copy
  }

  ~CudaEngine() override;  // waits for the last run, then frees (engine_init.cu)

  // Setup (engine_init.cu): device resources, program state and one Step per op.
  Error init();
  Error init_state(DeviceState& s);
  Error acquire_shared_state(DeviceState& s, const Tensor& t, size_t ordinal, void** at);

  size_t num_inputs() const override { return graph_.inputs.size(); }
  size_t num_outputs() const override { return graph_.outputs.size(); }

  IoSpec input(size_t i) const override {
    return i < graph_.inputs.size() ? spec(graph_.inputs[i]) : IoSpec{};
  }

  IoSpec output(size_t i) const override {
    return i < graph_.outputs.size() ? spec(graph_.outputs[i]) : IoSpec{};
  }

  Error execute(Span<const Binding> inputs, Span<const Binding> outputs,
                CUstream_st* stream) override;

  AlgoChoices algo_choices() const override { return {algo_cache_hits_, algo_cache_misses_}; }
  size_t folded_ops() const override { return folded_ops_; }

 private:
  IoSpec spec(int64_t id) const {
    const Tensor& t = graph_.tensors[id];
    return {t.dtype, t.rank, t.sizes, t.nbytes};
  }

  // Binding and execution (engine_execute.cu).
  Error check_bindings(Span<const Binding> bindings, const std::vector<int64_t>& ids,
                       const char* role) const;
  Error bind(Span<const Binding> inputs, Span<const Binding> outputs);
  Error check_device_pointer(const Binding& binding, const char* role, size_t index) const;
  Error run(Span<const Binding> inputs, Span<const Binding> outputs, cudaStream_t stream,
            bool external_capture);
  Error enqueue_ops(cudaStream_t stream);
  Error enqueue_step(size_t i, const RunContext& ctx);
  Error range_error() const;
  // Per-op profiling (engine_profile.cu).
  Error start_profile();
  Error finish_profile(cudaStream_t stream, std::chrono::steady_clock::time_point started);
  // CUDA graph capture and replay (engine_graph.cu).
  Error launch_graph(cudaStream_t stream);
  Error capture();

  Graph graph_;
  int device_;
  bool autotune_;       // KILN_AUTOTUNE=1 when the engine was created
  Hash128 graph_hash_;  // of the blob without its weights: the algorithm cache's key (autotune_)
  StateSharing sharing_;                // scope and method name; keys in state_keys_
  std::vector<std::string> state_keys_;  // names of the distinct states, in offset order
  int max_blocks_ = 0;
  bool has_range_checks_ = false;  // ops that read indices on the device: a DeviceErrorFlag per run
  std::unique_ptr<DeviceState> state_;
  uint64_t activation_bytes_ = 0;  // counted in device_memory_stats() while state_ lives
  size_t algo_cache_hits_ = 0;
  size_t algo_cache_misses_ = 0;
  size_t folded_ops_ = 0;

  std::vector<void*> tensor_ptrs_;    // device address of every tensor for the current run
  std::vector<void*> state_ptrs_;     // device address of each kState tensor, by tensor id
  std::vector<void*> io_ptrs_;        // inputs then outputs, as bound for the current run
  std::vector<void*> checked_ptrs_;   // io_ptrs_ whose device bindings were last validated
  std::vector<void*> captured_ptrs_;  // io_ptrs_ the graph was captured with
  cudaStream_t last_stream_ = nullptr;
  uint64_t runs_ = 0;
  bool graphs_disabled_ = false;
  bool empty_graph_ = false;  // the last capture recorded no work
  bool launch_failed_ = false;  // the last enqueue_ops stopped at a kernel launch CUDA rejected
  bool capturing_ = false;      // enqueue_ops is recording into the engine's own capture
  int capture_failures_ = 0;    // captures in a row that failed for reasons outside the ops
  bool profiling_run_ = false;  // this run times each op (profile.h): eager, with events
  std::shared_ptr<profile::EngineRecord> profile_;  // registered on the first profiled run
};

}  // namespace kiln::engine
