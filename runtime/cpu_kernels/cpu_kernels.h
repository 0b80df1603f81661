// CPU kernels for core ATen operators that the pinned executorch wheel's kernel library does not
// register (its libexecutorch_kernels_optimized.so has no aten::erfinv.out), so portable programs
// that use them still run in kiln_runner. The program's other operators stay ExecuTorch's.
#pragma once

namespace kiln {

/// Registers each kernel of this library whose operator has no kernel in the process yet. Safe to
/// call more than once; never registers a name twice (ExecuTorch's registry aborts on that).
/// Call it before loading a method.
void register_missing_cpu_kernels();

}  // namespace kiln
