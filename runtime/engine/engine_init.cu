// Engine setup: Engine::create, and CudaEngine's device resources (weights, arena, staging
// buffers, stream, library handles, program state) and one prepared Step per op, created at init
// and released in the destructor.
#include <cuda_runtime.h>
#include <executorch/runtime/platform/log.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "runtime/engine/algo_cache.h"
#include "format/blob_reader.h"
#include "runtime/engine/content_hash.h"
#include "runtime/engine/cuda_check.h"
#include "runtime/engine/cuda_engine.h"
#include "runtime/engine/device.h"
#include "format/fail.h"
#include "runtime/engine/kernels/attention_cudnn.h"
#include "runtime/engine/kernels/conv2d.cuh"
#include "runtime/engine/kernels/gemv.cuh"
#include "runtime/engine/kernels/matmul.cuh"
#include "runtime/engine/kernels/rope_append.cuh"
#include "runtime/engine/profile.h"
#include "runtime/engine/shared_state.h"
#include "runtime/engine/step.h"
#include "runtime/engine/weight_cache.h"
#include "runtime/engine/env_switch.h"

namespace kiln::engine {
namespace {

using executorch::runtime::Error;
using executorch::runtime::Result;
using executorch::runtime::Span;

// KILN_AUTOTUNE=1: time the library ops' candidate algorithms at init (kernels/autotune.cuh).
bool autotune_enabled() { return env_is("KILN_AUTOTUNE", "1"); }

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

bool has_opcode(const Graph& graph, blob::Opcode opcode) {
  return std::any_of(graph.ops.begin(), graph.ops.end(),
                     [&](const Op& op) { return op.opcode == opcode; });
}

}  // namespace

using executorch::runtime::Error;
using executorch::runtime::Result;

CudaEngine::~CudaEngine() {
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
  // kAttention: fp32 prefill shapes run as cuBLASLt GEMMs (attention_gemm.cu); kQuantMatmul:
  // M > 16 rows multiply dequantized weight chunks (quant_matmul.cu).
  if (has_opcode(graph_, blob::Opcode::kMatmul) || has_opcode(graph_, blob::Opcode::kAttention) ||
      has_opcode(graph_, blob::Opcode::kQuantMatmul)) {
    KILN_ASSIGN_OR_RETURN(s->lt, kernels::create_cublas_lt());
  }
  if (has_opcode(graph_, blob::Opcode::kConv2d) || kernels::graph_has_cudnn_attention(graph_)) {
    KILN_ASSIGN_OR_RETURN(s->cudnn, kernels::create_cudnn());
  }
  has_range_checks_ = has_opcode(graph_, blob::Opcode::kEmbedding) ||
                      has_opcode(graph_, blob::Opcode::kIndexPut) ||
                      has_opcode(graph_, blob::Opcode::kGather) ||
                      has_opcode(graph_, blob::Opcode::kEmbeddingBag) ||
                      has_opcode(graph_, blob::Opcode::kScatter);
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
  folded_ops_ = 0;
  for (size_t i = 0; i < graph_.ops.size(); ++i) {
    const InitContext ctx{graph_, i, s->lt.get(), s->cudnn.get(), alignment, autotune_, algos,
                          s->stream.get()};
    std::unique_ptr<Step> step;
    // A layer norm or gated activation whose only reader is the GEMV after it runs inside that
    // GEMV (gemv.cuh): op i's step enqueues nothing and op i + 1's computes op i's output as it
    // stages its activations.
    const blob::Opcode opcode = graph_.ops[i].opcode;
    // A decoder layer's ropes and KV-cache writes in a row run as one kernel (rope_append.cuh):
    // the first op's step launches it, the others' enqueue nothing.
    if (const size_t group = kernels::rope_append_length(ctx); group >= 2) {
      KILN_ASSIGN_OR_RETURN(step, kernels::make_rope_append_step(group, ctx));
      s->steps.push_back(std::move(step));
      for (size_t k = 1; k < group; ++k) s->steps.push_back(kernels::make_folded_step());
      folded_ops_ += group - 1;
      i += group - 1;
      continue;
    }
    if (i + 1 < graph_.ops.size() &&
        (graph_.ops[i + 1].opcode == blob::Opcode::kMatmul ||
         graph_.ops[i + 1].opcode == blob::Opcode::kQuantMatmul) &&
        (opcode == blob::Opcode::kLayerNorm || opcode == blob::Opcode::kFusedElementwise)) {
      const InitContext next{graph_, i + 1, s->lt.get(), s->cudnn.get(), alignment, autotune_,
                             algos, s->stream.get()};
      if (kernels::folded_gemv_unsupported(i, next) == nullptr) {
        KILN_ASSIGN_OR_RETURN(step, kernels::make_folded_gemv_step(i, next));
        workspace = std::max(workspace, step->workspace_bytes());
        s->steps.push_back(kernels::make_folded_step());
        s->steps.push_back(std::move(step));
        ++folded_ops_;
        ++i;
        continue;
      }
    }
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

// Private states share one device buffer, each 256-byte aligned, filled once from its initial
// value. Records with the same offset are views of one state (blob_reader checked they agree).
// With state keys, the i-th distinct state (in offset order) is the shared state of that name
// instead (shared_state.h): made and filled by the first engine of the scope that asks.
Error CudaEngine::init_state(DeviceState& s) {
  std::vector<std::pair<uint64_t, const Tensor*>> distinct;  // weights offset -> first record
  for (const Tensor& t : graph_.tensors) {
    if (t.storage != blob::Storage::kState ||
        std::any_of(distinct.begin(), distinct.end(), [&](const auto& p) { return p.first == t.offset; })) {
      continue;
    }
    distinct.emplace_back(t.offset, &t);
  }
  std::sort(distinct.begin(), distinct.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  state_ptrs_.assign(graph_.tensors.size(), nullptr);
  if (distinct.empty()) {
    return Error::Ok;
  }
  const bool shared = sharing_.scope != nullptr && !state_keys_.empty();
  if (!state_keys_.empty() && state_keys_.size() != distinct.size()) {
    return fail(nullptr, Error::InvalidProgram,
                "Kiln engine: the delegate names %zu states but its blob declares %zu; "
                "re-export the model", state_keys_.size(), distinct.size());
  }
  std::vector<void*> where(distinct.size(), nullptr);
  if (shared) {
    for (size_t k = 0; k < distinct.size(); ++k) {
      KILN_TRY(acquire_shared_state(s, *distinct[k].second, k, &where[k]));
    }
  } else {
    uint64_t total = 0;
    std::vector<uint64_t> at(distinct.size());
    for (size_t k = 0; k < distinct.size(); ++k) {
      at[k] = total;
      total += (distinct[k].second->nbytes + 255) / 256 * 256;
    }
    KILN_ASSIGN_OR_RETURN(s.state, DeviceBuffer::allocate(total, "the program state"));
    char* base = static_cast<char*>(s.state.get());
    for (size_t k = 0; k < distinct.size(); ++k) {
      where[k] = base + at[k];
      const Tensor& t = *distinct[k].second;
      if (t.nbytes == 0) continue;
      KILN_TRY(cuda_status(
          cudaMemcpy(where[k], graph_.weights + t.offset, t.nbytes, cudaMemcpyHostToDevice),
          Error::Internal, "Kiln engine: uploading %llu bytes of initial state to device %d",
          static_cast<unsigned long long>(t.nbytes), device_));
    }
  }
  for (size_t i = 0; i < graph_.tensors.size(); ++i) {
    const Tensor& t = graph_.tensors[i];
    if (t.storage != blob::Storage::kState) continue;
    for (size_t k = 0; k < distinct.size(); ++k) {
      if (distinct[k].first == t.offset) state_ptrs_[i] = where[k];
    }
  }
  return Error::Ok;
}

// The shared state named state_keys_[ordinal]: this scope's existing buffer, or a new one holding
// the initial value (counted as activation memory while it lives).
Error CudaEngine::acquire_shared_state(DeviceState& s, const Tensor& t, size_t ordinal, void** at) {
  StateSpec spec;
  spec.dtype = t.dtype;
  spec.rank = t.rank;
  std::copy(t.sizes, t.sizes + blob::kMaxRank, spec.sizes);
  spec.nbytes = t.nbytes;
  const uint8_t* initial = graph_.weights + t.offset;
  const int device = device_;
  auto allocate = [&]() -> Result<std::shared_ptr<void>> {
    DeviceBuffer buffer;
    KILN_ASSIGN_OR_RETURN(buffer, DeviceBuffer::allocate((t.nbytes + 255) / 256 * 256,
                                                         "a shared program state"));
    if (t.nbytes > 0) {
      KILN_TRY(cuda_status(
          cudaMemcpy(buffer.get(), initial, t.nbytes, cudaMemcpyHostToDevice), Error::Internal,
          "Kiln engine: uploading %llu bytes of initial state to device %d",
          static_cast<unsigned long long>(t.nbytes), device));
    }
    const int64_t bytes = static_cast<int64_t>(buffer.size());
    count_activation_bytes(bytes);
    auto holder = std::shared_ptr<DeviceBuffer>(new DeviceBuffer(std::move(buffer)),
                                                [device, bytes](DeviceBuffer* b) {
                                                  ScopedDevice guard(device);
                                                  delete b;
                                                  count_activation_bytes(-bytes);
                                                });
    return std::shared_ptr<void>(holder, holder->get());
  };
  std::shared_ptr<void> memory;
  KILN_ASSIGN_OR_RETURN(memory, StateRegistry::process().acquire(
                                    sharing_.scope, state_keys_[ordinal], device_, spec,
                                    sharing_.who, allocate));
  *at = memory.get();
  s.shared_states.push_back(std::move(memory));
  return Error::Ok;
}

Result<std::unique_ptr<Engine>> Engine::create(const void* blob, size_t nbytes, int device_index,
                                               const WeightsView* external_weights,
                                               const StateSharing* sharing) {
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
                                             graph_hash, sharing ? *sharing : StateSharing{});
  KILN_TRY(engine->init());
  return std::unique_ptr<Engine>(std::move(engine));
}

}  // namespace kiln::engine
