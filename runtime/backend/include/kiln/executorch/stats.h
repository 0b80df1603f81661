// What the Kiln backend library reports about its work in this process, as C functions: the
// device memory its engines hold, the bytes they copy between host and device, and per-op GPU
// time (the profiler behind `kiln_runner --profile`). Installed as <kiln/executorch/stats.h>;
// link kiln::executorch_backend, which defines the functions, or look them up with dlsym/ctypes
// (kiln_runner and the Python package do, so they also run without the library). C and C++.
#pragma once

#include <stddef.h>
#include <stdint.h>

#include <kiln/executorch/api.h>

#ifdef __cplusplus
extern "C" {
#endif

// Device memory Kiln holds in this process, summed over devices, in bytes; safe to call from any
// thread, with or without a GPU. Weights go through a process-wide cache keyed by content: two
// delegates (methods, programs) whose blobs carry the same weight tensor on the same device share
// one copy, freed when the last engine using it is destroyed (its method or program unloaded).

/// Weight tensors resident on the device, each distinct tensor counted once however many
/// delegates use it.
KILN_EXECUTORCH_API uint64_t kiln_executorch_weight_bytes(void);
/// Device memory allocated for those tensors: kiln_executorch_weight_bytes() plus the alignment
/// padding between small tensors packed into one allocation.
KILN_EXECUTORCH_API uint64_t kiln_executorch_weight_allocated_bytes(void);
/// The sum over live delegates of the weight bytes each uses: what they would hold without
/// sharing.
KILN_EXECUTORCH_API uint64_t kiln_executorch_weight_requested_bytes(void);
/// Activation memory of live delegates: arenas, input/output staging buffers, library workspaces.
KILN_EXECUTORCH_API uint64_t kiln_executorch_activation_bytes(void);

/// Cumulative host<->device bytes copied for Kiln in this process, and the number of engine
/// executions. Bytes count both paths: Kiln engines staging host bindings (and reading back the
/// error flag of range-checked graphs) in execute(), and every copy through Kiln's CUDA allocator
/// (ExecuTorch's et_copy kernels around each delegate call, or an application filling device
/// memory). Weights and initial state uploaded at init are excluded. Any pointer may be null.
/// Program state (e.g. a KV cache) stays on the device, so the difference across one decode step
/// is its inputs and outputs only.
KILN_EXECUTORCH_API void kiln_executorch_copy_counters(uint64_t* host_to_device_bytes,
                                                       uint64_t* device_to_host_bytes,
                                                       uint64_t* executes);

// Per-op GPU time of Kiln engines (what `kiln_runner --profile` prints). While profiling is on,
// every Kiln execute runs its ops eagerly (no CUDA graph replay) with a CUDA event between
// consecutive ops and waits for its stream at the end, so runs are slower than without it: use
// it to see where the time goes, not to measure latency. Off (the default) it costs one branch
// per execute. Safe to call from any thread; an execute already in flight is not affected.

/// Turns profiling on (non-zero) or off for every Kiln engine in the process. Times recorded
/// so far are kept; kiln_executorch_reset_profile() clears them.
KILN_EXECUTORCH_API void kiln_executorch_set_profiling(int on);
/// Clears the times recorded so far (e.g. after a warm-up), for every live engine.
KILN_EXECUTORCH_API void kiln_executorch_reset_profile(void);
/// Writes the report as text into `buffer` (at most `size` bytes, always NUL-terminated when
/// size > 0; buffer may be null when size is 0) and returns the report's full length without
/// the NUL, like snprintf: call again with a larger buffer when the result is >= size. For each
/// live engine that ran with profiling on since the last reset, one header line ("Kiln engine N
/// (inputs ..., outputs ...; K ops): R profiled runs"; engines are numbered in the order they
/// first ran profiled), a column line, one line per op sorted by total time (rank, op index,
/// opcode, output dtype and shape, total ms, mean ms per run, % of the engine's op time), a
/// total line and "per run: op time X ms ... vs execute wall Y ms". Empty (0) when no engine ran
/// with profiling on.
KILN_EXECUTORCH_API size_t kiln_executorch_profile_report(char* buffer, size_t size);
/// GPU time of every op of every live engine since the last reset, summed, in milliseconds.
KILN_EXECUTORCH_API double kiln_executorch_profile_total_ms(void);

#ifdef __cplusplus
}  // extern "C"
#endif
