// kiln_llm's feed kernel (llm_feed.cuh).
#include "runner/llm_feed.cuh"

namespace kiln::runner {
namespace {

__global__ void feed_kernel(const int64_t* next, int64_t token, int64_t* token_in,
                            int64_t position, int64_t* position_in, int64_t* history,
                            int64_t index) {
  const int64_t t = next != nullptr ? *next : token;
  *token_in = t;
  *position_in = position;
  if (history != nullptr) history[index] = t;
}

}  // namespace

cudaError_t enqueue_feed(const int64_t* next, int64_t token, int64_t* token_in,
                         int64_t position, int64_t* position_in, int64_t* history, int64_t index,
                         cudaStream_t stream) {
  feed_kernel<<<1, 1, 0, stream>>>(next, token, token_in, position, position_in, history, index);
  return cudaGetLastError();
}

}  // namespace kiln::runner
