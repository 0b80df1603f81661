// Test-only fault injection into the engine's launch path. It exists only in the test variants of
// the engine and backend libraries (kiln_engine_fault_injection, kiln_executorch_backend_fault_injection),
// which compile the engine with KILN_ENGINE_FAULT_INJECTION (engine_execute.cu and engine_graph.cu
// act on it); the shipped libraries contain none of it.
//
// An armed op does not enqueue its own work: a kernel launch that CUDA rejects takes its place, so
// the executor's ordinary launch check (cudaGetLastError after each op) sees a real launch error
// and reports it through the same path a genuine failure takes.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

// Exported from the test backend library, so a test that links it can arm the fault.
#define KILN_FAULT_API extern "C" __attribute__((visibility("default")))

/// Makes the next `times` launches of op `op_index` (in any engine of the process, eager or under
/// graph capture) fail for real: a block of 2048 threads, which CUDA rejects
/// (cudaErrorInvalidValue on CUDA 13, cudaErrorInvalidConfiguration on older runtimes). `times` = 0 disarms. Thread-safe.
KILN_FAULT_API void kiln_fault_fail_launch(size_t op_index, int times);

/// cudaGraphLaunch calls made by every engine in the process so far, so a test can tell a graph
/// replay from an eager run.
KILN_FAULT_API unsigned long long kiln_fault_graph_launches();

namespace kiln::engine::fault {

/// True when op `op_index` must fail now; consumes one armed failure.
bool take_launch_failure(size_t op_index);

/// Launches a kernel with more threads per block than any GPU allows on `stream`: nothing runs,
/// and the error is left for the caller's cudaGetLastError.
void launch_rejected_kernel(cudaStream_t stream);

void count_graph_launch();

}  // namespace kiln::engine::fault
