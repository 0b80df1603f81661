#include "runtime/engine/kernels/reduce.cuh"

#include <type_traits>

#include "runtime/engine/kernels/common.cuh"

namespace kiln::engine::kernels {
namespace {

using blob::DType;
using blob::ReduceKind;
using executorch::runtime::Error;

template <typename T>
using AccOf = std::conditional_t<std::is_integral_v<T>, int64_t, double>;

template <typename Acc>
__device__ __forceinline__ Acc identity(ReduceKind kind) {
  if (kind == ReduceKind::kAmax) {
    if constexpr (std::is_integral_v<Acc>)
      return INT64_MIN;
    else
      return -INFINITY;
  }
  if (kind == ReduceKind::kAmin) {
    if constexpr (std::is_integral_v<Acc>)
      return INT64_MAX;
    else
      return INFINITY;
  }
  return Acc{0};
}

template <typename Acc>
struct Combine {
  ReduceKind kind;
  __device__ __forceinline__ Acc operator()(Acc a, Acc b) const {
    switch (kind) {
      case ReduceKind::kAmax:
        if constexpr (!std::is_integral_v<Acc>) {
          if (a != a || b != b) return a != a ? a : b;
        }
        return a > b ? a : b;
      case ReduceKind::kAmin:
        if constexpr (!std::is_integral_v<Acc>) {
          if (a != a || b != b) return a != a ? a : b;
        }
        return a < b ? a : b;
      case ReduceKind::kAny: return (a != Acc{0} || b != Acc{0}) ? Acc{1} : Acc{0};
      default:
        if constexpr (std::is_integral_v<Acc>) {
          return static_cast<int64_t>(static_cast<uint64_t>(a) + static_cast<uint64_t>(b));
        } else {
          return a + b;
        }
    }
  }
};

template <typename T, typename Acc>
__device__ __forceinline__ Acc value(ReduceKind kind, T v) {
  if constexpr (std::is_integral_v<Acc>) {
    const int64_t i = to_int(v);
    return kind == ReduceKind::kAny ? (i != 0) : i;
  } else {
    const double f = to_float(v);
    return kind == ReduceKind::kAny ? (f != 0.0 ? 1.0 : 0.0) : f;
  }
}

template <typename Acc>
__device__ __forceinline__ void store_result(void* out, DType out_dtype, int64_t i, Acc acc,
                                             ReduceKind kind, int64_t reduce) {
  if (kind == ReduceKind::kMean) {
    store_f64(out, out_dtype, i, static_cast<double>(acc) / static_cast<double>(reduce));
  } else if constexpr (std::is_integral_v<Acc>) {
    store_i64(out, out_dtype, i, acc);
  } else {
    store_f64(out, out_dtype, i, acc);
  }
}

// inner == 1: a group of kGroup threads (warp or block) per contiguous row.
template <typename T, int kGroup>
__global__ void reduce_rows_kernel(const T* __restrict__ x, void* __restrict__ out, DType out_dtype,
                                   int64_t rows, int64_t cols, ReduceKind kind) {
  using Acc = AccOf<T>;
  __shared__ Acc scratch[32];
  const Combine<Acc> combine{kind};
  const RowGroup group = row_group<kGroup>();
  for (int64_t row = group.first; row < rows; row += group.stride) {
    const T* xr = x + row * cols;
    Acc acc = identity<Acc>(kind);
    for (int64_t c = group.lane; c < cols; c += kGroup) {
      acc = combine(acc, value<T, Acc>(kind, xr[c]));
    }
    acc = group_reduce<kGroup>(acc, combine, scratch);
    if (group.lane == 0) {
      store_result(out, out_dtype, row, acc, kind, cols);
    }
  }
}

// inner > 1: a thread per output walks the reduced axis with stride `inner` (coalesced across
// neighbouring threads).
template <typename T>
__global__ void reduce_columns_kernel(const T* __restrict__ x, void* __restrict__ out,
                                      DType out_dtype, int64_t outer, int64_t reduce, int64_t inner,
                                      ReduceKind kind) {
  using Acc = AccOf<T>;
  const Combine<Acc> combine{kind};
  const int64_t outputs = outer * inner;
  for (int64_t i = thread_index(); i < outputs; i += thread_count()) {
    const int64_t o = i / inner;
    const T* base = x + o * reduce * inner + (i - o * inner);
    Acc acc = identity<Acc>(kind);
    for (int64_t r = 0; r < reduce; ++r) {
      acc = combine(acc, value<T, Acc>(kind, base[r * inner]));
    }
    store_result(out, out_dtype, i, acc, kind, reduce);
  }
}

// inner > 1 with few outputs and a long reduced axis (a global average pool over NHWC activations:
// inner = channels, reduce = H * W), where a thread per output would walk thousands of rows
// alone: a block covers kColTile neighbouring columns with kColRows rows at a time, and
// blockIdx.z takes one `chunk` of the axis. With one chunk the block writes the result; with
// several each writes its partial value to `partial` ([chunks, outer * inner]) and
// reduce_partials_kernel combines them in chunk order.
inline constexpr int kColTile = 32, kColRows = 8;

template <typename T>
__global__ void reduce_column_tiles_kernel(const T* __restrict__ x, void* __restrict__ out,
                                           DType out_dtype, int64_t reduce, int64_t inner,
                                           int64_t chunk, ReduceKind kind,
                                           AccOf<T>* __restrict__ partial) {
  using Acc = AccOf<T>;
  __shared__ Acc scratch[kColRows][kColTile];
  const Combine<Acc> combine{kind};
  const int64_t col = int64_t(blockIdx.x) * kColTile + threadIdx.x;
  const int64_t o = blockIdx.y;
  const int64_t begin = int64_t(blockIdx.z) * chunk;
  const int64_t end = begin + chunk < reduce ? begin + chunk : reduce;
  Acc acc = identity<Acc>(kind);
  if (col < inner) {
    const T* base = x + o * reduce * inner + col;
#pragma unroll 4
    for (int64_t r = begin + threadIdx.y; r < end; r += kColRows) {
      acc = combine(acc, value<T, Acc>(kind, base[r * inner]));
    }
  }
  scratch[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y != 0 || col >= inner) return;
  for (int k = 1; k < kColRows; ++k) acc = combine(acc, scratch[k][threadIdx.x]);
  const int64_t i = o * inner + col;
  if (gridDim.z == 1) {
    store_result(out, out_dtype, i, acc, kind, reduce);
  } else {
    partial[int64_t(blockIdx.z) * gridDim.y * inner + i] = acc;
  }
}

template <typename Acc>
__global__ void reduce_partials_kernel(const Acc* __restrict__ partial, void* __restrict__ out,
                                       DType out_dtype, int64_t outputs, int64_t chunks,
                                       int64_t reduce, ReduceKind kind) {
  const Combine<Acc> combine{kind};
  for (int64_t i = thread_index(); i < outputs; i += thread_count()) {
    Acc acc = identity<Acc>(kind);
    for (int64_t z = 0; z < chunks; ++z) acc = combine(acc, partial[z * outputs + i]);
    store_result(out, out_dtype, i, acc, kind, reduce);
  }
}

// How reduce_column_tiles_kernel splits [outer, reduce, inner]: chunks of the axis such that
// the grid has about kColTargetBlocks blocks, each chunk at least kColMinChunk rows. chunks == 0:
// the shape is left to reduce_columns_kernel (many outputs: a thread per output fills the GPU).
struct ColumnSplit {
  int64_t chunk = 0, chunks = 0;
};

inline ColumnSplit column_split(int64_t outer, int64_t reduce, int64_t inner) {
  constexpr int64_t kColTargetBlocks = 512, kColMinChunk = 64, kMaxOutputs = int64_t(1) << 18;
  ColumnSplit s;
  if (inner <= 1 || reduce < 2 * kColRows || outer > 65535 || outer * inner > kMaxOutputs) {
    return s;
  }
  const int64_t tiles = (inner + kColTile - 1) / kColTile * outer;
  int64_t chunks = (kColTargetBlocks + tiles - 1) / tiles;
  const int64_t most = (reduce + kColMinChunk - 1) / kColMinChunk;
  chunks = chunks < most ? chunks : most;
  chunks = chunks < 1024 ? chunks : 1024;
  s.chunk = (reduce + chunks - 1) / chunks;
  s.chunks = (reduce + s.chunk - 1) / s.chunk;
  return s;
}

// --- Argmax / argmin: the index of the first largest / smallest element, NaN counting as the
// largest (argmax) and the smallest (argmin), as torch gives. Values compare in fp32 (exact for
// every floating storage type) or int64. ---

template <typename T>
using ArgValueOf = std::conditional_t<std::is_integral_v<T>, int64_t, float>;

template <typename T>
__device__ __forceinline__ ArgValueOf<T> arg_value(T v) {
  if constexpr (std::is_integral_v<T>) {
    return to_int(v);
  } else {
    return to_float(v);
  }
}

template <typename V>
struct ArgAcc {
  V v;
  int64_t i;
};

template <typename V>
__device__ __forceinline__ ArgAcc<V> arg_identity(bool is_max) {
  if constexpr (std::is_integral_v<V>) {
    return {is_max ? INT64_MIN : INT64_MAX, INT64_MAX};
  } else {
    return {is_max ? -INFINITY : INFINITY, INT64_MAX};
  }
}

// Whether `a` wins over `b`: a NaN wins over a number, a strictly better value wins, and between
// equals (two NaNs included) the smaller index wins.
template <typename V>
__device__ __forceinline__ ArgAcc<V> arg_combine(ArgAcc<V> a, ArgAcc<V> b, bool is_max) {
  if constexpr (!std::is_integral_v<V>) {
    const bool an = a.v != a.v, bn = b.v != b.v;
    if (an || bn) {
      if (an && bn) return a.i <= b.i ? a : b;
      return an ? a : b;
    }
  }
  if (a.v != b.v) {
    return (is_max ? a.v > b.v : a.v < b.v) ? a : b;
  }
  return a.i <= b.i ? a : b;
}

template <typename V>
__device__ __forceinline__ ArgAcc<V> arg_warp_reduce(ArgAcc<V> acc, bool is_max) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) {
    const ArgAcc<V> other{__shfl_xor_sync(0xffffffffu, acc.v, offset),
                          __shfl_xor_sync(0xffffffffu, acc.i, offset)};
    acc = arg_combine(acc, other, is_max);
  }
  return acc;
}

// A block's argmax (kGroup == blockDim.x threads, all calling it): every thread gets the block's
// winner. It may be called again by the same threads (a loop over rows): it first waits for the
// previous call's readers of its scratch.
template <typename V, int kGroup>
__device__ __forceinline__ ArgAcc<V> arg_block_reduce(ArgAcc<V> acc, bool is_max) {
  __shared__ V scratch_v[32];
  __shared__ int64_t scratch_i[32];
  acc = arg_warp_reduce(acc, is_max);
  const int warp = threadIdx.x >> 5;
  __syncthreads();
  if ((threadIdx.x & 31) == 0) {
    scratch_v[warp] = acc.v;
    scratch_i[warp] = acc.i;
  }
  __syncthreads();
  acc = ArgAcc<V>{scratch_v[0], scratch_i[0]};
#pragma unroll
  for (int w = 1; w < kGroup / 32; ++w) {
    acc = arg_combine(acc, ArgAcc<V>{scratch_v[w], scratch_i[w]}, is_max);
  }
  return acc;
}

// inner == 1: a group of kGroup threads (warp or whole block) per contiguous row.
template <typename T, int kGroup>
__global__ void arg_rows_kernel(const T* __restrict__ x, int64_t* __restrict__ out, int64_t rows,
                                int64_t cols, bool is_max) {
  using V = ArgValueOf<T>;
  const RowGroup group = row_group<kGroup>();
  for (int64_t row = group.first; row < rows; row += group.stride) {
    const T* xr = x + row * cols;
    ArgAcc<V> acc = arg_identity<V>(is_max);
    for (int64_t c = group.lane; c < cols; c += kGroup) {
      acc = arg_combine(acc, ArgAcc<V>{arg_value(xr[c]), c}, is_max);
    }
    if constexpr (kGroup > 32) {
      acc = arg_block_reduce<V, kGroup>(acc, is_max);
    } else {
      acc = arg_warp_reduce(acc, is_max);
    }
    if (group.lane == 0) {
      out[row] = acc.i;
    }
  }
}

// inner > 1: a thread per output walks the reduced axis with stride `inner`.
template <typename T>
__global__ void arg_columns_kernel(const T* __restrict__ x, int64_t* __restrict__ out,
                                   int64_t outer, int64_t reduce, int64_t inner, bool is_max) {
  using V = ArgValueOf<T>;
  const int64_t outputs = outer * inner;
  for (int64_t i = thread_index(); i < outputs; i += thread_count()) {
    const int64_t o = i / inner;
    const T* base = x + o * reduce * inner + (i - o * inner);
    ArgAcc<V> acc = arg_identity<V>(is_max);
    for (int64_t r = 0; r < reduce; ++r) {
      acc = arg_combine(acc, ArgAcc<V>{arg_value(base[r * inner]), r}, is_max);
    }
    out[i] = acc.i;
  }
}

// Few long rows (an LM head's argmax over 128256 logits): one block alone reads a row at a few
// GB/s, latency-bound, so each row is cut into chunks of kArgChunk elements, a block per chunk
// (grid.y the rows) writing its winner to `partial`; arg_merge_kernel then picks each row's.
constexpr int64_t kArgChunk = 1024;
constexpr int64_t kArgSplitMin = 16384;   // shorter rows: one block is as fast as two launches
constexpr int kArgSplitMaxRows = 64;

template <typename T>
__global__ void __launch_bounds__(kBlock) arg_chunks_kernel(const T* __restrict__ x,
                                                            ArgAcc<ArgValueOf<T>>* partial,
                                                            int64_t cols, bool is_max) {
  using V = ArgValueOf<T>;
  const int64_t row = blockIdx.y;
  const int64_t begin = static_cast<int64_t>(blockIdx.x) * kArgChunk;
  const int64_t end = begin + kArgChunk < cols ? begin + kArgChunk : cols;
  const T* xr = x + row * cols;
  ArgAcc<V> acc = arg_identity<V>(is_max);
#pragma unroll 4
  for (int64_t c = begin + threadIdx.x; c < end; c += kBlock) {
    acc = arg_combine(acc, ArgAcc<V>{arg_value(xr[c]), c}, is_max);
  }
  acc = arg_block_reduce<V, kBlock>(acc, is_max);
  if (threadIdx.x == 0) partial[row * gridDim.x + blockIdx.x] = acc;
}

template <typename V>
__global__ void arg_merge_kernel(const ArgAcc<V>* __restrict__ partial, int64_t* __restrict__ out,
                                 int chunks, bool is_max) {
  const int64_t row = blockIdx.x;
  ArgAcc<V> acc = arg_identity<V>(is_max);
  for (int c = threadIdx.x; c < chunks; c += kBlock) {
    acc = arg_combine(acc, partial[row * chunks + c], is_max);
  }
  acc = arg_block_reduce<V, kBlock>(acc, is_max);
  if (threadIdx.x == 0) out[row] = acc.i;
}

// The chunks per row of a split argmax, 0 when the rows are not few and long.
int64_t arg_split_chunks(const ReduceArgs& a) {
  const bool split = (a.kind == ReduceKind::kArgmax || a.kind == ReduceKind::kArgmin) &&
                     a.inner == 1 && a.reduce >= kArgSplitMin && a.outer <= kArgSplitMaxRows;
  return split ? (a.reduce + kArgChunk - 1) / kArgChunk : 0;
}

template <typename T>
void enqueue_arg_reduce(const ReduceArgs& a, const T* x, int64_t* out, const RunContext& ctx) {
  const bool is_max = a.kind == ReduceKind::kArgmax;
  if (const int64_t chunks = arg_split_chunks(a); chunks > 0) {
    using Acc = ArgAcc<ArgValueOf<T>>;
    Acc* partial = static_cast<Acc*>(ctx.workspace);
    arg_chunks_kernel<T><<<dim3(unsigned(chunks), unsigned(a.outer)), kBlock, 0, ctx.stream>>>(
        x, partial, a.reduce, is_max);
    arg_merge_kernel<ArgValueOf<T>><<<unsigned(a.outer), kBlock, 0, ctx.stream>>>(
        partial, out, int(chunks), is_max);
  } else if (a.inner > 1) {
    const unsigned blocks = blocks_for(a.outer * a.inner, kBlock, ctx.max_blocks);
    arg_columns_kernel<T>
        <<<blocks, kBlock, 0, ctx.stream>>>(x, out, a.outer, a.reduce, a.inner, is_max);
  } else if (a.reduce <= kWarpRowLimit) {
    constexpr int kRowsPerBlock = kBlock / 32;
    const unsigned blocks = blocks_for(a.outer, kRowsPerBlock, ctx.max_blocks);
    arg_rows_kernel<T, 32><<<blocks, kBlock, 0, ctx.stream>>>(x, out, a.outer, a.reduce, is_max);
  } else {
    const unsigned blocks = blocks_for(a.outer, 1, ctx.max_blocks);
    arg_rows_kernel<T, kRowBlock>
        <<<blocks, kRowBlock, 0, ctx.stream>>>(x, out, a.outer, a.reduce, is_max);
  }
}

// --- Median: the lower median (the (reduce - 1) / 2-th smallest, torch's median) along the
// axis, NaN when the axis holds one. A warp per output: each lane ranks its candidates by counting
// the smaller and equal elements, and the first lane whose candidate's rank range holds the
// median's writes it. O(reduce^2) reads per output, meant for the short axes models take medians
// of; no sort and no scratch memory. ---

template <typename T>
__global__ void median_kernel(const T* __restrict__ x, void* __restrict__ out, DType out_dtype,
                              int64_t outer, int64_t reduce, int64_t inner) {
  using V = ArgValueOf<T>;
  const int lane = threadIdx.x & 31;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * (blockDim.x / 32);
  const int64_t k = (reduce - 1) / 2;
  for (int64_t o = thread_index() / 32; o < outer * inner; o += warps) {
    const int64_t oo = o / inner;
    const T* base = x + oo * reduce * inner + (o - oo * inner);
    if constexpr (!std::is_integral_v<V>) {
      bool nan = false;
      for (int64_t r = lane; r < reduce; r += 32) {
        const V v = arg_value(base[r * inner]);
        nan |= v != v;
      }
      if (__any_sync(0xffffffffu, nan)) {
        if (lane == 0) store_f64(out, out_dtype, o, NAN);
        continue;
      }
    }
    for (int64_t j0 = 0; j0 < reduce; j0 += 32) {
      const int64_t j = j0 + lane;
      bool hit = false;
      V c{};
      if (j < reduce) {
        c = arg_value(base[j * inner]);
        int64_t less = 0, equal = 0;
        for (int64_t r = 0; r < reduce; ++r) {
          const V v = arg_value(base[r * inner]);
          less += v < c;
          equal += v == c;
        }
        hit = less <= k && k < less + equal;
      }
      const unsigned hits = __ballot_sync(0xffffffffu, hit);
      if (hits != 0u) {
        if (lane == __ffs(hits) - 1) {
          if constexpr (std::is_integral_v<V>) {
            store_i64(out, out_dtype, o, c);
          } else {
            store_f64(out, out_dtype, o, c);
          }
        }
        break;
      }
    }
  }
}

class ReduceStep final : public Step {
 public:
  ReduceStep(const ReduceArgs& args, const Graph& graph)
      : a_(args),
        x_dtype_(graph.tensors[args.x].dtype),
        out_dtype_(graph.tensors[args.out].dtype),
        split_(args.kind == ReduceKind::kArgmax || args.kind == ReduceKind::kArgmin ||
                       args.kind == ReduceKind::kMedian
                   ? ColumnSplit{}
                   : column_split(args.outer, args.reduce, args.inner)) {}

  // One accumulator (AccOf<T>: int64 or double, the same size) per chunk and output.
  size_t workspace_bytes() const override {
    static_assert(sizeof(AccOf<float>) == sizeof(AccOf<int32_t>));
    static_assert(sizeof(ArgAcc<float>) == sizeof(ArgAcc<int64_t>));
    if (const int64_t chunks = arg_split_chunks(a_); chunks > 0) {
      return size_t(chunks * a_.outer) * sizeof(ArgAcc<int64_t>);
    }
    return split_.chunks > 1
               ? size_t(split_.chunks * a_.outer * a_.inner) * sizeof(AccOf<float>)
               : 0;
  }

  Error enqueue(const RunContext& ctx) override {
    if (a_.outer == 0 || a_.inner == 0) {
      return Error::Ok;
    }
    void* out = ctx.ptr(a_.out);
    visit_dtype(x_dtype_, [&](auto tag) {
      using T = typename decltype(tag)::type;
      const T* x = ctx.ptr<const T>(a_.x);
      if (a_.kind == ReduceKind::kArgmax || a_.kind == ReduceKind::kArgmin) {
        enqueue_arg_reduce<T>(a_, x, static_cast<int64_t*>(out), ctx);
      } else if (a_.kind == ReduceKind::kMedian) {
        const unsigned blocks = blocks_for(a_.outer * a_.inner, kBlock / 32, ctx.max_blocks);
        median_kernel<T><<<blocks, kBlock, 0, ctx.stream>>>(x, out, out_dtype_, a_.outer,
                                                            a_.reduce, a_.inner);
      } else if (split_.chunks > 0) {
        using Acc = AccOf<T>;
        Acc* partial = static_cast<Acc*>(ctx.workspace);
        const dim3 grid(unsigned((a_.inner + kColTile - 1) / kColTile), unsigned(a_.outer),
                        unsigned(split_.chunks));
        reduce_column_tiles_kernel<T><<<grid, dim3(kColTile, kColRows), 0, ctx.stream>>>(
            x, out, out_dtype_, a_.reduce, a_.inner, split_.chunk, a_.kind, partial);
        if (split_.chunks > 1) {
          const int64_t outputs = a_.outer * a_.inner;
          reduce_partials_kernel<Acc>
              <<<blocks_for(outputs, kBlock, ctx.max_blocks), kBlock, 0, ctx.stream>>>(
                  partial, out, out_dtype_, outputs, split_.chunks, a_.reduce, a_.kind);
        }
      } else if (a_.inner > 1) {
        const unsigned blocks = blocks_for(a_.outer * a_.inner, kBlock, ctx.max_blocks);
        reduce_columns_kernel<T><<<blocks, kBlock, 0, ctx.stream>>>(x, out, out_dtype_, a_.outer,
                                                                    a_.reduce, a_.inner, a_.kind);
      } else if (a_.reduce <= kWarpRowLimit) {
        constexpr int kRowsPerBlock = kBlock / 32;
        const unsigned blocks = blocks_for(a_.outer, kRowsPerBlock, ctx.max_blocks);
        reduce_rows_kernel<T, 32>
            <<<blocks, kBlock, 0, ctx.stream>>>(x, out, out_dtype_, a_.outer, a_.reduce, a_.kind);
      } else {
        const unsigned blocks = blocks_for(a_.outer, 1, ctx.max_blocks);
        reduce_rows_kernel<T, kRowBlock><<<blocks, kRowBlock, 0, ctx.stream>>>(
            x, out, out_dtype_, a_.outer, a_.reduce, a_.kind);
      }
    });
    return Error::Ok;
  }

 private:
  ReduceArgs a_;
  DType x_dtype_, out_dtype_;
  ColumnSplit split_;
};

// --- Cumsum: inclusive prefix sums along the middle axis of [outer, dim, inner]. ---

// The sums use the reductions' own pieces with ReduceKind::kSum: value() widens an element
// (fp64 or int64), Combine adds (wrapping for integers), store_result rounds once to out's dtype.
template <typename T>
__global__ void cumsum_rows_kernel(const T* __restrict__ x, void* __restrict__ out, DType dtype,
                                   int64_t rows, int64_t cols) {
  using Acc = AccOf<T>;
  const Combine<Acc> add{ReduceKind::kSum};
  const int lane = threadIdx.x % 32;
  const int64_t warps_per_block = blockDim.x / 32;
  const int64_t first = blockIdx.x * warps_per_block + threadIdx.x / 32;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * warps_per_block;
  for (int64_t row = first; row < rows; row += stride) {
    const T* xr = x + row * cols;
    Acc carry = Acc{0};
    for (int64_t c0 = 0; c0 < cols; c0 += 32) {
      const int64_t c = c0 + lane;
      Acc v = c < cols ? value<T, Acc>(ReduceKind::kSum, xr[c]) : Acc{0};
      for (int offset = 1; offset < 32; offset *= 2) {
        const Acc up = __shfl_up_sync(0xffffffffu, v, offset);
        if (lane >= offset) v = add(v, up);
      }
      v = add(v, carry);
      if (c < cols) store_result(out, dtype, row * cols + c, v, ReduceKind::kSum, cols);
      carry = __shfl_sync(0xffffffffu, v, 31);
    }
  }
}

// inner > 1: a thread per (outer, inner) column walks the axis with stride `inner` (coalesced
// across neighbouring threads).
template <typename T>
__global__ void cumsum_columns_kernel(const T* __restrict__ x, void* __restrict__ out, DType dtype,
                                      int64_t outer, int64_t dim, int64_t inner) {
  using Acc = AccOf<T>;
  const Combine<Acc> add{ReduceKind::kSum};
  const int64_t columns = outer * inner;
  for (int64_t i = thread_index(); i < columns; i += thread_count()) {
    const int64_t o = i / inner;
    const int64_t base = o * dim * inner + (i - o * inner);
    Acc acc = Acc{0};
    for (int64_t r = 0; r < dim; ++r) {
      acc = add(acc, value<T, Acc>(ReduceKind::kSum, x[base + r * inner]));
      store_result(out, dtype, base + r * inner, acc, ReduceKind::kSum, dim);
    }
  }
}

class CumsumStep final : public Step {
 public:
  CumsumStep(const CumsumArgs& args, const Graph& graph)
      : a_(args), dtype_(graph.tensors[args.x].dtype) {}

  Error enqueue(const RunContext& ctx) override {
    if (a_.outer == 0 || a_.dim == 0 || a_.inner == 0) {
      return Error::Ok;
    }
    visit_dtype(dtype_, [&](auto tag) {
      using T = typename decltype(tag)::type;
      const T* x = ctx.ptr<const T>(a_.x);
      void* out = ctx.ptr(a_.out);
      if (a_.inner == 1) {
        constexpr int kRowsPerBlock = kBlock / 32;
        const unsigned blocks = blocks_for(a_.outer, kRowsPerBlock, ctx.max_blocks);
        cumsum_rows_kernel<T><<<blocks, kBlock, 0, ctx.stream>>>(x, out, dtype_, a_.outer, a_.dim);
      } else {
        const unsigned blocks = blocks_for(a_.outer * a_.inner, kBlock, ctx.max_blocks);
        cumsum_columns_kernel<T>
            <<<blocks, kBlock, 0, ctx.stream>>>(x, out, dtype_, a_.outer, a_.dim, a_.inner);
      }
    });
    return Error::Ok;
  }

 private:
  CumsumArgs a_;
  DType dtype_;
};

}  // namespace

StepResult make_reduce_step(const ReduceArgs& args, const InitContext& ctx) {
  return std::unique_ptr<Step>(new ReduceStep(args, ctx.graph));
}

StepResult make_cumsum_step(const CumsumArgs& args, const InitContext& ctx) {
  return std::unique_ptr<Step>(new CumsumStep(args, ctx.graph));
}

}  // namespace kiln::engine::kernels
