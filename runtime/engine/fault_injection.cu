// Test-only: see fault_injection.h. Built only into the fault-injection test variants.
#include "runtime/engine/fault_injection.h"

#include <atomic>

namespace kiln::engine::fault {
namespace {

std::atomic<size_t> g_op{0};
std::atomic<int> g_times{0};
std::atomic<unsigned long long> g_graph_launches{0};

// 1024 threads per block is the limit on every CUDA GPU, so 2048 is rejected at launch.
constexpr unsigned kTooManyThreads = 2048;

__global__ void rejected_kernel() {}

}  // namespace

bool take_launch_failure(size_t op_index) {
  if (g_op.load() != op_index) {
    return false;
  }
  int left = g_times.load();
  while (left > 0) {
    if (g_times.compare_exchange_weak(left, left - 1)) {
      return true;
    }
  }
  return false;
}

void launch_rejected_kernel(cudaStream_t stream) {
  rejected_kernel<<<1, kTooManyThreads, 0, stream>>>();
}

void count_graph_launch() { g_graph_launches.fetch_add(1); }

}  // namespace kiln::engine::fault

void kiln_fault_fail_launch(size_t op_index, int times) {
  if (times > 0) {
    // Load the kernel now (CUDA loads modules lazily), so its first launch under a graph capture
    // fails only for its launch configuration.
    cudaFuncAttributes attributes{};
    (void)cudaFuncGetAttributes(&attributes, kiln::engine::fault::rejected_kernel);
    (void)cudaGetLastError();
  }
  kiln::engine::fault::g_times.store(0);  // no half-armed state is ever visible
  kiln::engine::fault::g_op.store(op_index);
  kiln::engine::fault::g_times.store(times);
}

unsigned long long kiln_fault_graph_launches() {
  return kiln::engine::fault::g_graph_launches.load();
}
