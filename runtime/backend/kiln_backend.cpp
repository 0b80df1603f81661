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
#include "format/state_keys_reader.h"
#include "format/variant_set_reader.h"

namespace kiln {
namespace {

namespace et = executorch::runtime;
using executorch::aten::Tensor;

// What init() placement-constructs in the method's runtime allocator.
struct Handle {
  std::unique_ptr<engine::Engine> engine;  // a plain blob's engine; null for a variant set
  std::vector<engine::Binding> inputs;   // reused every execute: no allocation on the hot path
  std::vector<engine::Binding> outputs;
  // A variant set (bounded dynamic shapes): one engine per shape-specialised plan, created on
  // first use from the owned copy of the container (ExecuTorch may free the program's copy).
  std::vector<uint8_t> container;
  engine::VariantSet set;                 // borrows `container`
  std::vector<std::unique_ptr<engine::Engine>> engines;  // per variant, null until first used
  std::vector<engine::Shape> shapes;      // the actual input shapes of the current execute
  int device = 0;
  // Program state named by the payload (format/state_keys.h), shared with the other delegates of
  // the loaded program; every variant engine of this delegate uses it too.
  std::vector<std::string> state_keys;
  engine::StateSharing sharing;           // keys point at state_keys
};

// The scope that shares named states: the loaded program, identified by the NamedDataMap
// ExecuTorch hands every method of one Program (Kiln's preprocess stores an entry so that a
// stateful program has one). Without one, the delegate's variant engines still share with each
// other (`fallback`, the handle) and no other delegate does.
const void* state_scope(et::BackendInitContext& context, const void* fallback) {
  const void* map = context.get_named_data_map();
  return map != nullptr ? map : fallback;
}

std::string method_label(et::BackendInitContext& context) {
  const char* name = context.get_method_name();
  return std::string("method '") + (name != nullptr ? name : "?") + "'";
}

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

std::string describe(const std::vector<engine::Shape>& shapes) {
  std::string out;
  for (size_t i = 0; i < shapes.size(); ++i) {
    out += (i ? ", " : "") + shape_string(shapes[i].sizes, shapes[i].rank);
  }
  return out;
}

// The engine of the variant that serves the actual input shapes, created on first use. A shape no
// variant serves is InvalidArgument; the handle stays usable for the next call.
et::Result<engine::Engine*> select_variant(Handle& h, et::Span<et::EValue*> args) {
  const size_t n_in = h.shapes.size();
  bool representable = true;
  for (size_t i = 0; i < n_in; ++i) {
    if (args[i] == nullptr || !args[i]->isTensor()) {
      ET_LOG(Error, "KilnBackend: input %zu is %s; a Kiln engine takes tensors", i,
             args[i] ? tag_name(args[i]->tag) : "missing");
      return et::Error::InvalidArgument;
    }
    const Tensor& t = args[i]->toTensor();
    engine::Shape& s = h.shapes[i];
    s = engine::Shape{};
    if (static_cast<size_t>(t.dim()) > engine::blob::kMaxRank) {
      representable = false;
      continue;
    }
    s.rank = static_cast<uint32_t>(t.dim());
    for (uint32_t d = 0; d < s.rank; ++d) s.sizes[d] = t.size(d);
  }
  const int v = representable ? engine::find_variant(h.set, h.shapes) : -1;
  if (v < 0) {
    ET_LOG(Error,
           "KilnBackend: input shapes %s are served by no shape-specialised plan of this "
           "delegate; it was exported for %s. Pass sizes within the bounds given to "
           "torch.export's dynamic_shapes, or re-export with wider bounds",
           describe(h.shapes).c_str(), engine::describe_shapes(h.set).c_str());
    return et::Error::InvalidArgument;
  }
  if (!h.engines[v]) {
    const engine::Variant& variant = h.set.variants[v];
    auto created = engine::Engine::create(variant.blob, variant.blob_size, h.device, &h.set.weights,
                                          &h.sharing);
    if (!created.ok()) {
      ET_LOG(Error, "KilnBackend: cannot create the engine for input shapes %s",
             describe(h.shapes).c_str());
      return created.error();
    }
    h.engines[v] = std::move(created.get());
  }
  return h.engines[v].get();
}

// init() for a variant set: validates every variant on the CPU and creates the engine of the
// largest plan (by activation arena) now, so a missing device or too little memory surfaces at
// init rather than at the first large input.
et::Error init_variant_set(Handle& h, const void* payload, size_t payload_size,
                           et::FreeableBuffer* processed, int device) {
  const auto* bytes = static_cast<const uint8_t*>(payload);
  h.container.assign(bytes, bytes + payload_size);
  processed->Free();
  auto set = engine::read_variant_set(h.container.data(), h.container.size());
  if (!set.ok()) return set.error();
  h.set = std::move(set.get());
  h.device = device;
  h.engines.resize(h.set.variants.size());
  h.shapes.resize(h.set.variants[0].inputs.size());
  size_t largest = 0;
  for (size_t v = 1; v < h.set.variants.size(); ++v) {
    if (h.set.variants[v].arena_size > h.set.variants[largest].arena_size) largest = v;
  }
  const engine::Variant& variant = h.set.variants[largest];
  auto created = engine::Engine::create(variant.blob, variant.blob_size, device, &h.set.weights,
                                        &h.sharing);
  if (!created.ok()) return created.error();
  h.engines[largest] = std::move(created.get());
  h.inputs.resize(h.engines[largest]->num_inputs());
  h.outputs.resize(h.engines[largest]->num_outputs());
  return et::Error::Ok;
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
  // A stateful delegate's payload names its states around the blob or variant set.
  const void* payload = processed->data();
  size_t payload_size = processed->size();
  std::vector<std::string> keys;
  if (engine::is_state_keyed(payload, payload_size)) {
    auto keyed = engine::read_state_keys(payload, payload_size);
    if (!keyed.ok()) {
      processed->Free();
      return keyed.error();
    }
    keys = std::move(keyed.get().keys);
    payload = keyed.get().payload;
    payload_size = keyed.get().payload_size;
  }
  Handle* handle = context.get_runtime_allocator()->allocateInstance<Handle>();
  if (handle == nullptr) {
    processed->Free();
    ET_LOG(Error, "KilnBackend: the method's runtime allocator is out of memory");
    return et::Error::MemoryAllocationFailed;
  }
  new (handle) Handle{};
  handle->state_keys = std::move(keys);
  handle->sharing.keys = &handle->state_keys;
  handle->sharing.who = method_label(context);
  const int device = device_index_from(compile_specs);
  if (engine::is_variant_set(payload, payload_size)) {
    handle->sharing.scope = state_scope(context, handle);
    et::Error e = init_variant_set(*handle, payload, payload_size, processed, device);
    if (e != et::Error::Ok) {
      handle->~Handle();
      return e;
    }
    return handle;
  }
  handle->sharing.scope = state_scope(context, nullptr);
  auto engine = engine::Engine::create(payload, payload_size, device, nullptr, &handle->sharing);
  processed->Free();  // the engine holds what it needs on the device
  if (!engine.ok()) {
    handle->~Handle();
    return engine.error();
  }
  handle->engine = std::move(engine.get());
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
  engine::Engine* engine = h.engine.get();
  if (engine == nullptr) {
    auto selected = select_variant(h, args);
    if (!selected.ok()) return selected.error();
    engine = selected.get();
  }
  for (size_t i = 0; i < n_in; ++i) {
    et::Error e = bind(args[i], engine->input(i), "input", i, /*resize=*/false, h.inputs[i]);
    if (e != et::Error::Ok) return e;
  }
  for (size_t i = 0; i < n_out; ++i) {
    et::Error e = bind(args[n_in + i], engine->output(i), "output", i, /*resize=*/true, h.outputs[i]);
    if (e != et::Error::Ok) return e;
  }
  // The caller's stream for this thread (kiln/executorch/stream.h), else the engine's own.
  return engine->execute({h.inputs.data(), n_in}, {h.outputs.data(), n_out},
                         kiln_executorch_current_stream());
}

void KilnBackend::destroy(et::DelegateHandle* raw) const {
  if (raw != nullptr) static_cast<Handle*>(raw)->~Handle();
}

}  // namespace kiln
