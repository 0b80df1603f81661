// The process-wide registry of shared program state. A state tensor (kState, e.g. a KV cache)
// that the delegate payload names (format/state_keys.h) is looked up by (scope, key, device):
// the first engine that asks creates its memory with the initial value, every later engine of
// the same scope gets the same memory, and it is freed when the last engine holding it goes.
// The scope identifies one loaded program (KilnBackend passes the program's NamedDataMap, which
// ExecuTorch gives every method of one Program and no other Program), so both methods of one load
// share their caches and two loads of the program do not. No CUDA here: memory is made by the
// caller's `allocate`, so the registry is unit-tested on the CPU. Safe from several threads.
#pragma once

#include <executorch/runtime/core/result.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "format/blob_format.h"

namespace kiln::engine {

/// What one engine declares about a state: its dtype, shape and size.
struct StateSpec {
  blob::DType dtype = blob::DType::kFloat32;
  uint32_t rank = 0;
  int64_t sizes[blob::kMaxRank] = {};
  uint64_t nbytes = 0;

  bool operator==(const StateSpec& other) const;
  std::string describe() const;  // "Float32 [1,8,2048,64] (2097152 bytes)"
};

class StateRegistry {
 public:
  /// Makes the memory of a new state (initial value included); the pointer's owner frees it.
  using Allocate = std::function<executorch::runtime::Result<std::shared_ptr<void>>()>;

  /// The memory of state `key` in `scope` on `device`: the existing one when an engine of that
  /// scope holds it (and `spec` equals its declaration), else a new one from `allocate`.
  /// `*created` (when not null) says which. A declaration that differs from the existing one is
  /// InvalidProgram with a log line naming the key, both declarations and `who` (e.g. the method
  /// name); nothing changes then. An error from `allocate` is returned as it is.
  executorch::runtime::Result<std::shared_ptr<void>> acquire(
      const void* scope, const std::string& key, int device, const StateSpec& spec,
      const std::string& who, const Allocate& allocate, bool* created = nullptr);

  /// States alive in this registry (held by at least one engine).
  size_t live() const;

  /// The registry every engine of the process uses.
  static StateRegistry& process();

  StateRegistry();
  ~StateRegistry();
  StateRegistry(const StateRegistry&) = delete;
  StateRegistry& operator=(const StateRegistry&) = delete;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kiln::engine
