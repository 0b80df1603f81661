#include "runtime/engine/kernels/embedding.cuh"

#include "runtime/engine/kernels/common.cuh"

namespace kiln::engine::kernels {
namespace {

using blob::DType;
using executorch::runtime::Error;

// Rows are moved as `Word`s: the element, or 16 bytes when the row length and addresses allow.
// `dim` is the row length in words.
template <typename Word, typename Index>
__global__ void embedding_kernel(const Word* __restrict__ weight, const Index* __restrict__ indices,
                                 Word* __restrict__ out, int64_t num_indices, int64_t dim,
                                 int64_t vocab, DeviceErrorFlag* __restrict__ flag,
                                 unsigned long long op_plus_one) {
  const int64_t total = num_indices * dim;
  for (int64_t i = thread_index(); i < total; i += thread_count()) {
    const int64_t row = i / dim;
    const int64_t col = i - row * dim;
    const int64_t index = static_cast<int64_t>(indices[row]);
    if (index >= 0 && index < vocab) {
      out[i] = weight[index * dim + col];
    } else {
      out[i] = Word{};
      if (col == 0 && atomicCAS(&flag->op_plus_one, 0ull, op_plus_one) == 0ull) {
        flag->index = index;
        flag->position = row;
      }
    }
  }
}

template <typename Word>
void launch(const void* weight, const void* indices, bool int64_indices, void* out,
            int64_t num_indices, int64_t dim_words, int64_t vocab, const RunContext& ctx) {
  const unsigned blocks = blocks_for(num_indices * dim_words, kBlock, ctx.max_blocks);
  const auto op = static_cast<unsigned long long>(ctx.op_index) + 1;
  if (int64_indices) {
    embedding_kernel<Word, int64_t><<<blocks, kBlock, 0, ctx.stream>>>(
        static_cast<const Word*>(weight), static_cast<const int64_t*>(indices),
        static_cast<Word*>(out), num_indices, dim_words, vocab, ctx.error_flag, op);
  } else {
    embedding_kernel<Word, int32_t><<<blocks, kBlock, 0, ctx.stream>>>(
        static_cast<const Word*>(weight), static_cast<const int32_t*>(indices),
        static_cast<Word*>(out), num_indices, dim_words, vocab, ctx.error_flag, op);
  }
}

class EmbeddingStep final : public Step {
 public:
  EmbeddingStep(const EmbeddingArgs& args, const Graph& graph)
      : a_(args),
        element_(element_size(graph.tensors[args.weight].dtype)),
        int64_indices_(graph.tensors[args.indices].dtype == DType::kInt64) {}

  Error enqueue(const RunContext& ctx) override {
    if (a_.num_indices == 0 || a_.dim == 0) {
      return Error::Ok;
    }
    const void* weight = ctx.ptr(a_.weight);
    const void* indices = ctx.ptr(a_.indices);
    void* out = ctx.ptr(a_.out);
    const int64_t row_bytes = a_.dim * static_cast<int64_t>(element_);
    const bool wide = row_bytes % 16 == 0 && alignment_of(weight) >= 16 && alignment_of(out) >= 16;
    const size_t word = wide ? 16 : element_;
    const int64_t dim_words = row_bytes / static_cast<int64_t>(word);
    switch (word) {
      case 1:
        launch<uint8_t>(weight, indices, int64_indices_, out, a_.num_indices, dim_words, a_.vocab,
                        ctx);
        break;
      case 2:
        launch<uint16_t>(weight, indices, int64_indices_, out, a_.num_indices, dim_words, a_.vocab,
                         ctx);
        break;
      case 4:
        launch<uint32_t>(weight, indices, int64_indices_, out, a_.num_indices, dim_words, a_.vocab,
                         ctx);
        break;
      case 8:
        launch<uint64_t>(weight, indices, int64_indices_, out, a_.num_indices, dim_words, a_.vocab,
                         ctx);
        break;
      default:
        launch<uint4>(weight, indices, int64_indices_, out, a_.num_indices, dim_words, a_.vocab,
                      ctx);
        break;
    }
    return Error::Ok;
  }

 private:
  EmbeddingArgs a_;
  size_t element_;
  bool int64_indices_;
};

// --- Embedding bags: a block per bag (grid-stride over bags), its threads across the row. Bag b
// holds indices[offsets[b], end) with end offsets[b + 1], or num_indices for the last offset.
// Sums run in fp32 in index order (torch's CPU order); max keeps the first of equal values; an
// empty bag is 0. A bag outside [0, num_indices) or an index outside [0, vocab) flags the op and
// writes 0 (the bag) or skips the row (the index). ---

template <typename T>
__global__ void embedding_bag_kernel(const T* __restrict__ weight, const void* __restrict__ indices,
                                     DType index_dtype, const void* __restrict__ offsets,
                                     DType offset_dtype, T* __restrict__ out, EmbeddingBagArgs a,
                                     DeviceErrorFlag* __restrict__ flag,
                                     unsigned long long op_plus_one) {
  for (int64_t bag = blockIdx.x; bag < a.num_bags; bag += gridDim.x) {
    const int64_t start = load_i64(offsets, offset_dtype, bag);
    const int64_t end =
        bag + 1 < a.num_offsets ? load_i64(offsets, offset_dtype, bag + 1) : a.num_indices;
    const bool bad_bag = start < 0 || end < start || end > a.num_indices;
    if (bad_bag && threadIdx.x == 0 && atomicCAS(&flag->op_plus_one, 0ull, op_plus_one) == 0ull) {
      flag->index = start < 0 || start > a.num_indices ? start : end;
      flag->position = -1 - bag;  // a bag, not an index: told apart by the sign
    }
    for (int64_t col = threadIdx.x; col < a.dim; col += blockDim.x) {
      float acc = 0.0f;
      bool any = false;
      for (int64_t j = bad_bag ? end : start; j < end; ++j) {
        const int64_t index = load_i64(indices, index_dtype, j);
        if (index < 0 || index >= a.vocab) {
          if (col == 0 && atomicCAS(&flag->op_plus_one, 0ull, op_plus_one) == 0ull) {
            flag->index = index;
            flag->position = j;
          }
          continue;
        }
        const float v = to_float(weight[index * a.dim + col]);
        if (a.mode == blob::BagMode::kMax) {
          acc = !any || v > acc ? v : acc;
        } else {
          acc += v;
        }
        any = true;
      }
      if (a.mode == blob::BagMode::kMean && end > start) {
        acc /= static_cast<float>(end - start);
      }
      out[bag * a.dim + col] = from_float<T>(any ? acc : 0.0f);
    }
  }
}

class EmbeddingBagStep final : public Step {
 public:
  EmbeddingBagStep(const EmbeddingBagArgs& args, const Graph& graph)
      : a_(args),
        dtype_(graph.tensors[args.weight].dtype),
        index_dtype_(graph.tensors[args.indices].dtype),
        offset_dtype_(graph.tensors[args.offsets].dtype) {}

  Error enqueue(const RunContext& ctx) override {
    if (a_.num_bags == 0 || a_.dim == 0) {
      return Error::Ok;
    }
    const unsigned threads = a_.dim >= kBlock ? kBlock : static_cast<unsigned>((a_.dim + 31) / 32 * 32);
    const unsigned blocks = blocks_for(a_.num_bags, 1, ctx.max_blocks);
    const auto op = static_cast<unsigned long long>(ctx.op_index) + 1;
    visit_floating(dtype_, [&](auto tag) {
      using T = typename decltype(tag)::type;
      embedding_bag_kernel<T><<<blocks, threads, 0, ctx.stream>>>(
          ctx.ptr<const T>(a_.weight), ctx.ptr(a_.indices), index_dtype_, ctx.ptr(a_.offsets),
          offset_dtype_, ctx.ptr<T>(a_.out), a_, ctx.error_flag, op);
    });
    return Error::Ok;
  }

 private:
  EmbeddingBagArgs a_;
  DType dtype_, index_dtype_, offset_dtype_;
};

}  // namespace

StepResult make_embedding_step(const EmbeddingArgs& args, const InitContext& ctx) {
  return std::unique_ptr<Step>(new EmbeddingStep(args, ctx.graph));
}

StepResult make_embedding_bag_step(const EmbeddingBagArgs& args, const InitContext& ctx) {
  return std::unique_ptr<Step>(new EmbeddingBagStep(args, ctx.graph));
}

}  // namespace kiln::engine::kernels
