// Binding and execution: CudaEngine::execute checks the bindings, binds inputs and outputs to
// tensor addresses, stages host bindings, runs the steps (eagerly, or as the captured CUDA graph
// of engine_graph.cu) and reports device-side range errors; and the process-wide copy counters.
#include <cuda_runtime.h>
#include <executorch/runtime/platform/log.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <string>
#include <variant>
#include <vector>

#include "runtime/engine/cuda_check.h"
#include "runtime/engine/cuda_engine.h"
#include "runtime/engine/device.h"
#include "format/fail.h"
#include "runtime/engine/profile.h"
#include "runtime/engine/step.h"
#ifdef KILN_ENGINE_FAULT_INJECTION
#include "runtime/engine/fault_injection.h"
#endif

namespace kiln::engine {
namespace {

using executorch::runtime::Error;
using executorch::runtime::Result;
using executorch::runtime::Span;

// Replay the op sequence as a CUDA graph from the second run on: one launch instead of one per
// op. The first run is eager, so lazy module loading and library initialisation never happen
// under capture. Turning this off runs every op eagerly, every time.
constexpr bool kUseCudaGraphs = true;

// Bytes every engine in the process copied between host and device in execute(), for
// copy_counters().
std::atomic<uint64_t> g_host_to_device_bytes{0};
std::atomic<uint64_t> g_device_to_host_bytes{0};
std::atomic<uint64_t> g_executes{0};

std::string shape_text(const Tensor& t) {
  std::string s = "[";
  for (uint32_t d = 0; d < t.rank; ++d) {
    s += (d == 0 ? "" : ", ") + std::to_string(t.sizes[d]);
  }
  return s + "]";
}

}  // namespace

using executorch::runtime::Error;
using executorch::runtime::Span;

Error CudaEngine::check_bindings(Span<const Binding> bindings, const std::vector<int64_t>& ids,
                                 const char* role) const {
  if (bindings.size() != ids.size()) {
    return fail(nullptr, Error::InvalidArgument,
                "Kiln engine: execute got %zu %ss, but the blob declares %zu", bindings.size(),
                role, ids.size());
  }
  for (size_t i = 0; i < ids.size(); ++i) {
    const Tensor& t = graph_.tensors[ids[i]];
    if (bindings[i].nbytes != t.nbytes) {
      return fail(nullptr, Error::InvalidArgument,
                  "Kiln engine: %s %zu is %zu bytes, but the blob declares %llu bytes (%s %s)",
                  role, i, bindings[i].nbytes, static_cast<unsigned long long>(t.nbytes),
                  dtype_name(t.dtype), shape_text(t).c_str());
    }
    if (bindings[i].data == nullptr && t.nbytes > 0) {
      return fail(nullptr, Error::InvalidArgument, "Kiln engine: %s %zu has a null data pointer",
                  role, i);
    }
  }
  return Error::Ok;
}

Error CudaEngine::check_device_pointer(const Binding& binding, const char* role,
                                       size_t index) const {
  cudaPointerAttributes attributes{};
  const cudaError_t status = cudaPointerGetAttributes(&attributes, binding.data);
  if (status != cudaSuccess) {
    return cuda_status(
        status, Error::InvalidArgument,
        "Kiln engine: %s %zu is marked on_device, but CUDA does not know its pointer", role, index);
  }
  if (attributes.type == cudaMemoryTypeUnregistered) {
    return fail(nullptr, Error::InvalidArgument,
                "Kiln engine: %s %zu is marked on_device, but it is ordinary host memory", role,
                index);
  }
  if (attributes.type == cudaMemoryTypeDevice && attributes.device != device_) {
    return fail(nullptr, Error::InvalidArgument,
                "Kiln engine: %s %zu is memory of CUDA device %d, but the engine runs on device %d",
                role, index, attributes.device, device_);
  }
  return Error::Ok;
}

Error CudaEngine::bind(Span<const Binding> inputs, Span<const Binding> outputs) {
  const size_t ni = inputs.size();
  io_ptrs_.resize(ni + outputs.size());
  for (size_t i = 0; i < ni; ++i) {
    io_ptrs_[i] = inputs[i].on_device ? inputs[i].data : state_->input_staging[i].get();
  }
  for (size_t o = 0; o < outputs.size(); ++o) {
    io_ptrs_[ni + o] = outputs[o].on_device ? outputs[o].data : state_->output_staging[o].get();
  }
  // Validating a device pointer costs a driver call; do it only when the bound set changes.
  if (io_ptrs_ != checked_ptrs_) {
    for (size_t i = 0; i < ni; ++i) {
      if (inputs[i].on_device && inputs[i].nbytes > 0) {
        KILN_TRY(check_device_pointer(inputs[i], "input", i));
      }
    }
    for (size_t o = 0; o < outputs.size(); ++o) {
      if (outputs[o].on_device && outputs[o].nbytes > 0) {
        KILN_TRY(check_device_pointer(outputs[o], "output", o));
      }
    }
    checked_ptrs_ = io_ptrs_;
  }
  for (size_t t = 0; t < graph_.tensors.size(); ++t) {
    const Tensor& tensor = graph_.tensors[t];
    if (tensor.storage == blob::Storage::kInput) {
      tensor_ptrs_[t] = io_ptrs_[tensor.offset];
    } else if (tensor.storage == blob::Storage::kOutput) {
      tensor_ptrs_[t] = io_ptrs_[ni + tensor.offset];
    }
  }
  return Error::Ok;
}

Error CudaEngine::execute(Span<const Binding> inputs, Span<const Binding> outputs,
                          CUstream_st* stream) {
  KILN_TRY(check_bindings(inputs, graph_.inputs, "input"));
  KILN_TRY(check_bindings(outputs, graph_.outputs, "output"));
  ScopedDevice guard(device_);
  KILN_TRY(guard.status());
  cudaStream_t target = stream != nullptr ? stream : state_->stream.get();
  cudaStreamCaptureStatus capture_status = cudaStreamCaptureStatusNone;
  KILN_TRY(cuda_status(cudaStreamIsCapturing(target, &capture_status), Error::InvalidArgument,
                       "Kiln engine: cannot query the stream passed to execute"));
  const bool external_capture = capture_status != cudaStreamCaptureStatusNone;
  if (external_capture) {
    for (const Span<const Binding>& set : {inputs, outputs}) {
      for (const Binding& b : set) {
        if (!b.on_device && b.nbytes > 0) {
          return fail(nullptr, Error::InvalidArgument,
                      "Kiln engine: execute on a stream that is being captured needs device "
                      "bindings only; a %zu-byte binding is host memory",
                      b.nbytes);
        }
      }
    }
  }
  (void)cudaGetLastError();  // a failure left behind by other code is not this run's
  KILN_TRY(bind(inputs, outputs));
  const Error err = run(inputs, outputs, target, external_capture);
  if (err != Error::Ok && !external_capture) {
    // Nothing this run enqueued may still be running when the caller reacts to the error.
    cudaStreamSynchronize(target);
    (void)cudaGetLastError();
  }
  return err;
}

Error CudaEngine::run(Span<const Binding> inputs, Span<const Binding> outputs, cudaStream_t stream,
                      bool external_capture) {
  DeviceState& s = *state_;
  // Profiling (profile.h) is one branch here when off. A caller's capture is never timed: its
  // graph runs later, where events between ops would time nothing.
  profiling_run_ = profile::enabled() && !external_capture;
  std::chrono::steady_clock::time_point started{};
  if (profiling_run_) {
    started = std::chrono::steady_clock::now();
    KILN_TRY(start_profile());
  }
  if (!external_capture && last_stream_ != nullptr) {
    // The previous run shares the arena with this one and may have used another stream (or one
    // since destroyed and reallocated at the same address): order after it (nearly free when it has
    // finished).
    KILN_TRY(cuda_status(cudaStreamWaitEvent(stream, s.done.get(), 0), Error::Internal,
                         "Kiln engine: cannot order this run after the previous one"));
  }
  g_executes.fetch_add(1, std::memory_order_relaxed);
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (!inputs[i].on_device && inputs[i].nbytes > 0) {
      KILN_TRY(cuda_status(cudaMemcpyAsync(s.input_staging[i].get(), inputs[i].data,
                                           inputs[i].nbytes, cudaMemcpyHostToDevice, stream),
                           Error::Internal, "Kiln engine: copying input %zu to the device", i));
      g_host_to_device_bytes.fetch_add(inputs[i].nbytes, std::memory_order_relaxed);
    }
  }
  if (kUseCudaGraphs && !profiling_run_ && !external_capture && !graphs_disabled_ && runs_ > 0 &&
      !s.steps.empty()) {
    KILN_TRY(launch_graph(stream));
  } else {
    KILN_TRY(enqueue_ops(stream));
  }
  bool host_output = false;
  for (size_t o = 0; o < outputs.size(); ++o) {
    if (!outputs[o].on_device && outputs[o].nbytes > 0) {
      host_output = true;
      KILN_TRY(cuda_status(cudaMemcpyAsync(outputs[o].data, s.output_staging[o].get(),
                                           outputs[o].nbytes, cudaMemcpyDeviceToHost, stream),
                           Error::Internal, "Kiln engine: copying output %zu to the host", o));
      g_device_to_host_bytes.fetch_add(outputs[o].nbytes, std::memory_order_relaxed);
    }
  }
  ++runs_;
  if (external_capture) {
    return Error::Ok;  // the caller's graph runs later; range errors cannot be read back here
  }
  if (has_range_checks_) {
    KILN_TRY(cuda_status(cudaMemcpyAsync(s.error_host.get(), s.error_flag.get(),
                                         sizeof(DeviceErrorFlag), cudaMemcpyDeviceToHost, stream),
                         Error::Internal, "Kiln engine: reading back the error flag"));
    g_device_to_host_bytes.fetch_add(sizeof(DeviceErrorFlag), std::memory_order_relaxed);
  }
  KILN_TRY(cuda_status(cudaEventRecord(s.done.get(), stream), Error::Internal,
                       "Kiln engine: cannot record the end of the run"));
  last_stream_ = stream;
  // On its own stream the engine always finishes the run: the caller cannot wait on that stream.
  if (host_output || has_range_checks_ || stream == s.stream.get()) {
    KILN_TRY(cuda_status(cudaStreamSynchronize(stream), Error::Internal,
                         "Kiln engine: the run failed on device %d", device_));
    if (has_range_checks_) {
      KILN_TRY(range_error());
    }
  }
  if (profiling_run_) {
    KILN_TRY(finish_profile(stream, started));
  }
  return Error::Ok;
}

Error CudaEngine::enqueue_ops(cudaStream_t stream) {
  DeviceState& s = *state_;
  launch_failed_ = false;
  RunContext ctx{stream,
                 tensor_ptrs_.data(),
                 s.lt.get(),
                 s.cudnn.get(),
                 s.workspace.get(),
                 s.workspace.size(),
                 static_cast<DeviceErrorFlag*>(s.error_flag.get()),
                 max_blocks_,
                 0};
  if (has_range_checks_) {
    KILN_TRY(cuda_status(cudaMemsetAsync(s.error_flag.get(), 0, sizeof(DeviceErrorFlag), stream),
                         Error::Internal, "Kiln engine: clearing the error flag"));
  }
  for (size_t i = 0; i < s.steps.size(); ++i) {
    ctx.op_index = i;
    if (profiling_run_) {
      KILN_TRY(cuda_status(cudaEventRecord(s.profile_events[i].get(), stream), Error::Internal,
                           "Kiln engine: op %zu: cannot record the profiling event", i));
    }
    KILN_TRY(enqueue_step(i, ctx));
    const cudaError_t launched = cudaGetLastError();
    if (launched != cudaSuccess) {
      // Once a capture is invalidated (by another thread's synchronising call, say), every later
      // launch into it fails: that is the capture's failure, which launch_graph recovers from,
      // not the op's.
      launch_failed_ = !is_capture_error(launched);
      if (capturing_ && !launch_failed_) {
        ET_LOG(Info, "Kiln engine: op %zu (%s): the CUDA graph capture was invalidated: %s", i,
               opcode_name(graph_.ops[i].opcode), cudaGetErrorName(launched));
        return Error::Internal;
      }
      return cuda_status(launched, Error::Internal,
                         "Kiln engine: op %zu (%s): kernel launch failed", i,
                         opcode_name(graph_.ops[i].opcode));
    }
  }
  if (profiling_run_ && !s.steps.empty()) {
    KILN_TRY(cuda_status(cudaEventRecord(s.profile_events[s.steps.size()].get(), stream),
                         Error::Internal, "Kiln engine: cannot record the profiling event"));
  }
  return Error::Ok;
}

Error CudaEngine::enqueue_step(size_t i, const RunContext& ctx) {
#ifdef KILN_ENGINE_FAULT_INJECTION
  // Test builds only: an armed op's work becomes a launch CUDA rejects, so the launch check in
  // enqueue_ops reports a real launch error the way it reports any other.
  if (fault::take_launch_failure(i)) {
    fault::launch_rejected_kernel(ctx.stream);
    return Error::Ok;
  }
#endif
  return state_->steps[i]->enqueue(ctx);
}

Error CudaEngine::range_error() const {
  const auto& flag = *static_cast<const DeviceErrorFlag*>(state_->error_host.get());
  if (flag.op_plus_one == 0) {
    return Error::Ok;
  }
  const size_t op = static_cast<size_t>(flag.op_plus_one - 1);
  if (op < graph_.ops.size() && graph_.ops[op].opcode == blob::Opcode::kIndexPut) {
    return fail(nullptr, Error::InvalidArgument,
                "Kiln engine: op %zu (index_put): position %lld (element %lld of the positions "
                "tensor) is outside [0, %lld); the state was left unchanged. Pass positions "
                "inside the state's length (e.g. the KV cache's max sequence length)",
                op, flag.index, flag.position,
                static_cast<long long>(std::get<IndexPutArgs>(graph_.ops[op].args).dim_size));
  }
  if (op < graph_.ops.size() && graph_.ops[op].opcode == blob::Opcode::kGather) {
    const long long size = static_cast<long long>(std::get<GatherArgs>(graph_.ops[op].args).dim_size);
    return fail(nullptr, Error::InvalidArgument,
                "Kiln engine: op %zu (gather): index out of range: index %lld (element %lld of "
                "the index tensor) is outside [-%lld, %lld); zeros were written in its place",
                op, flag.index, flag.position, size, size);
  }
  if (op < graph_.ops.size() && graph_.ops[op].opcode == blob::Opcode::kScatter) {
    const auto& a = std::get<ScatterArgs>(graph_.ops[op].args);
    const long long size =
        flag.tensor >= 0 && flag.tensor < a.num_indices ? a.dim_sizes[flag.tensor] : -1;
    return fail(nullptr, Error::InvalidArgument,
                "Kiln engine: op %zu (index_put): index out of range: index %lld (element %lld "
                "of index tensor %lld) is outside [-%lld, %lld); that element was not written",
                op, flag.index, flag.position, flag.tensor, size, size);
  }
  if (op < graph_.ops.size() && graph_.ops[op].opcode == blob::Opcode::kEmbeddingBag) {
    const auto& a = std::get<EmbeddingBagArgs>(graph_.ops[op].args);
    if (flag.position < 0) {
      return fail(nullptr, Error::InvalidArgument,
                  "Kiln engine: op %zu (embedding_bag): bag %lld reaches offset %lld, outside "
                  "[0, %lld] (offsets must rise within the indices); zeros were written for it",
                  op, -1 - flag.position, flag.index, static_cast<long long>(a.num_indices));
    }
    return fail(nullptr, Error::InvalidArgument,
                "Kiln engine: op %zu (embedding_bag): index %lld at position %lld is outside "
                "[0, %lld); the row was left out of its bag",
                op, flag.index, flag.position, static_cast<long long>(a.vocab));
  }
  const int64_t vocab = op < graph_.ops.size() && graph_.ops[op].opcode == blob::Opcode::kEmbedding
                            ? std::get<EmbeddingArgs>(graph_.ops[op].args).vocab
                            : -1;
  return fail(nullptr, Error::InvalidArgument,
              "Kiln engine: op %zu (embedding): embedding index out of range: index %lld at "
              "position %lld is outside [0, %lld)",
              op, flag.index, flag.position, static_cast<long long>(vocab));
}

CopyCounters copy_counters() {
  return {g_host_to_device_bytes.load(std::memory_order_relaxed),
          g_device_to_host_bytes.load(std::memory_order_relaxed),
          g_executes.load(std::memory_order_relaxed)};
}

}  // namespace kiln::engine
