#include "runtime/backend/kiln_backend.h"

#include <executorch/runtime/core/exec_aten/util/scalar_type_util.h>
#include <executorch/runtime/core/exec_aten/util/tensor_util.h>
#include <executorch/runtime/platform/log.h>

#include <cuda_runtime_api.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "kiln/executorch/stream.h"
#include "runtime/engine/engine.h"

namespace kiln {
namespace {

namespace et = executorch::runtime;
using executorch::aten::Tensor;

// What init() placement-constructs in the method's runtime allocator.
struct Handle {
  std::unique_ptr<engine::Engine> engine;
  std::vector<engine::Binding> inputs;   // reused every execute: no allocation on the hot path
  std::vector<engine::Binding> outputs;
};

const char* tag_name(et::Tag t) {
  switch (t) {
    case et::Tag::None: return "None";
    case et::Tag::Tensor: return "Tensor";
    case et::Tag::Int: return "Int";
    case et::Tag::Double: return "Double";
    case et::Tag::Bool: return "Bool";
    default: return "a non-tensor value";
  }
}

std::string shape_string(const int64_t* sizes, size_t rank) {
  std::string s = "[";
  for (size_t i = 0; i < rank; ++i) s += (i ? "," : "") + std::to_string(sizes[i]);
  return s + "]";
}

// Device memory is recognised by asking the driver, not by the tensor's device tag: programs
// exported without device memory planning tag delegate tensors CUDA while planning them in host
// memory. Only cudaMalloc'd memory counts: on systems with HMM the driver can also describe plain
// host memory as managed, and treating that as device memory would skip the copy back and the
// synchronisation the caller relies on before reading a host output.
bool is_device_pointer(const void* p) {
  cudaPointerAttributes attr{};
  if (cudaPointerGetAttributes(&attr, p) != cudaSuccess) {
    cudaGetLastError();  // clear the error so it does not surface in a later call
    return false;
  }
  return attr.type == cudaMemoryTypeDevice;
}

// Checks one argument against the blob's declaration and fills its binding.
et::Error bind(et::EValue* arg, const engine::IoSpec& spec, const char* role, size_t index,
               bool resize, engine::Binding& out) {
  if (arg == nullptr || !arg->isTensor()) {
    ET_LOG(Error, "KilnBackend: %s %zu is %s; a Kiln engine takes tensors", role, index,
           arg ? tag_name(arg->tag) : "missing");
    return et::Error::InvalidArgument;
  }
  Tensor& t = arg->toTensor();
  if (static_cast<uint32_t>(t.scalar_type()) != static_cast<uint32_t>(spec.dtype)) {
    ET_LOG(Error, "KilnBackend: %s %zu has dtype %s, the engine was built for %s", role, index,
           executorch::runtime::toString(t.scalar_type()),
           executorch::runtime::toString(static_cast<executorch::aten::ScalarType>(spec.dtype)));
    return et::Error::InvalidArgument;
  }
  if (resize) {
    std::vector<executorch::aten::SizesType> sizes(spec.sizes, spec.sizes + spec.rank);
    if (et::resize_tensor(t, {sizes.data(), sizes.size()}) != et::Error::Ok) {
      ET_LOG(Error, "KilnBackend: cannot resize %s %zu to %s", role, index,
             shape_string(spec.sizes, spec.rank).c_str());
      return et::Error::InvalidArgument;
    }
  }
  bool same = static_cast<size_t>(t.dim()) == spec.rank;
  for (size_t d = 0; same && d < spec.rank; ++d) same = t.size(d) == spec.sizes[d];
  if (!same) {
    std::vector<int64_t> got(t.sizes().begin(), t.sizes().end());
    ET_LOG(Error, "KilnBackend: %s %zu has shape %s, the engine was built for %s", role, index,
           shape_string(got.data(), got.size()).c_str(), shape_string(spec.sizes, spec.rank).c_str());
    return et::Error::InvalidArgument;
  }
  if (!et::tensor_is_default_dim_order(t)) {
    ET_LOG(Error, "KilnBackend: %s %zu is not in contiguous dim order; Kiln engines take "
           "contiguous tensors", role, index);
    return et::Error::NotSupported;
  }
  void* data = t.mutable_data_ptr();
  if (data == nullptr && spec.nbytes > 0) {
    ET_LOG(Error, "KilnBackend: %s %zu has no data pointer", role, index);
    return et::Error::InvalidArgument;
  }
  out = engine::Binding{data, t.nbytes(), data != nullptr && is_device_pointer(data)};
  return et::Error::Ok;
}

int device_index_from(et::ArrayRef<et::CompileSpec> specs) {
  for (const et::CompileSpec& s : specs) {
    if (std::strcmp(s.key, "device_index") == 0 && s.value.nbytes > 0 && s.value.nbytes < 8) {
      return std::atoi(std::string(static_cast<const char*>(s.value.buffer), s.value.nbytes).c_str());
    }
  }
  return 0;
}

}  // namespace

bool KilnBackend::is_available() const {
  const std::string& why = engine::cuda_unavailable_reason();
  // Logged once per process; a function-local static's initialiser runs exactly once even when
  // methods are loaded on several threads at once. KilnBackend holds no other mutable state: each
  // delegate's engine and bindings live in its own Handle.
  static const bool logged = [&] {
    if (!why.empty()) ET_LOG(Error, "KilnBackend is not available: %s", why.c_str());
    return true;
  }();
  (void)logged;
  return why.empty();
}

et::Result<et::DelegateHandle*> KilnBackend::init(et::BackendInitContext& context,
                                                  et::FreeableBuffer* processed,
                                                  et::ArrayRef<et::CompileSpec> compile_specs) const {
  if (processed == nullptr || processed->data() == nullptr) {
    ET_LOG(Error, "KilnBackend: the program carries no engine blob for this delegate");
    return et::Error::InvalidProgram;
  }
  auto engine = engine::Engine::create(processed->data(), processed->size(),
                                       device_index_from(compile_specs));
  processed->Free();  // the engine holds what it needs on the device
  if (!engine.ok()) return engine.error();

  Handle* handle = context.get_runtime_allocator()->allocateInstance<Handle>();
  if (handle == nullptr) {
    ET_LOG(Error, "KilnBackend: the method's runtime allocator is out of memory");
    return et::Error::MemoryAllocationFailed;
  }
  new (handle) Handle{std::move(engine.get()), {}, {}};
  handle->inputs.resize(handle->engine->num_inputs());
  handle->outputs.resize(handle->engine->num_outputs());
  return handle;
}

et::Error KilnBackend::execute(et::BackendExecutionContext&, et::DelegateHandle* raw,
                               et::Span<et::EValue*> args) const {
  if (raw == nullptr) {
    ET_LOG(Error, "KilnBackend: execute on a delegate whose init failed");
    return et::Error::DelegateInvalidHandle;
  }
  Handle& h = *static_cast<Handle*>(raw);
  const size_t n_in = h.inputs.size();
  const size_t n_out = h.outputs.size();
  if (args.size() != n_in + n_out) {
    ET_LOG(Error, "KilnBackend: got %zu arguments, the engine takes %zu inputs and %zu outputs",
           args.size(), n_in, n_out);
    return et::Error::InvalidArgument;
  }
  for (size_t i = 0; i < n_in; ++i) {
    et::Error e = bind(args[i], h.engine->input(i), "input", i, /*resize=*/false, h.inputs[i]);
    if (e != et::Error::Ok) return e;
  }
  for (size_t i = 0; i < n_out; ++i) {
    et::Error e = bind(args[n_in + i], h.engine->output(i), "output", i, /*resize=*/true, h.outputs[i]);
    if (e != et::Error::Ok) return e;
  }
  // The caller's stream for this thread (kiln/executorch/stream.h), else the engine's own.
  return h.engine->execute({h.inputs.data(), n_in}, {h.outputs.data(), n_out},
                           kiln_executorch_current_stream());
}

void KilnBackend::destroy(et::DelegateHandle* raw) const {
  if (raw != nullptr) static_cast<Handle*>(raw)->~Handle();
}

}  // namespace kiln
