// kAttention, a flash-style kernel: one CTA of kWarps warps per (batch, query head, tile of
// kWarps * R queries). The CTA walks the keys in tiles of 32 (one per lane): the tile of K and V
// goes through shared memory in fp32, each lane scores one key against the warp's R queries, and
// an online softmax (running max and sum per query) rescales the fp32 accumulators, whose
// head_dim_v columns the lanes share. Masks and the causal bound are applied per score; a causal
// CTA stops at the last key its queries can see, and a tile of keys a Bool mask hides from all of
// its queries is skipped (decode over a static KV cache reads only the rows written so far). A query whose every key is masked out gets 0
// (torch's scaled_dot_product_attention gives 0 there too, its "safe softmax").
//
// R (queries per warp: 1, 2 or 4) is chosen per launch so that batch-1 shapes still have about
// two CTAs per SM: fewer queries per CTA re-read K/V from L2 more often, but fill the device.
// Where even R = 1 leaves the device mostly idle (decode: one query per head over a long KV
// cache), the keys are split across CTAs too (flash decoding): each split writes its softmax
// state, and the CTA that finishes last among a tile's splits merges them. When a KV head's
// query heads and their queries fit one CTA (decode with grouped-query attention: 4 q heads per
// KV head, one query each), the CTA takes them together ("packed"): its warps read each K/V tile
// once for the whole group, where a CTA per q head re-read it per head and left 3 of 4 warps idle.
// KILN_ATTENTION_QUERIES=4|8|16 (queries per CTA, R = that / 4) fixes it instead, for timing.
#include "runtime/engine/kernels/attention.cuh"
#include "runtime/engine/kernels/attention_cudnn.h"
#include "runtime/engine/kernels/attention_decode.cuh"
#include "runtime/engine/kernels/attention_gemm.cuh"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>

#include "format/fail.h"
#include "runtime/engine/cuda_check.h"
#include "runtime/engine/kernels/common.cuh"

namespace kiln::engine::kernels {
namespace {

using executorch::runtime::Error;
using executorch::runtime::Result;

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
constexpr int kKeys = 32;                                     // keys per tile: one per lane
constexpr int kMaxCols = int(kMaxAttentionHeadDim / 32);      // accumulator columns per lane
constexpr int kQueriesPerWarp[] = {1, 2, 4};                         // the instantiated R
constexpr int kMaxPrecheckedTiles = 1024;  // key tiles a CTA's Bool-mask pre-check covers
constexpr int kMaxSplits = 32;   // split-K: at most a warp's lanes (the merge takes one a lane)

struct Params {
  const void* q;
  const void* k;
  const void* v;
  const void* mask;
  void* out;
  MaskKind mask_kind;
  int64_t heads_q, group, seq_q, seq_kv, d, dv;
  int64_t q_offset, k_offset, v_offset;
  int64_t qs[3], ks[3], vs[3], ms[4], os[3];
  bool causal;
  float scale;
  // Split-K (flash decoding): blockIdx.z takes keys [z * chunk, (z + 1) * chunk) and writes its
  // unnormalised state (max, sum, accumulators) to `partial`; the last of a tile's splits to
  // finish (counted in `arrivals`, reset by that CTA) merges them into `out`. splits 1 writes
  // `out` directly.
  int splits;
  int64_t chunk;
  float* partial;
  unsigned* arrivals;
  // Packed: blockIdx.y is (batch, KV head) and a CTA row is (query head of the group, query):
  // row % group the head, row / group the query. Otherwise blockIdx.y is (batch, query head).
  bool packed;
  int64_t batch;
};

// Heads along blockIdx.y (KV heads when packed, else query heads) and the queries of one head a
// CTA covers (all its rows, or a group's share of them when packed): the kernel and its grid.
__host__ __device__ inline int64_t heads_along_y(const Params& p) {
  return p.packed ? p.heads_q / p.group : p.heads_q;
}
__host__ __device__ inline int64_t queries_per_cta(const Params& p, int r) {
  return p.packed ? (kWarps * r) / p.group : kWarps * r;
}

// The query head and query a CTA row stands for (row in [0, kWarps * R)).
struct QueryRow {
  int64_t h, i;
};

__device__ __forceinline__ QueryRow query_row(const Params& p, int64_t i0, int row) {
  if (p.packed) {
    const int64_t hk = blockIdx.y % (p.heads_q / p.group);
    return {hk * p.group + row % p.group, i0 + row / p.group};
  }
  return {int64_t(blockIdx.y % p.heads_q), i0 + row};
}

// Head dims rounded up to 4 (the score loop reads float4; the padding holds zeros), and the
// K tile's row pitch, 4 floats more so that float4 reads of 8 consecutive lanes hit distinct banks.
__host__ __device__ inline int64_t padded(int64_t d) { return (d + 3) / 4 * 4; }

__host__ __device__ inline size_t smem_floats(int r, int64_t d, int64_t dv) {
  const int64_t dp = padded(d);
  return size_t(kWarps * r * dp + kKeys * (dp + 4) + kKeys * dv + kWarps * r * kKeys);
}


// C: accumulator columns per lane (head_dim_v up to 32 * C), 1, 2, 4 or 8: the loops over them
// unroll to what the head needs (a head of 64 runs 2, where a fixed 8 ran 6 predicated off).
template <typename T, int R, int C>
__global__ void __launch_bounds__(kThreads, 4) attention_kernel(Params p) {
  extern __shared__ float4 smem4[];
  float* smem = reinterpret_cast<float*>(smem4);
  const int64_t dp = padded(p.d);
  const int64_t kpitch = dp + 4;
  float* q_s = smem;                           // [kWarps * R][dp], pre-scaled
  float* k_s = q_s + kWarps * R * dp;          // [kKeys][kpitch]
  float* v_s = k_s + kKeys * kpitch;           // [kKeys][dv]
  float* p_s = v_s + kKeys * p.dv;             // [kWarps][R][kKeys]

  const int warp = threadIdx.x >> 5;
  const int lane = threadIdx.x & 31;
  const int64_t heads_y = heads_along_y(p);
  const int64_t b = blockIdx.y / heads_y;
  const int64_t hk = p.packed ? blockIdx.y - b * heads_y : (blockIdx.y - b * heads_y) / p.group;
  const int64_t per_cta = queries_per_cta(p, R);
  const int64_t i0 = int64_t(blockIdx.x) * per_cta;
  const T* q0 = static_cast<const T*>(p.q) + p.q_offset + b * p.qs[0];
  const T* k = static_cast<const T*>(p.k) + p.k_offset + b * p.ks[0] + hk * p.ks[1];
  const T* v = static_cast<const T*>(p.v) + p.v_offset + b * p.vs[0] + hk * p.vs[1];
  const int64_t rows_used = p.packed ? per_cta * p.group : kWarps * R;   // rows past it idle
  auto live = [&](int row, const QueryRow& qr) { return row < rows_used && qr.i < p.seq_q; };
  auto mask_at = [&](const QueryRow& qr, int64_t j) {
    return b * p.ms[0] + qr.h * p.ms[1] + qr.i * p.ms[2] + j * p.ms[3];
  };
  // Split-K: a query row's state in `partial`, [split][(b * heads_q + h) * seq_q + i].
  const int64_t rows_total = p.batch * p.heads_q * p.seq_q;   // query rows of the whole op
  auto partial_at = [&](const QueryRow& qr, int64_t z) {
    return p.partial + (z * rows_total + (b * p.heads_q + qr.h) * p.seq_q + qr.i) * (p.dv + 2);
  };

  // The CTA's queries, scaled (zero rows past seq_q, zero columns past d).
  for (int row = warp; row < kWarps * R; row += kWarps) {
    const QueryRow qr = query_row(p, i0, row);
    const bool in = live(row, qr);
    for (int64_t c = lane; c < dp; c += 32) {
      q_s[row * dp + c] = in && c < p.d
                              ? to_float(q0[qr.h * p.qs[1] + qr.i * p.qs[2] + c]) * p.scale
                              : 0.0f;
    }
  }

  float m[R], l[R], acc[R][C];
#pragma unroll
  for (int r = 0; r < R; ++r) {
    m[r] = -INFINITY;
    l[r] = 0.0f;
#pragma unroll
    for (int t = 0; t < C; ++t) acc[r][t] = 0.0f;
  }
  // Causal: no query of this CTA sees a key past its last query.
  const int64_t kv_begin = int64_t(blockIdx.z) * p.chunk;
  int64_t kv_end = p.splits > 1 && kv_begin + p.chunk < p.seq_kv ? kv_begin + p.chunk : p.seq_kv;
  if (p.causal && i0 + per_cta < kv_end) kv_end = i0 + per_cta;

  // Which of the CTA's key tiles any of its queries may see under a Bool mask, found in one
  // pass over the mask before the walk (a decode split over a static cache: the loads of every
  // tile in flight together, where a check per tile waited for each in turn).
  __shared__ uint32_t seen_tiles[kMaxPrecheckedTiles / 32];
  const int64_t tiles = (kv_end - kv_begin + kKeys - 1) / kKeys;
  const bool prechecked = p.mask_kind == MaskKind::kBool && tiles <= kMaxPrecheckedTiles;
  if (prechecked) {
    for (int w = threadIdx.x; w < kMaxPrecheckedTiles / 32; w += kThreads) seen_tiles[w] = 0u;
    __syncthreads();
    const int64_t rows = rows_used;
    const uint8_t* mask = static_cast<const uint8_t*>(p.mask);
    const int64_t entries = tiles * rows * kKeys;
#pragma unroll 4
    for (int64_t e = threadIdx.x; e < entries; e += kThreads) {
      const int64_t t = e / (rows * kKeys), rest = e - t * rows * kKeys;
      const QueryRow qr = query_row(p, i0, int(rest / kKeys));
      const int64_t j = kv_begin + t * kKeys + rest % kKeys;
      if (qr.i < p.seq_q && j < kv_end && !(p.causal && j > qr.i) && mask[mask_at(qr, j)] != 0) {
        atomicOr(&seen_tiles[t / 32], 1u << (t % 32));
      }
    }
    __syncthreads();
  }

  for (int64_t j0 = kv_begin; j0 < kv_end; j0 += kKeys) {
    if (prechecked) {
      const int64_t t = (j0 - kv_begin) / kKeys;
      if (((seen_tiles[t / 32] >> (t % 32)) & 1u) == 0u) continue;
    } else if (p.mask_kind == MaskKind::kBool) {
      // A tile of keys no query of this CTA may see is skipped (its scores would all be -inf,
      // which changes nothing): a static KV cache's rows past the positions written so far.
      bool seen = false;
      for (int e = threadIdx.x; e < kWarps * R * kKeys && !seen; e += kThreads) {
        const QueryRow qr = query_row(p, i0, e / kKeys);
        const int64_t j = j0 + e % kKeys;
        seen = live(e / kKeys, qr) && j < p.seq_kv && !(p.causal && j > qr.i) &&
               static_cast<const uint8_t*>(p.mask)[mask_at(qr, j)] != 0;
      }
      if (!__syncthreads_or(seen)) continue;
    }
    __syncthreads();  // the previous tile is consumed (and q_s written, on the first pass)
    for (int row = warp; row < kKeys; row += kWarps) {
      const int64_t j = j0 + row;
      const bool in = j < p.seq_kv;
      for (int64_t c = lane; c < dp; c += 32) {
        k_s[row * kpitch + c] = in && c < p.d ? to_float(k[j * p.ks[2] + c]) : 0.0f;
      }
      for (int64_t c = lane; c < p.dv; c += 32) {
        v_s[row * p.dv + c] = in ? to_float(v[j * p.vs[2] + c]) : 0.0f;
      }
    }
    __syncthreads();

    const int64_t j = j0 + lane;
    float s[R];
#pragma unroll
    for (int r = 0; r < R; ++r) s[r] = 0.0f;
    const float4* kr = reinterpret_cast<const float4*>(k_s + lane * kpitch);
    for (int64_t c = 0; c < dp / 4; ++c) {
      const float4 kv4 = kr[c];
#pragma unroll
      for (int r = 0; r < R; ++r) {
        const float4 q4 = reinterpret_cast<const float4*>(q_s + (warp * R + r) * dp)[c];
        s[r] = fmaf(q4.x, kv4.x, fmaf(q4.y, kv4.y, fmaf(q4.z, kv4.z, fmaf(q4.w, kv4.w, s[r]))));
      }
    }
    float* pw = p_s + warp * R * kKeys;
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const QueryRow qr = query_row(p, i0, warp * R + r);
      bool keep = j < p.seq_kv && live(warp * R + r, qr) && !(p.causal && j > qr.i);
      if (keep && p.mask_kind != MaskKind::kNone) {
        const int64_t at = mask_at(qr, j);
        if (p.mask_kind == MaskKind::kBool) {
          keep = static_cast<const uint8_t*>(p.mask)[at] != 0;
        } else {
          s[r] += to_float(static_cast<const T*>(p.mask)[at]);
        }
      }
      const float score = keep ? s[r] : -INFINITY;
      const float m_new = fmaxf(m[r], warp_reduce(score, MaxOp{}));
      // Nothing seen yet (every score so far -inf): keep the zero state as it is.
      const float alpha = m_new == -INFINITY ? 1.0f : expf(m[r] - m_new);
      const float e = m_new == -INFINITY ? 0.0f : expf(score - m_new);
      m[r] = m_new;
      l[r] = l[r] * alpha + e;
#pragma unroll
      for (int t = 0; t < C; ++t) acc[r][t] *= alpha;
      pw[r * kKeys + lane] = e;
    }
    __syncwarp();
    const int64_t keys = p.seq_kv - j0 < kKeys ? p.seq_kv - j0 : kKeys;
    for (int jj = 0; jj < keys; ++jj) {
      const float* vr = v_s + jj * p.dv;
#pragma unroll
      for (int t = 0; t < C; ++t) {
        const int64_t c = lane + 32 * t;
        if (c < p.dv) {
          const float vv = vr[c];
#pragma unroll
          for (int r = 0; r < R; ++r) acc[r][t] = fmaf(pw[r * kKeys + jj], vv, acc[r][t]);
        }
      }
    }
    __syncwarp();
  }

  T* out = static_cast<T*>(p.out) + b * p.os[0];
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const QueryRow qr = query_row(p, i0, warp * R + r);
    const float total = warp_reduce(l[r], SumOp{});
    if (!live(warp * R + r, qr)) continue;
    if (p.splits > 1) {   // max, sum, dv accumulators
      float* part = partial_at(qr, blockIdx.z);
      if (lane == 0) {
        part[0] = m[r];
        part[1] = total;
      }
#pragma unroll
      for (int t = 0; t < C; ++t) {
        const int64_t c = lane + 32 * t;
        if (c < p.dv) part[2 + c] = acc[r][t];
      }
      continue;
    }
    const float inv = total == 0.0f ? 0.0f : 1.0f / total;  // every key masked out: 0
#pragma unroll
    for (int t = 0; t < C; ++t) {
      const int64_t c = lane + 32 * t;
      if (c < p.dv) {
        out[qr.h * p.os[1] + qr.i * p.os[2] + c] = from_float<T>(acc[r][t] * inv);
      }
    }
  }
  if (p.splits <= 1) return;
  // The last of this tile's splits to finish merges them all: the softmax over every key is each
  // split's sum and accumulators rescaled to the largest max; every key masked out (no split
  // saw one) gives 0, as unsplit.
  __shared__ bool last;
  __threadfence();   // this CTA's partial state is visible before it counts itself in
  __syncthreads();
  unsigned* arrivals = p.arrivals + blockIdx.y * gridDim.x + blockIdx.x;
  if (threadIdx.x == 0) last = atomicAdd(arrivals, 1u) == unsigned(p.splits) - 1;
  __syncthreads();
  if (!last) return;
  __threadfence();
  // A lane per split (splits <= kMaxSplits == 32) for the maxima and sums; then lanes over the
  // columns with every split's load issued at once (the loop unrolled): one round trip to L2, not
  // one per split.
  const int64_t split_stride = rows_total * (p.dv + 2);
  for (int row = warp; row < rows_used; row += kWarps) {
    const QueryRow qr = query_row(p, i0, row);
    if (qr.i >= p.seq_q) continue;
    const float* part = partial_at(qr, 0);
    const float mz = lane < p.splits ? __ldcg(part + lane * split_stride) : -INFINITY;
    const float lz = lane < p.splits ? __ldcg(part + lane * split_stride + 1) : 0.0f;
    const float mx = warp_reduce(mz, MaxOp{});
    const float wz = mz == -INFINITY ? 0.0f : expf(mz - mx);
    const float sum = warp_reduce(lz * wz, SumOp{});
    for (int64_t c0 = 0; c0 < p.dv; c0 += 32) {   // uniform over the warp: the shuffles below
      const int64_t c = c0 + lane;
      float a = 0.0f;
#pragma unroll
      for (int z = 0; z < kMaxSplits; ++z) {
        const float w = __shfl_sync(0xffffffffu, wz, z);
        if (z < p.splits && c < p.dv) a += __ldcg(part + z * split_stride + 2 + c) * w;
      }
      if (c < p.dv) {
        out[qr.h * p.os[1] + qr.i * p.os[2] + c] = from_float<T>(sum == 0.0f ? 0.0f : a / sum);
      }
    }
  }
  if (threadIdx.x == 0) *arrivals = 0u;   // ready for the next launch (graph replays too)
}

// CTAs of one launch: (query tiles, batch * heads along y, splits).
dim3 attention_grid(const Params& p, int r) {
  const int64_t per_cta = queries_per_cta(p, r);
  return dim3(static_cast<unsigned>((p.seq_q + per_cta - 1) / per_cta),
              static_cast<unsigned>(p.batch * heads_along_y(p)), static_cast<unsigned>(p.splits));
}

// The kernel for R queries per warp and a head_dim_v of dv (its accumulator columns per lane).
template <typename T, int R>
auto kernel_for(int64_t dv) -> void (*)(Params) {
  const int64_t cols = (dv + 31) / 32;
  return cols <= 1 ? attention_kernel<T, R, 1>
         : cols <= 2 ? attention_kernel<T, R, 2>
         : cols <= 4 ? attention_kernel<T, R, 4>
                     : attention_kernel<T, R, kMaxCols>;
}

template <typename T, int R>
Error launch(const Params& p, cudaStream_t stream) {
  const size_t bytes = smem_floats(R, p.d, p.dv) * sizeof(float);
  kernel_for<T, R>(p.dv)<<<attention_grid(p, R), kThreads, bytes, stream>>>(p);
  return Error::Ok;
}

// Raises the kernel's dynamic shared memory limit past the default 48 KiB when this shape needs it.
template <typename T, int R>
Error allow_smem(size_t bytes, int64_t dv, size_t op) {
  if (bytes <= 48 * 1024) return Error::Ok;
  return cuda_status(cudaFuncSetAttribute(kernel_for<T, R>(dv),
                                          cudaFuncAttributeMaxDynamicSharedMemorySize,
                                          static_cast<int>(bytes)),
                     Error::NotSupported,
                     "Kiln engine: op %zu (attention): cudaFuncSetAttribute(%zu bytes of shared "
                     "memory)",
                     op, bytes);
}

// Split-K applies to few query tiles over many keys (decode over a KV cache): at most this many
// splits, each of at least kMinSplitKeys keys. A CTA walks its tiles one after another, each
// waiting on its K/V loads, so short splits (two tiles) over many CTAs beat long ones: a
// two-layer Llama-1B cut's decode at context 1024 went from 0.748 to 0.554 ms a token when its
// 2048-row cache went from 9 splits of 8 tiles to 32 of 2.
constexpr int64_t kMinSplitKeys = 64;
constexpr int64_t kMaxSplitQueries = 16;

bool may_split(const AttentionArgs& a) {
  return a.seq_q <= kMaxSplitQueries && a.seq_kv >= 2 * kMinSplitKeys;
}

// Whether a KV head's query heads and all their queries fit one CTA (packed), and with how many
// queries per warp: decode with grouped-query attention. 0 when not.
int packed_queries_per_warp(const AttentionArgs& a) {
  const int64_t group = a.heads_q / a.heads_kv;
  if (group < 2) return 0;
  for (int r : kQueriesPerWarp) {
    if ((kWarps * r) % group == 0 && a.seq_q * group <= kWarps * r) return r;
  }
  return 0;
}

class AttentionStep final : public Step {
 public:
  AttentionStep(const AttentionArgs& a, const Params& p, blob::DType dtype, int forced_r,
                float* partial, unsigned* arrivals)
      : a_(a), p_(p), dtype_(dtype), forced_r_(forced_r),
        packed_r_(forced_r == 0 ? packed_queries_per_warp(a) : 0), partial_(partial),
        arrivals_(arrivals) {
    p_.packed = packed_r_ != 0;
  }
  ~AttentionStep() override {
    if (partial_ != nullptr) cudaFree(partial_);
    if (arrivals_ != nullptr) cudaFree(arrivals_);
  }

  Error enqueue(const RunContext& ctx) override {
    if (a_.batch == 0 || a_.seq_q == 0) return Error::Ok;
    Params p = p_;
    p.q = ctx.ptr(a_.q);
    p.k = ctx.ptr(a_.k);
    p.v = ctx.ptr(a_.v);
    p.mask = a_.mask == kNoTensor ? nullptr : ctx.ptr(a_.mask);
    p.out = ctx.ptr(a_.out);
    const int r = p.packed ? packed_r_ : queries_per_warp(ctx.max_blocks);
    splits_for(r, ctx.max_blocks, p);
    Error e = Error::Ok;
    visit_floating(dtype_, [&](auto tag) {
      using T = typename decltype(tag)::type;
      e = r == 1 ? launch<T, 1>(p, ctx.stream)
          : r == 2 ? launch<T, 2>(p, ctx.stream)
                   : launch<T, 4>(p, ctx.stream);
    });
    return e;
  }

  /// Splits of the keys (and their length, whole tiles) so that few query tiles still give
  /// about eight CTAs per SM; 1 (no split) where the CTAs already fill the device.
  void splits_for(int r, int max_blocks, Params& p) const {
    p.splits = 1;
    p.chunk = a_.seq_kv;
    p.partial = partial_;
    p.arrivals = arrivals_;
    if (partial_ == nullptr) return;
    const dim3 grid = attention_grid(p, r);
    const int64_t ctas = int64_t(grid.x) * grid.y;
    int64_t splits = (max_blocks + ctas - 1) / ctas;   // about 8 CTAs per SM
    splits = std::min<int64_t>({splits, kMaxSplits, a_.seq_kv / kMinSplitKeys});
    if (splits <= 1) return;
    const int64_t tiles = (a_.seq_kv + kKeys - 1) / kKeys;
    p.chunk = (tiles + splits - 1) / splits * kKeys;
    p.splits = int((a_.seq_kv + p.chunk - 1) / p.chunk);
  }

  /// The largest R (queries per warp) that still gives about two CTAs per SM (max_blocks is
  /// 8 per SM), else 1.
  int queries_per_warp(int max_blocks) const {
    if (forced_r_ != 0) return forced_r_;
    const int64_t heads = a_.batch * a_.heads_q;
    for (int r : {4, 2}) {
      const int64_t ctas = heads * ((a_.seq_q + kWarps * r - 1) / (kWarps * r));
      if (ctas * 4 >= max_blocks) return r;
    }
    return 1;
  }

 private:
  AttentionArgs a_;
  Params p_;
  blob::DType dtype_;
  int forced_r_;     // 0: chosen per launch
  int packed_r_;     // queries per warp of packed launches, 0 when not packed
  float* partial_;   // split-K states (may_split shapes), else null
  unsigned* arrivals_;   // split-K: per tile of queries, the splits done so far (zeroed)
};

// KILN_ATTENTION_QUERIES: queries per CTA (4, 8 or 16) -> R, or 0 (unset: automatic).
Result<int> forced_queries_per_warp(size_t op) {
  const char* env = std::getenv("KILN_ATTENTION_QUERIES");
  if (env == nullptr || env[0] == '\0') return 0;
  for (int r : kQueriesPerWarp) {
    if (std::strcmp(env, std::to_string(kWarps * r).c_str()) == 0) return r;
  }
  return fail(nullptr, Error::InvalidArgument,
              "Kiln engine: op %zu (attention): KILN_ATTENTION_QUERIES=%s; use 4, 8 or 16", op,
              env);
}

}  // namespace

StepResult make_attention_step(const AttentionArgs& a, const InitContext& ctx) {
  if (a.head_dim > kMaxAttentionHeadDim || a.head_dim_v > kMaxAttentionHeadDim) {
    return fail(nullptr, Error::NotSupported,
                "Kiln engine: op %zu (attention): head_dim %lld / head_dim_v %lld; the kernel "
                "takes at most %lld",
                ctx.op_index, static_cast<long long>(a.head_dim),
                static_cast<long long>(a.head_dim_v),
                static_cast<long long>(kMaxAttentionHeadDim));
  }
  const Graph& g = ctx.graph;
  // A decode step (up to 8 query rows per KV head): the flash-decoding kernel.
  if (decode_attention_unsupported(a, ctx) == nullptr) return make_decode_attention_step(a, ctx);
  // Float16/BFloat16 (masked: from 16 queries up): cuDNN's tensor-core flash attention where it
  // has a plan.
  if (cudnn_attention_unsupported(a, g) == nullptr) {
    StepResult cudnn = make_cudnn_attention_step(a, ctx);
    if (cudnn.ok() || cudnn.error() != Error::NotSupported) return cudnn;
  }
  const blob::DType dtype = g.tensors[a.q].dtype;
  Params p{};
  p.mask_kind = mask_kind(a, g);
  p.heads_q = a.heads_q;
  p.group = a.heads_q / a.heads_kv;
  p.seq_q = a.seq_q;
  p.seq_kv = a.seq_kv;
  p.d = a.head_dim;
  p.q_offset = a.q_offset;
  p.k_offset = a.k_offset;
  p.v_offset = a.v_offset;
  p.dv = a.head_dim_v;
  const int64_t qs[3] = {a.q_stride_b, a.q_stride_h, a.q_stride_s};
  const int64_t ks[3] = {a.k_stride_b, a.k_stride_h, a.k_stride_s};
  const int64_t vs[3] = {a.v_stride_b, a.v_stride_h, a.v_stride_s};
  const int64_t ms[4] = {a.mask_stride_b, a.mask_stride_h, a.mask_stride_q, a.mask_stride_k};
  for (int i = 0; i < 3; ++i) {
    p.qs[i] = qs[i];
    p.ks[i] = ks[i];
    p.vs[i] = vs[i];
  }
  for (int i = 0; i < 4; ++i) p.ms[i] = ms[i];
  p.os[0] = a.out_stride_b;
  p.os[1] = a.out_stride_h;
  p.os[2] = a.out_stride_s;
  p.causal = a.causal;
  p.scale = static_cast<float>(a.scale);
  p.batch = a.batch;
  // Query tiles along x (up to 2^31 - 1), batch * heads_q along y (up to 65535).
  if ((a.seq_q + kWarps - 1) / kWarps > 0x7fffffffLL || a.batch * a.heads_q > 65535) {
    return fail(nullptr, Error::NotSupported,
                "Kiln engine: op %zu (attention): grid of %lld query tiles x %lld heads is too "
                "large",
                ctx.op_index, static_cast<long long>((a.seq_q + kWarps - 1) / kWarps),
                static_cast<long long>(a.batch * a.heads_q));
  }
  Error e = Error::Ok;
  visit_floating(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    for (int r : kQueriesPerWarp) {
      const size_t bytes = smem_floats(r, a.head_dim, a.head_dim_v) * sizeof(float);
      if (e != Error::Ok) break;
      e = r == 1 ? allow_smem<T, 1>(bytes, a.head_dim_v, ctx.op_index)
          : r == 2 ? allow_smem<T, 2>(bytes, a.head_dim_v, ctx.op_index)
                   : allow_smem<T, 4>(bytes, a.head_dim_v, ctx.op_index);
    }
  });
  if (e != Error::Ok) return e;
  const Result<int> forced = forced_queries_per_warp(ctx.op_index);
  if (!forced.ok()) return forced.error();
  float* partial = nullptr;
  unsigned* arrivals = nullptr;
  if (may_split(a)) {
    const size_t bytes = size_t(kMaxSplits) * size_t(a.batch * a.heads_q * a.seq_q) *
                         size_t(a.head_dim_v + 2) * sizeof(float);
    KILN_TRY(cuda_status(cudaMalloc(&partial, bytes), Error::MemoryAllocationFailed,
                         "Kiln engine: op %zu (attention): cudaMalloc of %zu bytes for the "
                         "split-K partial results",
                         ctx.op_index, bytes));
    // A counter per CTA tile of queries: at most one per query head and tile of 4 queries.
    const size_t counters = size_t(a.batch * a.heads_q * ((a.seq_q + kWarps - 1) / kWarps));
    cudaError_t status = cudaMalloc(&arrivals, counters * sizeof(unsigned));
    if (status == cudaSuccess) status = cudaMemset(arrivals, 0, counters * sizeof(unsigned));
    if (status != cudaSuccess) {
      cudaFree(partial);
      cudaFree(arrivals);
      return cuda_status(status, Error::MemoryAllocationFailed,
                         "Kiln engine: op %zu (attention): the split-K arrival counters",
                         ctx.op_index);
    }
  }
  std::unique_ptr<Step> kiln(new AttentionStep(a, p, dtype, forced.get(), partial, arrivals));
  // fp32 encoder / prefill shapes: cuBLASLt's GEMMs around a softmax (attention_gemm.cu).
  if (gemm_attention_unsupported(a, g) == nullptr) {
    StepResult gemm = make_gemm_attention_step(a, ctx, kiln);
    if (gemm.ok() || gemm.error() != Error::NotSupported) return gemm;
  }
  return kiln;
}

}  // namespace kiln::engine::kernels
