#include "runtime/engine/kernels/fill.cuh"

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
#include <cstring>
#include <limits>

#include "runtime/engine/cuda_check.h"
#include "runtime/engine/kernels/common.cuh"

namespace kiln::engine::kernels {
namespace {

using blob::DType;
using executorch::runtime::Error;

template <typename Word>
__global__ void fill_kernel(Word* __restrict__ out, int64_t n, Word value) {
  for (int64_t i = thread_index(); i < n; i += thread_count()) {
    out[i] = value;
  }
}

template <typename Int>
Int saturate(double v) {
  if (v != v) return 0;
  if (v >= static_cast<double>(std::numeric_limits<Int>::max())) {
    return std::numeric_limits<Int>::max();
  }
  if (v <= static_cast<double>(std::numeric_limits<Int>::min())) {
    return std::numeric_limits<Int>::min();
  }
  return static_cast<Int>(v);
}

// The element's bytes, computed once on the host.
void encode(double value, DType dtype, unsigned char* bytes) {
  switch (dtype) {
    case DType::kFloat32: {
      const float v = static_cast<float>(value);
      std::memcpy(bytes, &v, sizeof(v));
      return;
    }
    case DType::kFloat16: {
      const __half v = __double2half(value);
      std::memcpy(bytes, &v, sizeof(v));
      return;
    }
    case DType::kBFloat16: {
      const __nv_bfloat16 v = __double2bfloat16(value);
      std::memcpy(bytes, &v, sizeof(v));
      return;
    }
    case DType::kInt32: {
      const int32_t v = saturate<int32_t>(value);
      std::memcpy(bytes, &v, sizeof(v));
      return;
    }
    case DType::kInt64: {
      const int64_t v = saturate<int64_t>(value);
      std::memcpy(bytes, &v, sizeof(v));
      return;
    }
    case DType::kBool: bytes[0] = value != 0.0 ? 1 : 0; return;
  }
}

class FillStep final : public Step {
 public:
  FillStep(const FillArgs& args, const Graph& graph)
      : out_(args.out),
        nbytes_(graph.tensors[args.out].nbytes),
        element_(element_size(graph.tensors[args.out].dtype)) {
    unsigned char element[8] = {};
    encode(args.value, graph.tensors[args.out].dtype, element);
    for (size_t i = 0; i < sizeof(pattern_); ++i) {
      pattern_[i] = element[i % element_];
    }
    uniform_bytes_ = true;
    for (size_t i = 1; i < element_; ++i) {
      uniform_bytes_ = uniform_bytes_ && element[i] == element[0];
    }
  }

  Error enqueue(const RunContext& ctx) override {
    if (nbytes_ == 0) {
      return Error::Ok;
    }
    void* out = ctx.ptr(out_);
    if (uniform_bytes_) {  // zeros, Bool, and any value whose bytes repeat
      return cuda_status(cudaMemsetAsync(out, pattern_[0], nbytes_, ctx.stream), Error::Internal,
                         "Kiln engine: op %zu (fill): cudaMemsetAsync failed", ctx.op_index);
    }
    if (alignment_of(out) >= 16 && nbytes_ % 16 == 0) {
      uint4 word;
      std::memcpy(&word, pattern_, sizeof(word));
      const int64_t n = static_cast<int64_t>(nbytes_ / 16);
      fill_kernel<uint4><<<blocks_for(n, kBlock, ctx.max_blocks), kBlock, 0, ctx.stream>>>(
          static_cast<uint4*>(out), n, word);
      return Error::Ok;
    }
    const int64_t n = static_cast<int64_t>(nbytes_ / element_);
    const unsigned blocks = blocks_for(n, kBlock, ctx.max_blocks);
    switch (element_) {
      case 2: {
        uint16_t v;
        std::memcpy(&v, pattern_, sizeof(v));
        fill_kernel<uint16_t><<<blocks, kBlock, 0, ctx.stream>>>(static_cast<uint16_t*>(out), n, v);
        break;
      }
      case 4: {
        uint32_t v;
        std::memcpy(&v, pattern_, sizeof(v));
        fill_kernel<uint32_t><<<blocks, kBlock, 0, ctx.stream>>>(static_cast<uint32_t*>(out), n, v);
        break;
      }
      default: {
        uint64_t v;
        std::memcpy(&v, pattern_, sizeof(v));
        fill_kernel<uint64_t><<<blocks, kBlock, 0, ctx.stream>>>(static_cast<uint64_t*>(out), n, v);
        break;
      }
    }
    return Error::Ok;
  }

 private:
  int64_t out_;
  size_t nbytes_;
  size_t element_;
  unsigned char pattern_[16] = {};  // the element repeated to 16 bytes
  bool uniform_bytes_ = false;
};

}  // namespace

StepResult make_fill_step(const FillArgs& args, const InitContext& ctx) {
  return std::unique_ptr<Step>(new FillStep(args, ctx.graph));
}

}  // namespace kiln::engine::kernels
