// Turning CUDA-family status codes into ExecuTorch errors with a sentence, and one macro to keep
// the happy path flat.
#pragma once

#include <cuda_runtime.h>
#include <executorch/runtime/core/error.h>

namespace kiln::engine {

/// Returns Ok for cudaSuccess. Otherwise clears CUDA's last-error slot (so the next check sees
/// only new failures), logs "<formatted context>: <CUDA's error string>" and returns `code`.
executorch::runtime::Error cuda_status(cudaError_t status, executorch::runtime::Error code,
                                       const char* format, ...)
    __attribute__((format(printf, 3, 4)));

}  // namespace kiln::engine

/// Returns the Error from the enclosing function when `expr` (an Error) is not Ok.
#define KILN_TRY(expr)                                                               \
  do {                                                                               \
    const ::executorch::runtime::Error kiln_try_error_ = (expr);                     \
    if (kiln_try_error_ != ::executorch::runtime::Error::Ok) return kiln_try_error_; \
  } while (0)

/// Moves the value of `expr` (a Result) into `lhs`, or returns its Error from the enclosing
/// function.
#define KILN_ASSIGN_OR_RETURN(lhs, expr)                 \
  do {                                                   \
    auto kiln_result_ = (expr);                          \
    if (!kiln_result_.ok()) return kiln_result_.error(); \
    lhs = std::move(kiln_result_.get());                 \
  } while (0)
