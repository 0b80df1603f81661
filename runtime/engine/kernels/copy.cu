#include "runtime/engine/kernels/copy.cuh"

#include <cuda_runtime.h>

#include "runtime/engine/cuda_check.h"
#include "runtime/engine/kernels/common.cuh"

namespace kiln::engine::kernels {
namespace {

using executorch::runtime::Error;

// Same dtype: a pure move of `Word`s, where Word is the element or, after widening, up to 16
// bytes of consecutive elements. Operand 0 is out, operand 1 is x.
template <typename Word, typename Index>
__global__ void copy_kernel(Word* __restrict__ out, const Word* __restrict__ in,
                            const StridedLoop<2> loop) {
  const Index n = static_cast<Index>(loop.numel);
  for (Index i = static_cast<Index>(thread_index()); i < n;
       i += static_cast<Index>(thread_count())) {
    int64_t off[2];
    strided_offsets(loop, i, off);
    out[off[0]] = in[off[1]];
  }
}

// Different dtypes: integer to integer goes through int64 (exact); anything involving a floating
// dtype goes through double (exact for every source value but int64 beyond 2^53).
template <typename Index>
__global__ void cast_kernel(void* __restrict__ out, blob::DType out_dtype,
                            const void* __restrict__ in, blob::DType in_dtype,
                            const StridedLoop<2> loop, bool integral) {
  const Index n = static_cast<Index>(loop.numel);
  for (Index i = static_cast<Index>(thread_index()); i < n;
       i += static_cast<Index>(thread_count())) {
    int64_t off[2];
    strided_offsets(loop, i, off);
    if (integral) {
      store_i64(out, out_dtype, off[0], load_i64(in, in_dtype, off[1]));
    } else {
      store_f64(out, out_dtype, off[0], load_f64(in, in_dtype, off[1]));
    }
  }
}

template <typename Word>
void launch_copy(void* out, const void* in, const StridedLoop<2>& loop, const RunContext& ctx) {
  const unsigned blocks = blocks_for(loop.numel, kBlock, ctx.max_blocks);
  if (loop.numel <= INT32_MAX) {
    copy_kernel<Word, uint32_t><<<blocks, kBlock, 0, ctx.stream>>>(
        static_cast<Word*>(out), static_cast<const Word*>(in), loop);
  } else {
    copy_kernel<Word, int64_t><<<blocks, kBlock, 0, ctx.stream>>>(
        static_cast<Word*>(out), static_cast<const Word*>(in), loop);
  }
}

class CopyStep final : public Step {
 public:
  CopyStep(const CopyArgs& a, const Graph& graph)
      : x_(a.x),
        out_(a.out),
        in_dtype_(graph.tensors[a.x].dtype),
        out_dtype_(graph.tensors[a.out].dtype) {
    const int64_t* strides[2] = {a.out_strides, a.in_strides};
    loop_ = collapse<2>(a.rank, a.sizes, strides);
    in_byte_offset_ = a.in_offset * static_cast<int64_t>(element_size(in_dtype_));
    out_byte_offset_ = a.out_offset * static_cast<int64_t>(element_size(out_dtype_));
  }

  Error enqueue(const RunContext& ctx) override {
    if (loop_.numel == 0) {
      return Error::Ok;
    }
    char* out = ctx.ptr<char>(out_) + out_byte_offset_;
    const char* in = ctx.ptr<const char>(x_) + in_byte_offset_;
    if (in_dtype_ != out_dtype_) {
      const bool integral = !is_floating(in_dtype_) && !is_floating(out_dtype_);
      const unsigned blocks = blocks_for(loop_.numel, kBlock, ctx.max_blocks);
      if (loop_.numel <= INT32_MAX) {
        cast_kernel<uint32_t>
            <<<blocks, kBlock, 0, ctx.stream>>>(out, out_dtype_, in, in_dtype_, loop_, integral);
      } else {
        cast_kernel<int64_t>
            <<<blocks, kBlock, 0, ctx.stream>>>(out, out_dtype_, in, in_dtype_, loop_, integral);
      }
      return Error::Ok;
    }
    const size_t elem = element_size(in_dtype_);
    if (is_dense(loop_, 0) && is_dense(loop_, 1)) {
      // A contiguous run on both sides: the copy engine does it at full bandwidth.
      return cuda_status(cudaMemcpyAsync(out, in, static_cast<size_t>(loop_.numel) * elem,
                                         cudaMemcpyDeviceToDevice, ctx.stream),
                         Error::Internal, "Kiln engine: op %zu (copy): cudaMemcpyAsync failed",
                         ctx.op_index);
    }
    // Move the widest word that every address, stride and the inner run allow.
    const uint32_t align =
        alignment_of(out) < alignment_of(in) ? alignment_of(out) : alignment_of(in);
    for (size_t word = 16; word > elem; word /= 2) {
      StridedLoop<2> wide = loop_;
      const int64_t no_offsets[2] = {0, 0};
      if (align % word == 0 && widen(wide, no_offsets, static_cast<int64_t>(word / elem))) {
        launch_word(word, out, in, wide, ctx);
        return Error::Ok;
      }
    }
    launch_word(elem, out, in, loop_, ctx);
    return Error::Ok;
  }

 private:
  static void launch_word(size_t bytes, void* out, const void* in, const StridedLoop<2>& loop,
                          const RunContext& ctx) {
    switch (bytes) {
      case 1: return launch_copy<uint8_t>(out, in, loop, ctx);
      case 2: return launch_copy<uint16_t>(out, in, loop, ctx);
      case 4: return launch_copy<uint32_t>(out, in, loop, ctx);
      case 8: return launch_copy<uint64_t>(out, in, loop, ctx);
      default: return launch_copy<uint4>(out, in, loop, ctx);
    }
  }

  int64_t x_, out_;
  blob::DType in_dtype_, out_dtype_;
  StridedLoop<2> loop_;
  int64_t in_byte_offset_ = 0, out_byte_offset_ = 0;
};

}  // namespace

StepResult make_copy_step(const CopyArgs& args, const InitContext& ctx) {
  return std::unique_ptr<Step>(new CopyStep(args, ctx.graph));
}

}  // namespace kiln::engine::kernels
