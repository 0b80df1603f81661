// Per-op profiling (profile.h; kiln_executorch_set_profiling): on a profiled run CudaEngine
// registers itself with the profile registry (labels from its graph), records a CUDA event
// between ops, and adds the op times and the run's wall time once its stream has finished.
#include <cuda_runtime.h>

#include <chrono>
#include <string>
#include <type_traits>
#include <utility>
#include <variant>
#include <vector>

#include "runtime/engine/cuda_check.h"
#include "runtime/engine/cuda_engine.h"
#include "format/fail.h"
#include "format/graph.h"
#include "runtime/engine/profile.h"

namespace kiln::engine {
namespace {

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

}  // namespace

using executorch::runtime::Error;

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

}  // namespace kiln::engine
