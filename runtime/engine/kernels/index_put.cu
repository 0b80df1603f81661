#include "runtime/engine/kernels/index_put.cuh"

#include "runtime/engine/kernels/common.cuh"
#include "runtime/engine/kernels/positions.cuh"

namespace kiln::engine::kernels {
namespace {

using blob::DType;
using executorch::runtime::Error;

template <typename Index>
__global__ void check_positions_kernel(const Index* __restrict__ positions, int64_t num_positions,
                                       int64_t dim_size, DeviceErrorFlag* __restrict__ flag,
                                       unsigned long long op_plus_one) {
  flag_bad_positions(positions, num_positions, dim_size, flag, op_plus_one);
}

// Rows are moved as `Word`s; `inner` is the row length in words. kSelfCheck: the block first
// checks every position and writes nothing (setting the flag) when any is outside the state, so
// no block writes a row of a call with a bad position; otherwise check_positions_kernel ran first.
template <typename Word, typename Index, bool kSelfCheck>
__global__ void index_put_kernel(const Word* __restrict__ values, const Index* __restrict__ positions,
                                 Word* __restrict__ out, int64_t outer, int64_t num_positions,
                                 int64_t dim_size, int64_t inner,
                                 DeviceErrorFlag* __restrict__ flag, unsigned long long op_plus_one) {
  wait_for_previous_kernel();   // the self-checked kernel is launched overlapped (common.cuh)
  allow_next_kernel();
  if constexpr (kSelfCheck) {
    if (__syncthreads_or(flag_bad_positions(positions, num_positions, dim_size, flag,
                                            op_plus_one))) {
      return;
    }
  }
  if (run_failed(flag)) return;  // a bad position (or an earlier op's range error): keep the state
  const int64_t total = outer * num_positions * inner;
  for (int64_t e = thread_index(); e < total; e += thread_count()) {
    const int64_t j = e % inner;
    const int64_t row = e / inner;
    const int64_t i = row % num_positions;
    const int64_t o = row / num_positions;
    const int64_t p = static_cast<int64_t>(positions[i]);
    out[(o * dim_size + p) * inner + j] = values[e];
  }
}

template <typename Word, typename Index>
void launch(const IndexPutArgs& a, const void* values, const void* positions, void* out,
            int64_t inner_words, const RunContext& ctx) {
  const auto op = static_cast<unsigned long long>(ctx.op_index) + 1;
  const auto* pos = static_cast<const Index*>(positions);
  const unsigned blocks =
      blocks_for(a.outer * a.num_positions * inner_words, kBlock, ctx.max_blocks);
  if (a.num_positions <= kSelfCheckedPositions) {
    launch_overlapped(index_put_kernel<Word, Index, true>, blocks, kBlock, 0, ctx.stream,
                      static_cast<const Word*>(values), pos, static_cast<Word*>(out), a.outer,
                      a.num_positions, a.dim_size, inner_words, ctx.error_flag, op);
    return;
  }
  check_positions_kernel<Index><<<1, kBlock, 0, ctx.stream>>>(pos, a.num_positions, a.dim_size,
                                                              ctx.error_flag, op);
  index_put_kernel<Word, Index, false><<<blocks, kBlock, 0, ctx.stream>>>(
      static_cast<const Word*>(values), pos, static_cast<Word*>(out), a.outer, a.num_positions,
      a.dim_size, inner_words, ctx.error_flag, op);
}

template <typename Word>
void launch_word(const IndexPutArgs& a, bool int64_positions, const void* values,
                 const void* positions, void* out, int64_t inner_words, const RunContext& ctx) {
  if (int64_positions) {
    launch<Word, int64_t>(a, values, positions, out, inner_words, ctx);
  } else {
    launch<Word, int32_t>(a, values, positions, out, inner_words, ctx);
  }
}

class IndexPutStep final : public Step {
 public:
  IndexPutStep(const IndexPutArgs& args, const Graph& graph)
      : a_(args),
        element_(element_size(graph.tensors[args.out].dtype)),
        int64_positions_(graph.tensors[args.positions].dtype == DType::kInt64) {}

  Error enqueue(const RunContext& ctx) override {
    if (a_.outer == 0 || a_.num_positions == 0 || a_.inner == 0) {
      return Error::Ok;
    }
    const void* values = ctx.ptr(a_.values);
    const void* positions = ctx.ptr(a_.positions);
    void* out = ctx.ptr(a_.out);
    const int64_t row_bytes = a_.inner * static_cast<int64_t>(element_);
    const bool wide = row_bytes % 16 == 0 && alignment_of(values) >= 16 && alignment_of(out) >= 16;
    const size_t word = wide ? 16 : element_;
    const int64_t inner_words = row_bytes / static_cast<int64_t>(word);
    switch (word) {
      case 1: launch_word<uint8_t>(a_, int64_positions_, values, positions, out, inner_words, ctx); break;
      case 2: launch_word<uint16_t>(a_, int64_positions_, values, positions, out, inner_words, ctx); break;
      case 4: launch_word<uint32_t>(a_, int64_positions_, values, positions, out, inner_words, ctx); break;
      case 8: launch_word<uint64_t>(a_, int64_positions_, values, positions, out, inner_words, ctx); break;
      default: launch_word<uint4>(a_, int64_positions_, values, positions, out, inner_words, ctx); break;
    }
    return Error::Ok;
  }

 private:
  IndexPutArgs a_;
  size_t element_;
  bool int64_positions_;
};

}  // namespace

StepResult make_index_put_step(const IndexPutArgs& args, const InitContext& ctx) {
  return std::unique_ptr<Step>(new IndexPutStep(args, ctx.graph));
}

}  // namespace kiln::engine::kernels
