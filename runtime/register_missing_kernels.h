// Registers kernels whose operator names have no kernel in the process yet. ExecuTorch's registry
// aborts when a name is registered twice, so a Kiln kernel library defers to whichever library
// registered the name first. One loaded after it still aborts on its own second registration: link
// one provider of each name.
#pragma once

#include <executorch/runtime/core/span.h>
#include <executorch/runtime/kernel/operator_registry.h>
#include <executorch/runtime/platform/log.h>

#include <cstring>

namespace kiln {

/// `library` names the caller in the log line for a name it leaves to another provider.
inline void register_missing_kernels(
    executorch::runtime::Span<const executorch::runtime::Kernel> kernels, const char* library) {
  namespace et = executorch::runtime;
  for (const et::Kernel& k : kernels) {
    // Looked up in the registered list: registry_has_op_function logs an error for every name it
    // does not find.
    bool present = false;
    for (const et::Kernel& r : et::get_registered_kernels()) {
      present = present || std::strcmp(r.name_, k.name_) == 0;
    }
    if (present) {
      ET_LOG(Info, "%s is already registered; %s leaves it", k.name_, library);
      continue;
    }
    const et::Error err = et::register_kernel(k);
    if (err != et::Error::Ok) {
      ET_LOG(Error, "%s: registering %s failed: 0x%x", library, k.name_, static_cast<unsigned>(err));
    }
  }
}

}  // namespace kiln
