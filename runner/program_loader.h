// Loading a .pte and its methods for Kiln's runners (kiln_runner, kiln_llm): the file loader, the
// verified Program, and per method its allocators, planned memory and the loaded Method, kept
// together for as long as the method runs. Failures exit through diagnostics.h's fail() with the
// message naming the file or method (and, for a missing method, the methods the program has).
#pragma once

#include <executorch/extension/data_loader/file_data_loader.h>
#include <executorch/extension/memory_allocator/malloc_memory_allocator.h>
#include <executorch/runtime/executor/method.h>
#include <executorch/runtime/executor/program.h>

#include <memory>
#include <string>

#include "runner/memory.h"

namespace kiln::runner {

/// Filters ExecuTorch's log (KILN_LOG), initialises the runtime and registers the CPU kernels the
/// wheel's library lacks (not with KILN_RUNNER_WHEEL_KERNELS_ONLY=1: only the wheel's kernels, as
/// an app that links just those).
void start_runtime();

/// A verified program and the loader it reads from (the program borrows the loader).
struct LoadedProgram {
  std::unique_ptr<executorch::extension::FileDataLoader> loader;
  std::unique_ptr<et::Program> program;
};

/// Opens and verifies `path`; exits with a message on failure.
LoadedProgram load_program(const std::string& path);

/// "'prefill', 'decode'": the program's method names, for messages.
std::string method_names(const et::Program& program);

/// One loaded method with the memory it runs in. Not movable: the Method points into it.
class LoadedMethod {
 public:
  /// Loads `name` (every delegate's init runs here); exits with a message when the program has no
  /// such method (naming the ones it has) or the load fails.
  LoadedMethod(et::Program& program, const std::string& name, const std::string& model_path);
  LoadedMethod(const LoadedMethod&) = delete;
  LoadedMethod& operator=(const LoadedMethod&) = delete;

  et::Method& method() { return *method_; }
  const et::MethodMeta& meta() const { return *meta_; }
  double load_ms() const { return load_ms_; }

 private:
  std::unique_ptr<et::MethodMeta> meta_;
  executorch::extension::MallocMemoryAllocator method_allocator_;
  executorch::extension::MallocMemoryAllocator temp_allocator_;
  std::unique_ptr<PlannedMemory> planned_;
  std::unique_ptr<et::HierarchicalAllocator> planned_allocator_;
  std::unique_ptr<et::MemoryManager> memory_manager_;
  std::unique_ptr<et::Method> method_;
  double load_ms_ = 0;
};

}  // namespace kiln::runner
