// Program and method loading shared by Kiln's runners (program_loader.h).
#include "runner/program_loader.h"

#include <chrono>
#include <cstdio>
#include <utility>

#include <executorch/runtime/platform/runtime.h>

#include <cstdlib>
#include <cstring>

#include "runner/diagnostics.h"
#include "runtime/cpu_kernels/cpu_kernels.h"

namespace kiln::runner {

void start_runtime() {
  install_log_filter();
  et::runtime_init();
  const char* wheel_only = std::getenv("KILN_RUNNER_WHEEL_KERNELS_ONLY");
  if (wheel_only == nullptr || std::strcmp(wheel_only, "1") != 0) kiln::register_missing_cpu_kernels();
}

LoadedProgram load_program(const std::string& path) {
  LoadedProgram out;
  auto loader = executorch::extension::FileDataLoader::from(path.c_str());
  if (!loader.ok()) fail("opening '" + path + "'", loader.error());
  out.loader = std::make_unique<executorch::extension::FileDataLoader>(std::move(loader.get()));
  auto program = et::Program::load(out.loader.get(), et::Program::Verification::InternalConsistency);
  if (!program.ok()) {
    // Program::load answers InvalidArgument for a file shorter than its header (an empty or cut
    // file): at this stage that is a bad file, not a bad method input.
    if (program.error() == et::Error::InvalidArgument) {
      fail("Program::load('" + path + "')", program.error(), hint(et::Error::InvalidProgram));
    }
    fail("Program::load('" + path + "')", program.error());
  }
  out.program = std::make_unique<et::Program>(std::move(program.get()));
  return out;
}

std::string method_names(const et::Program& program) {
  std::string names;
  for (size_t i = 0; i < program.num_methods(); ++i) {
    auto name = program.get_method_name(i);
    if (name.ok()) names += std::string(i ? ", " : "") + "'" + name.get() + "'";
  }
  return names;
}

LoadedMethod::LoadedMethod(et::Program& program, const std::string& name,
                           const std::string& model_path) {
  auto meta = program.method_meta(name.c_str());
  if (!meta.ok()) {
    char code[8];
    std::snprintf(code, sizeof(code), "0x%02x", static_cast<unsigned>(meta.error()));
    fail("method '" + name + "' not found in '" + model_path + "': " + error_name(meta.error()) +
         " (" + code + "); the program has: " + method_names(program));
  }
  meta_ = std::make_unique<et::MethodMeta>(meta.get());
  planned_ = std::make_unique<PlannedMemory>(*meta_);
  planned_allocator_ = std::make_unique<et::HierarchicalAllocator>(planned_->allocator());
  memory_manager_ = std::make_unique<et::MemoryManager>(&method_allocator_, planned_allocator_.get(),
                                                        &temp_allocator_);
  // load_method runs every delegate's init (for Kiln: blob validation, weight upload, plans).
  const auto start = std::chrono::steady_clock::now();
  auto method = program.load_method(name.c_str(), memory_manager_.get());
  load_ms_ = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  if (!method.ok()) fail("load_method('" + name + "')", method.error());
  method_ = std::make_unique<et::Method>(std::move(method.get()));
}

}  // namespace kiln::runner
