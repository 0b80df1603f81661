// KilnBackend: the ExecuTorch BackendInterface that runs Kiln engine blobs on a CUDA device.
// Registered under the id "KilnBackend" by register.cpp, the library's one static initializer.
#pragma once

#include <executorch/runtime/backend/interface.h>

namespace kiln {

/// The backend id programs name in their delegate table; spelled once, here.
inline constexpr const char* kBackendId = "KilnBackend";

class KilnBackend final : public executorch::runtime::BackendInterface {
 public:
  /// True when a usable CUDA device is present. The first call probes the driver and logs why not
  /// (no driver, no device, compute capability below 9.0); later calls return the cached answer.
  bool is_available() const override;

  /// Validates the blob and builds an engine on the device (weights uploaded, arena and plans
  /// made). The blob is freed afterwards. The engine handle lives in the method's runtime
  /// allocator memory until destroy().
  executorch::runtime::Result<executorch::runtime::DelegateHandle*> init(
      executorch::runtime::BackendInitContext& context,
      executorch::runtime::FreeableBuffer* processed,
      executorch::runtime::ArrayRef<executorch::runtime::CompileSpec> compile_specs) const override;

  /// `args` holds the delegate's inputs followed by its outputs. Each must be a tensor of the dtype
  /// and shape the blob declares; host and device memory are both accepted. Returns when outputs
  /// in host memory are written; device outputs are complete in stream order.
  executorch::runtime::Error execute(executorch::runtime::BackendExecutionContext& context,
                                     executorch::runtime::DelegateHandle* handle,
                                     executorch::runtime::Span<executorch::runtime::EValue*> args)
      const override;

  /// Waits for the engine's work and frees its device memory.
  void destroy(executorch::runtime::DelegateHandle* handle) const override;
};

}  // namespace kiln
