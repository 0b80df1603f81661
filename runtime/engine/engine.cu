// The Engine implementation: device resources owned through RAII, one prepared Step per op, and
// an executor that stages host bindings, runs the steps (replayed as a CUDA graph after the first
// run) and reports device-side errors.
#include "runtime/engine/engine.h"

#include <cuda_runtime.h>
#include <executorch/runtime/platform/log.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "runtime/engine/algo_cache.h"
#include "runtime/engine/blob_reader.h"
#include "runtime/engine/content_hash.h"
#include "runtime/engine/cuda_check.h"
#include "runtime/engine/device.h"
#include "runtime/engine/fail.h"
#include "runtime/engine/kernels/conv2d.cuh"
#include "runtime/engine/kernels/copy.cuh"
#include "runtime/engine/kernels/elementwise.cuh"
#include "runtime/engine/kernels/embedding.cuh"
#include "runtime/engine/kernels/fill.cuh"
#include "runtime/engine/kernels/index_put.cuh"
#include "runtime/engine/kernels/layer_norm.cuh"
#include "runtime/engine/kernels/matmul.cuh"
#include "runtime/engine/kernels/pool2d.cuh"
#include "runtime/engine/kernels/reduce.cuh"
#include "runtime/engine/kernels/softmax.cuh"
#include "runtime/engine/profile.h"
#include "runtime/engine/step.h"
#ifdef KILN_ENGINE_FAULT_INJECTION
#include "runtime/engine/fault_injection.h"
#endif
#include "runtime/engine/weight_cache.h"

namespace kiln::engine {
namespace {

using executorch::runtime::Error;
using executorch::runtime::Result;
using executorch::runtime::Span;

// Replay the op sequence as a CUDA graph from the second run on: one launch instead of one per
// op. The first run is eager, so lazy module loading and library initialisation never happen
// under capture. Turning this off runs every op eagerly, every time.
constexpr bool kUseCudaGraphs = true;

// Captures that fail for reasons outside the ops (a library call that refuses capture, another
// thread's call invalidating it) run eagerly; after this many in a row the engine stops trying.
constexpr int kMaxCaptureFailures = 3;

// KILN_AUTOTUNE=1: time the library ops' candidate algorithms at init (kernels/autotune.cuh).
bool autotune_enabled() {
  const char* env = std::getenv("KILN_AUTOTUNE");
  return env != nullptr && std::strcmp(env, "1") == 0;
}

// The algorithm cache's device key: what an algorithm choice depends on besides the blob (the
// device model and the cuDNN, cuBLASLt and blob format versions).
std::string algo_cache_key(int device) {
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, device) != cudaSuccess) {
    (void)cudaGetLastError();
  }
  return "sm" + std::to_string(prop.major) + std::to_string(prop.minor) + "_" + prop.name +
         "_cudnn" + std::to_string(cudnnGetVersion()) + "_cublaslt" +
         std::to_string(cublasLtGetVersion()) + "_blob" + std::to_string(blob::kFormatVersion);
}

// Grid-stride kernels of 256 threads: 8 blocks fill an SM (2048 threads).
constexpr int kBlocksPerSm = 8;

StepResult make_step(const Op& op, const InitContext& ctx) {
  switch (op.opcode) {
    case blob::Opcode::kCopy: return kernels::make_copy_step(std::get<CopyArgs>(op.args), ctx);
    case blob::Opcode::kBinary:
      return kernels::make_binary_step(std::get<BinaryArgs>(op.args), ctx);
    case blob::Opcode::kUnary: return kernels::make_unary_step(std::get<UnaryArgs>(op.args), ctx);
    case blob::Opcode::kWhere: return kernels::make_where_step(std::get<WhereArgs>(op.args), ctx);
    case blob::Opcode::kMatmul:
      return kernels::make_matmul_step(std::get<MatmulArgs>(op.args), ctx);
    case blob::Opcode::kSoftmax:
      return kernels::make_softmax_step(std::get<SoftmaxArgs>(op.args), ctx);
    case blob::Opcode::kLayerNorm:
      return kernels::make_layer_norm_step(std::get<LayerNormArgs>(op.args), ctx);
    case blob::Opcode::kReduce:
      return kernels::make_reduce_step(std::get<ReduceArgs>(op.args), ctx);
    case blob::Opcode::kEmbedding:
      return kernels::make_embedding_step(std::get<EmbeddingArgs>(op.args), ctx);
    case blob::Opcode::kFill: return kernels::make_fill_step(std::get<FillArgs>(op.args), ctx);
    case blob::Opcode::kConv2d:
      return kernels::make_conv2d_step(std::get<Conv2dArgs>(op.args), ctx);
    case blob::Opcode::kPool2d:
      return kernels::make_pool2d_step(std::get<Pool2dArgs>(op.args), ctx);
    case blob::Opcode::kIndexPut:
      return kernels::make_index_put_step(std::get<IndexPutArgs>(op.args), ctx);
    case blob::Opcode::kFusedElementwise:
      return kernels::make_fused_elementwise_step(std::get<FusedElementwiseArgs>(op.args), ctx);
  }
  return fail(nullptr, Error::InvalidProgram, "Kiln engine: op %zu has unknown opcode %u",
              ctx.op_index, static_cast<unsigned>(op.opcode));
}

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

// Bytes every engine in the process copied between host and device in execute(), for
// copy_counters().
std::atomic<uint64_t> g_host_to_device_bytes{0};
std::atomic<uint64_t> g_device_to_host_bytes{0};
std::atomic<uint64_t> g_executes{0};

bool has_opcode(const Graph& graph, blob::Opcode opcode) {
  return std::any_of(graph.ops.begin(), graph.ops.end(),
                     [&](const Op& op) { return op.opcode == opcode; });
}

std::string shape_text(const Tensor& t) {
  std::string s = "[";
  for (uint32_t d = 0; d < t.rank; ++d) {
    s += (d == 0 ? "" : ", ") + std::to_string(t.sizes[d]);
  }
  return s + "]";
}

// The output tensor of an op for the profile's labels; an args struct without `out` has none.
template <typename Args, typename = void>
struct HasOut : std::false_type {};
template <typename Args>
struct HasOut<Args, std::void_t<decltype(std::declval<const Args&>().out)>> : std::true_type {};

// "Float32[1,64]": one word, so the profile's columns can be split on spaces.
std::string compact_text(const Tensor& t) {
  std::string s = std::string(dtype_name(t.dtype)) + "[";
  for (uint32_t d = 0; d < t.rank; ++d) {
    s += (d == 0 ? "" : ",") + std::to_string(t.sizes[d]);
  }
  return s + "]";
}

std::string op_output_text(const Graph& graph, const Op& op) {
  return std::visit(
      [&](const auto& args) -> std::string {
        if constexpr (HasOut<std::decay_t<decltype(args)>>::value) {
          if (args.out >= 0 && static_cast<size_t>(args.out) < graph.tensors.size()) {
            return compact_text(graph.tensors[args.out]);
          }
        }
        return "-";
      },
      op.args);
}

// Everything the engine holds on the device. Members are destroyed in reverse order: the graph
// and the steps (library descriptors) before the handles, the handles before the memory.
struct DeviceState {
  EngineWeights weights;  // shared with other engines through the weight cache
  DeviceBuffer arena;
  DeviceBuffer state;  // kState tensors: kept across runs, never part of the arena
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
  CudaEngine(Graph graph, int device, bool autotune, Hash128 graph_hash)
      : graph_(std::move(graph)), device_(device), autotune_(autotune), graph_hash_(graph_hash) {}

  ~CudaEngine() override {
    if (state_ == nullptr) {
      return;
    }
    ScopedDevice guard(device_);
    // A run may still be in flight on a caller's stream: wait for it (by event, not a device-wide
    // sync) before freeing what it uses.
    if (last_stream_ != nullptr) {
      cudaEventSynchronize(state_->done.get());
    }
    cudaStreamSynchronize(state_->stream.get());
    if (profile_ != nullptr) profile::remove_engine(profile_.get());
    state_.reset();
    count_activation_bytes(-static_cast<int64_t>(activation_bytes_));
  }

  Error init();
  Error init_state(DeviceState& s);

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

 private:
  IoSpec spec(int64_t id) const {
    const Tensor& t = graph_.tensors[id];
    return {t.dtype, t.rank, t.sizes, t.nbytes};
  }

  Error check_bindings(Span<const Binding> bindings, const std::vector<int64_t>& ids,
                       const char* role) const;
  Error bind(Span<const Binding> inputs, Span<const Binding> outputs);
  Error check_device_pointer(const Binding& binding, const char* role, size_t index) const;
  Error run(Span<const Binding> inputs, Span<const Binding> outputs, cudaStream_t stream,
            bool external_capture);
  Error enqueue_ops(cudaStream_t stream);
  Error start_profile();
  Error finish_profile(cudaStream_t stream, std::chrono::steady_clock::time_point started);
  Error enqueue_step(size_t i, const RunContext& ctx);
  Error launch_graph(cudaStream_t stream);
  Error capture();
  Error range_error() const;

  Graph graph_;
  int device_;
  bool autotune_;       // KILN_AUTOTUNE=1 when the engine was created
  Hash128 graph_hash_;  // of the blob without its weights: the algorithm cache's key (autotune_)
  int max_blocks_ = 0;
  bool has_range_checks_ = false;  // embedding or index_put: a DeviceErrorFlag per run
  std::unique_ptr<DeviceState> state_;
  uint64_t activation_bytes_ = 0;  // counted in device_memory_stats() while state_ lives
  size_t algo_cache_hits_ = 0;
  size_t algo_cache_misses_ = 0;

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

Error CudaEngine::init() {
  KILN_TRY(check_device(device_));
  ScopedDevice guard(device_);
  KILN_TRY(guard.status());
  auto s = std::make_unique<DeviceState>();
  KILN_TRY(init_state(*s));  // reads the initial values from the blob's weights section

  KILN_ASSIGN_OR_RETURN(s->weights, acquire_weights(graph_, device_));
  graph_.weights = nullptr;  // borrowed from the caller's blob, which may be freed after create()
  KILN_ASSIGN_OR_RETURN(s->arena,
                        DeviceBuffer::allocate(graph_.arena_size, "the activation arena"));
  for (int64_t id : graph_.inputs) {
    s->input_staging.emplace_back();
    KILN_ASSIGN_OR_RETURN(
        s->input_staging.back(),
        DeviceBuffer::allocate(graph_.tensors[id].nbytes, "an input staging buffer"));
  }
  for (int64_t id : graph_.outputs) {
    s->output_staging.emplace_back();
    KILN_ASSIGN_OR_RETURN(
        s->output_staging.back(),
        DeviceBuffer::allocate(graph_.tensors[id].nbytes, "an output staging buffer"));
  }
  cudaStream_t stream = nullptr;
  KILN_TRY(cuda_status(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), Error::Internal,
                       "Kiln engine: cannot create a CUDA stream on device %d", device_));
  s->stream.reset(stream);
  cudaEvent_t done = nullptr;
  KILN_TRY(cuda_status(cudaEventCreateWithFlags(&done, cudaEventDisableTiming), Error::Internal,
                       "Kiln engine: cannot create a CUDA event on device %d", device_));
  s->done.reset(done);
  if (has_opcode(graph_, blob::Opcode::kMatmul)) {
    KILN_ASSIGN_OR_RETURN(s->lt, kernels::create_cublas_lt());
  }
  if (has_opcode(graph_, blob::Opcode::kConv2d)) {
    KILN_ASSIGN_OR_RETURN(s->cudnn, kernels::create_cudnn());
  }
  has_range_checks_ = has_opcode(graph_, blob::Opcode::kEmbedding) ||
                      has_opcode(graph_, blob::Opcode::kIndexPut);
  if (has_range_checks_) {
    KILN_ASSIGN_OR_RETURN(s->error_flag,
                          DeviceBuffer::allocate(sizeof(DeviceErrorFlag), "the error flag"));
    KILN_ASSIGN_OR_RETURN(s->error_host,
                          PinnedBuffer::allocate(sizeof(DeviceErrorFlag), "the error flag"));
  }

  // Arena and weight tensors have fixed addresses; io tensors are bound per run.
  tensor_ptrs_.assign(graph_.tensors.size(), nullptr);
  std::vector<uint32_t> alignment(graph_.tensors.size(), 16);
  for (size_t i = 0; i < graph_.tensors.size(); ++i) {
    const Tensor& t = graph_.tensors[i];
    if (t.storage == blob::Storage::kArena && s->arena.get() != nullptr) {
      tensor_ptrs_[i] = static_cast<char*>(s->arena.get()) + t.offset;
    } else if (t.storage == blob::Storage::kWeight) {
      tensor_ptrs_[i] = s->weights.pointer(i);
    }
    if (tensor_ptrs_[i] != nullptr) {
      alignment[i] = alignment_of(tensor_ptrs_[i]);
    }
  }
  for (size_t i = 0; i < graph_.tensors.size(); ++i) {
    if (graph_.tensors[i].storage == blob::Storage::kState) {
      tensor_ptrs_[i] = state_ptrs_[i];
      alignment[i] = alignment_of(tensor_ptrs_[i]);
    }
  }

  size_t workspace = 0;
  s->steps.reserve(graph_.ops.size());
  AlgoCache algos = autotune_ && (s->cudnn != nullptr || s->lt != nullptr)
                        ? AlgoCache(AlgoCache::default_dir(), algo_cache_key(device_), graph_hash_)
                        : AlgoCache();
  for (size_t i = 0; i < graph_.ops.size(); ++i) {
    const InitContext ctx{graph_, i, s->lt.get(), s->cudnn.get(), alignment, autotune_, algos,
                          s->stream.get()};
    std::unique_ptr<Step> step;
    KILN_ASSIGN_OR_RETURN(step, make_step(graph_.ops[i], ctx));
    workspace = std::max(workspace, step->workspace_bytes());
    s->steps.push_back(std::move(step));
  }
  std::string why;
  if (!algos.save(&why)) {
    ET_LOG(Info, "Kiln engine: could not save the algorithm cache (%s); the next load searches "
           "again. Set KILN_CACHE_DIR to a writable directory, or KILN_CACHE_DIR=off.", why.c_str());
  }
  algo_cache_hits_ = algos.hits;
  algo_cache_misses_ = algos.misses;
  KILN_ASSIGN_OR_RETURN(s->workspace, DeviceBuffer::allocate(workspace, "the library workspace"));
  max_blocks_ = multiprocessor_count(device_) * kBlocksPerSm;
  // Program state (a KV cache) is counted here too: it is per engine, never shared.
  activation_bytes_ = s->arena.size() + s->workspace.size() + s->error_flag.size() + s->state.size();
  for (const auto& b : s->input_staging) activation_bytes_ += b.size();
  for (const auto& b : s->output_staging) activation_bytes_ += b.size();
  count_activation_bytes(static_cast<int64_t>(activation_bytes_));
  state_ = std::move(s);
  return Error::Ok;
}

// One device buffer holds every state, each 256-byte aligned, filled once from its initial value.
// Records with the same offset are views of one state (blob_reader checked they agree).
Error CudaEngine::init_state(DeviceState& s) {
  std::vector<std::pair<uint64_t, uint64_t>> placed;  // weights offset -> offset in s.state
  uint64_t total = 0;
  for (const Tensor& t : graph_.tensors) {
    if (t.storage != blob::Storage::kState ||
        std::any_of(placed.begin(), placed.end(), [&](const auto& p) { return p.first == t.offset; })) {
      continue;
    }
    placed.emplace_back(t.offset, total);
    total += (t.nbytes + 255) / 256 * 256;
  }
  state_ptrs_.assign(graph_.tensors.size(), nullptr);
  if (placed.empty()) {
    return Error::Ok;
  }
  KILN_ASSIGN_OR_RETURN(s.state, DeviceBuffer::allocate(total, "the program state"));
  char* base = static_cast<char*>(s.state.get());
  for (size_t i = 0; i < graph_.tensors.size(); ++i) {
    const Tensor& t = graph_.tensors[i];
    if (t.storage != blob::Storage::kState) continue;
    for (const auto& [offset, at] : placed) {
      if (offset == t.offset) state_ptrs_[i] = base + at;
    }
  }
  for (const auto& [offset, at] : placed) {
    for (const Tensor& t : graph_.tensors) {
      if (t.storage != blob::Storage::kState || t.offset != offset || t.nbytes == 0) continue;
      KILN_TRY(cuda_status(
          cudaMemcpy(base + at, graph_.weights + offset, t.nbytes, cudaMemcpyHostToDevice),
          Error::Internal, "Kiln engine: uploading %llu bytes of initial state to device %d",
          static_cast<unsigned long long>(t.nbytes), device_));
      break;
    }
  }
  return Error::Ok;
}

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

Error CudaEngine::start_profile() {
  DeviceState& s = *state_;
  if (s.profile_events.size() == s.steps.size() + 1) {
    return Error::Ok;
  }
  s.profile_events.clear();
  for (size_t i = 0; i <= s.steps.size(); ++i) {
    cudaEvent_t event = nullptr;
    KILN_TRY(cuda_status(cudaEventCreate(&event), Error::Internal,
                         "Kiln engine: cannot create a profiling event on device %d", device_));
    s.profile_events.emplace_back(event);
  }
  if (profile_ == nullptr) {
    std::string description;
    for (const auto& [role, ids] : {std::pair<const char*, const std::vector<int64_t>*>{
                                        "inputs", &graph_.inputs},
                                    {"outputs", &graph_.outputs}}) {
      description += std::string(description.empty() ? "" : ", ") + role;
      for (size_t k = 0; k < ids->size() && k < 3; ++k) {
        const Tensor& t = graph_.tensors[(*ids)[k]];
        description += " " + compact_text(t);
      }
      if (ids->size() > 3) description += " +" + std::to_string(ids->size() - 3) + " more";
    }
    std::vector<profile::OpLabel> labels;
    labels.reserve(graph_.ops.size());
    for (const Op& op : graph_.ops) {
      labels.push_back({opcode_name(op.opcode), op_output_text(graph_, op)});
    }
    profile_ = profile::add_engine(std::move(description), std::move(labels));
  }
  return Error::Ok;
}

Error CudaEngine::finish_profile(cudaStream_t stream,
                                 std::chrono::steady_clock::time_point started) {
  DeviceState& s = *state_;
  KILN_TRY(cuda_status(cudaStreamSynchronize(stream), Error::Internal,
                       "Kiln engine: the profiled run failed on device %d", device_));
  const double wall_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - started).count();
  std::vector<float> op_ms(s.steps.size(), 0.0f);
  for (size_t i = 0; i < s.steps.size(); ++i) {
    KILN_TRY(cuda_status(cudaEventElapsedTime(&op_ms[i], s.profile_events[i].get(),
                                              s.profile_events[i + 1].get()),
                         Error::Internal, "Kiln engine: op %zu: reading the profiling events", i));
  }
  profile::add_run(*profile_, op_ms, wall_ms);
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
  const int64_t vocab = op < graph_.ops.size() && graph_.ops[op].opcode == blob::Opcode::kEmbedding
                            ? std::get<EmbeddingArgs>(graph_.ops[op].args).vocab
                            : -1;
  return fail(nullptr, Error::InvalidArgument,
              "Kiln engine: op %zu (embedding): embedding index out of range: index %lld at "
              "position %lld is outside [0, %lld)",
              op, flag.index, flag.position, static_cast<long long>(vocab));
}

}  // namespace

CopyCounters copy_counters() {
  return {g_host_to_device_bytes.load(std::memory_order_relaxed),
          g_device_to_host_bytes.load(std::memory_order_relaxed),
          g_executes.load(std::memory_order_relaxed)};
}

Result<std::unique_ptr<Engine>> Engine::create(const void* blob, size_t nbytes, int device_index,
                                               const WeightsView* external_weights) {
  // The Graph's weights/weights_size point at whichever bytes apply; init() uploads them.
  auto graph = read_blob(blob, nbytes, nullptr, external_weights);
  if (!graph.ok()) {
    return graph.error();
  }
  // The algorithm cache's key, needed only when autotuning: a hash of the graph sections (the
  // algorithms depend on shapes and types, not on weight values).
  const bool autotune = autotune_enabled();
  Hash128 graph_hash;
  if (autotune) {
    blob::Header header{};
    std::memcpy(&header, blob, sizeof(header));  // read_blob has checked it
    graph_hash = content_hash(
        blob, (header.flags & blob::kFlagExternalWeights) != 0 ? nbytes : header.weights_offset);
  }
  auto engine = std::make_unique<CudaEngine>(std::move(graph.get()), device_index, autotune,
                                             graph_hash);
  KILN_TRY(engine->init());
  return std::unique_ptr<Engine>(std::move(engine));
}

}  // namespace kiln::engine
