// kiln_runner's diagnostics: ExecuTorch's log filtered by KILN_LOG, and the final error line that
// names what failed and what to do about it (the missing kernel or backend the log named).
#pragma once

#include <executorch/runtime/core/error.h>

#include <string>

namespace kiln::runner {

/// Routes ExecuTorch's log through the runner: lines below KILN_LOG's level (debug, info, error;
/// default: errors and fatals only) are dropped, and every line is read for a missing kernel or
/// backend that fail() can then name.
void install_log_filter();

/// What to do about `e`, worded for the stage where it usually happens (InvalidArgument: a method's
/// inputs; InvalidProgram: the file).
const char* hint(executorch::runtime::Error e);

/// "OperatorMissing" rather than ExecuTorch's "Error::OperatorMissing".
const char* error_name(executorch::runtime::Error e);

/// The name fail() starts its lines with ("kiln_runner" unless set; kiln_llm sets its own).
void set_tool_name(const char* name);

/// Prints "kiln_runner: <what> failed: <error> (0x..): <what to do>" to stderr and exits 1.
[[noreturn]] void fail(const std::string& what, executorch::runtime::Error e);

/// As above with the caller's own <what to do>, for a stage where the error's usual hint misleads.
[[noreturn]] void fail(const std::string& what, executorch::runtime::Error e, const std::string& why);

/// Prints "kiln_runner: <message>" to stderr and exits 1.
[[noreturn]] void fail(const std::string& message);

}  // namespace kiln::runner
