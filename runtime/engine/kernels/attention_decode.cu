// kAttention for a decode step (flash decoding): a few query rows per KV head (one token, or a
// few, times the query heads that share the KV head) over a long K/V cache.
//
// A CTA of four warps takes one (batch, KV head) and one split of the keys. Its rows (query head
// of the group, query) keep their pre-scaled queries in shared memory. A warp takes 32 keys at a
// time, one per lane: after finding which keys a Bool mask, the causal bound or the split's end
// hide from all its rows (those are not read: a decode over a static cache reads only the rows
// written so far, and a tile nobody sees is skipped), each lane reads its whole key row (16-byte
// loads) and scores it against every row with no shuffles; one max per row and tile updates the
// online softmax. The probabilities go through shared memory to the values, which the warp reads
// a row per instruction (lane l holds columns l * E .. l * E + E - 1), so the value loads are
// coalesced and each lane's accumulators stay in registers. An earlier form spread a key row over
// 8 lanes and summed every score with shuffles: instruction-latency bound at one warp per
// scheduler, 14-17 us a layer at the Llama-3.2-1B shape on the H100 whatever the position.
// Warps, then splits merge their (max, sum, accumulators): warps through shared memory, splits
// either through distributed shared memory (the splits of a KV head are one thread block
// cluster: each block keeps its state in its shared memory, and after a cluster barrier each
// merges a slice of the output reading every block's state), or through a partial-state buffer
// that the last split to finish reads (counted in `arrivals`, which it resets for the next
// launch). The generic kernel (attention.cu) staged K/V tiles in fp32 through shared memory with
// a barrier per tile: latency bound, ~28 us a layer at that shape whatever the context.
#include "runtime/engine/kernels/attention_decode.cuh"

#include <cooperative_groups.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "format/dtype.h"
#include "format/fail.h"
#include "runtime/engine/cuda_check.h"
#include "runtime/engine/kernels/common.cuh"
#include "runtime/engine/env_switch.h"

namespace kiln::engine::kernels {
namespace {

using executorch::runtime::Error;

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
constexpr int kStep = kWarps * 32;   // keys a CTA takes per iteration: a 32-key tile per warp
constexpr int kMaxRows = 8;      // query rows per KV head (seq_q * heads_q / heads_kv)
constexpr int kMaxSplits = 32;   // splits of the keys (the merge loads one state per split)
constexpr int kMaxClusterSplits = 16;   // splits merged in a cluster (16: non-portable size)

struct DecodeParams {
  const void* q;
  const void* k;
  const void* v;
  const void* mask;
  void* out;
  MaskKind mask_kind;
  int64_t heads_kv, seq_q, seq_kv;
  int group;         // query heads per KV head (rows <= kMaxRows, so a small int)
  int64_t q_offset, k_offset, v_offset;
  int64_t qs[3], ks[3], vs[3], ms[4], os[3];
  bool causal;
  float scale;
  int rows;          // seq_q * group: the CTA's live rows (row r: head group * hk + r % group,
                     // query r / group)
  int splits;        // CTAs along x, each over `chunk` keys
  int64_t chunk;
  float* partial;    // [batch * heads_kv][splits][kRows][2 + head_dim]: max, sum, accumulators
  unsigned* arrivals;  // per (batch, KV head): splits finished so far
};


// L: 16-byte loads per K/V row; R: query rows per KV head (padded to 1, 2, 4 or 8).
template <typename T, int L, int R, bool kCluster>
__global__ void __launch_bounds__(kThreads) decode_attention_kernel(DecodeParams p) {
  constexpr int V = 16 / int(sizeof(T));   // elements per 16-byte load
  constexpr int D = L * V;                 // head_dim (== head_dim_v)
  constexpr int E = D / 32;                // value columns per lane (4, 8 or 16 bytes)
  constexpr int kKChunk = L < 16 ? L : 16;  // key-row loads in flight per lane (64 registers)
  // Keys whose value slices are loaded together: 128 bytes (32 registers) of them, at most a tile.
  constexpr int kVSlices = 128 / (E * int(sizeof(T)));
  constexpr int kVBatch = kVSlices < 32 ? kVSlices : 32;
  __shared__ __align__(16) float q_s[R][D];
  __shared__ __align__(16) float acc_s[kWarps][R][D];
  __shared__ float m_s[kWarps][R], l_s[kWarps][R];
  __shared__ float p_s[kWarps][32][R];   // a tile's probabilities, per key and row
  __shared__ bool last;

  const int warp = threadIdx.x >> 5;
  const int lane = threadIdx.x & 31;
  const int64_t b = blockIdx.y / p.heads_kv;
  const int64_t hk = blockIdx.y - b * p.heads_kv;
  auto head = [&](int r) { return hk * p.group + r % p.group; };
  auto query = [&](int r) { return r / p.group; };
  wait_for_previous_kernel();   // launched overlapped (common.cuh)
  allow_next_kernel();

  for (int e = threadIdx.x; e < R * D; e += kThreads) {
    const int r = e / D, c = e % D;
    float x = 0.0f;
    if (r < p.rows) {
      x = to_float(static_cast<const T*>(p.q)[p.q_offset + b * p.qs[0] + head(r) * p.qs[1] +
                                              query(r) * p.qs[2] + c]) *
          p.scale;
    }
    q_s[r][c] = x;
  }
  const T* kb = static_cast<const T*>(p.k) + p.k_offset + b * p.ks[0] + hk * p.ks[1];
  const T* vb = static_cast<const T*>(p.v) + p.v_offset + b * p.vs[0] + hk * p.vs[1] + lane * E;
  // Per row, once: its query (the causal bound) and where its mask row starts (no divisions in
  // the key loop).
  int row_query[R];
  int64_t mask_row[R];
#pragma unroll
  for (int r = 0; r < R; ++r) {
    row_query[r] = query(r);
    mask_row[r] = b * p.ms[0] + head(r) * p.ms[1] + int64_t(query(r)) * p.ms[2];
  }

  // m: the warp's running max per row (the same in every lane); l: this lane's share of the sum;
  // acc: the weighted sum of the row's values at this lane's E columns.
  float m[R], l[R], acc[R][E];
#pragma unroll
  for (int r = 0; r < R; ++r) {
    m[r] = -INFINITY;
    l[r] = 0.0f;
#pragma unroll
    for (int c = 0; c < E; ++c) acc[r][c] = 0.0f;
  }
  const int64_t begin = int64_t(blockIdx.x) * p.chunk;
  const int64_t end = begin + p.chunk < p.seq_kv ? begin + p.chunk : p.seq_kv;
  __syncthreads();

  // A warp takes a tile of 32 keys, key `lane` of it per lane.
  for (int64_t j0 = begin + warp * 32; j0 < end; j0 += kStep) {
    const int64_t j = j0 + lane;
    bool see[R];
    float bias[R];
    bool any = false;
#pragma unroll
    for (int r = 0; r < R; ++r) {
      bool s = r < p.rows && j < end && !(p.causal && j > row_query[r]);
      bias[r] = 0.0f;
      if (s && p.mask_kind == MaskKind::kBool) {
        s = static_cast<const uint8_t*>(p.mask)[mask_row[r] + j * p.ms[3]] != 0;
      } else if (s && p.mask_kind == MaskKind::kAdditive) {
        bias[r] = to_float(static_cast<const T*>(p.mask)[mask_row[r] + j * p.ms[3]]);
      }
      see[r] = s;
      any = any || s;
    }
    // Keys no row sees are not read (a static cache's rows past the position hold anything).
    const unsigned seen = __ballot_sync(0xffffffffu, any);
    if (seen == 0u) continue;

    // The first batch of value slices is requested before the scores need the keys.
    Pack<T, E> vv[kVBatch];
    auto load_values = [&](int k0) {
#pragma unroll
      for (int u = 0; u < kVBatch; ++u) {
        if ((seen >> (k0 + u)) & 1u) {
          vv[u] = *reinterpret_cast<const Pack<T, E>*>(vb + (j0 + k0 + u) * p.vs[2]);
        } else {   // zeros, so that a weight of 0 times them stays 0
#pragma unroll
          for (int c = 0; c < E; ++c) vv[u].v[c] = from_float<T>(0.0f);
        }
      }
    };
    load_values(0);

    // Scores: the lane's whole key row against every row's query (no shuffles per key).
    float s[R];
#pragma unroll
    for (int r = 0; r < R; ++r) s[r] = 0.0f;
    if (any) {
      const T* krow = kb + j * p.ks[2];
#pragma unroll
      for (int c0 = 0; c0 < L; c0 += kKChunk) {
        Pack<T, V> kk[kKChunk];
#pragma unroll
        for (int i = 0; i < kKChunk; ++i) {
          kk[i] = *reinterpret_cast<const Pack<T, V>*>(krow + (c0 + i) * V);
        }
#pragma unroll
        for (int i = 0; i < kKChunk; ++i) {
#pragma unroll
          for (int c = 0; c < V; c += 4) {
            const float k0 = to_float(kk[i].v[c]), k1 = to_float(kk[i].v[c + 1]);
            const float k2 = to_float(kk[i].v[c + 2]), k3 = to_float(kk[i].v[c + 3]);
#pragma unroll
            for (int r = 0; r < R; ++r) {
              const float4 q4 = *reinterpret_cast<const float4*>(&q_s[r][(c0 + i) * V + c]);
              s[r] = fmaf(q4.x, k0, fmaf(q4.y, k1, fmaf(q4.z, k2, fmaf(q4.w, k3, s[r]))));
            }
          }
        }
      }
    }
    // Online softmax over the tile: one max per row for 32 keys.
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const float x = see[r] ? s[r] + bias[r] : -INFINITY;
      const float mn = fmaxf(m[r], warp_reduce(x, MaxOp{}));
      float pr = 0.0f;
      if (mn != -INFINITY) {   // else nothing seen yet (an additive -inf at most): keep zeros
        const float alpha = expf(m[r] - mn);   // 0 while m is -inf
        pr = x == -INFINITY ? 0.0f : expf(x - mn);
        l[r] = l[r] * alpha + pr;
#pragma unroll
        for (int c = 0; c < E; ++c) acc[r][c] *= alpha;
        m[r] = mn;
      }
      p_s[warp][lane][r] = pr;
    }
    __syncwarp();
    // Values: the lane's E columns of every seen key, weighted by each row's probability.
#pragma unroll
    for (int k0 = 0; k0 < 32; k0 += kVBatch) {
      if (k0 > 0) load_values(k0);
#pragma unroll
      for (int u = 0; u < kVBatch; ++u) {
        float pr[R];
#pragma unroll
        for (int r = 0; r < R; ++r) pr[r] = p_s[warp][k0 + u][r];
#pragma unroll
        for (int c = 0; c < E; ++c) {
          const float v = to_float(vv[u].v[c]);
#pragma unroll
          for (int r = 0; r < R; ++r) acc[r][c] = fmaf(pr[r], v, acc[r][c]);
        }
      }
    }
    __syncwarp();   // p_s is rewritten by the next tile
  }

  // The warp's state: its max, its summed lanes, its columns; then the block merges the warps.
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const float sum = warp_reduce(l[r], SumOp{});
    if (lane == 0) {
      m_s[warp][r] = m[r];
      l_s[warp][r] = sum;
    }
#pragma unroll
    for (int c = 0; c < E; ++c) acc_s[warp][r][lane * E + c] = acc[r][c];
  }
  __syncthreads();

  T* out = static_cast<T*>(p.out) + b * p.os[0];
  // This block's state of each row: with clusters in shared memory (the accumulators in place of
  // warp 0's, each element read and written by one thread), else in the partial-state buffer.
  __shared__ float max_s[R], sum_s[R];
  float* states = !kCluster && p.splits > 1
                      ? p.partial + int64_t(blockIdx.y) * p.splits * R * (D + 2)
                      : nullptr;
  for (int e = threadIdx.x; e < R * D; e += kThreads) {
    const int r = e / D, c = e % D;
    if (r >= p.rows) continue;
    float mx = -INFINITY;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) mx = fmaxf(mx, m_s[w][r]);
    float sum = 0.0f, a = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) {
      const float wt = m_s[w][r] == -INFINITY ? 0.0f : expf(m_s[w][r] - mx);
      sum += l_s[w][r] * wt;
      a += acc_s[w][r][c] * wt;
    }
    if (p.splits == 1) {   // every key masked out: 0, as torch's safe softmax
      out[head(r) * p.os[1] + query(r) * p.os[2] + c] = from_float<T>(sum == 0.0f ? 0.0f : a / sum);
    } else if (kCluster) {
      acc_s[0][r][c] = a;
      if (c == 0) {
        max_s[r] = mx;
        sum_s[r] = sum;
      }
    } else {
      float* st = states + (int64_t(blockIdx.x) * R + r) * (D + 2);
      if (c == 0) {
        st[0] = mx;
        st[1] = sum;
      }
      st[2 + c] = a;
    }
  }
  if (p.splits == 1) return;

  if constexpr (kCluster) {
    namespace cg = cooperative_groups;
    cg::cluster_group cluster = cg::this_cluster();
    cluster.sync();   // every split's state is in its shared memory
    // The cluster spans the grid's x, so block x of the cluster is split x; it merges elements
    // x * kThreads + thread, + splits * kThreads, ... of the output.
    for (int e = blockIdx.x * kThreads + threadIdx.x; e < p.rows * D; e += p.splits * kThreads) {
      const int r = e / D, c = e % D;
      float mz[kMaxClusterSplits], lz[kMaxClusterSplits], az[kMaxClusterSplits];
      float mx = -INFINITY;
#pragma unroll
      for (int z = 0; z < kMaxClusterSplits; ++z) {
        if (z >= p.splits) break;
        mz[z] = *cluster.map_shared_rank(&max_s[r], z);
        lz[z] = *cluster.map_shared_rank(&sum_s[r], z);
        az[z] = *cluster.map_shared_rank(&acc_s[0][r][c], z);
        mx = fmaxf(mx, mz[z]);
      }
      float sum = 0.0f, a = 0.0f;
#pragma unroll
      for (int z = 0; z < kMaxClusterSplits; ++z) {
        if (z >= p.splits) break;
        const float w = mz[z] == -INFINITY ? 0.0f : expf(mz[z] - mx);
        sum += lz[z] * w;
        a += az[z] * w;
      }
      out[head(r) * p.os[1] + query(r) * p.os[2] + c] = from_float<T>(sum == 0.0f ? 0.0f : a / sum);
    }
    cluster.sync();   // no block leaves while another still reads its shared memory
    return;
  }

  __threadfence();   // this CTA's state is visible before it counts itself in
  __syncthreads();
  unsigned* arrivals = p.arrivals + blockIdx.y;
  if (threadIdx.x == 0) last = atomicAdd(arrivals, 1u) == unsigned(p.splits) - 1;
  __syncthreads();
  if (!last) return;
  __threadfence();
  // A warp per row weighs the splits (a lane per split: one load of every max and sum at once);
  // then every column's accumulators of all splits are loaded together and summed.
  const int64_t stride = int64_t(R) * (D + 2);   // from one split's state of a row to the next
  __shared__ float weight_s[R][kMaxSplits], inv_s[R];
  for (int r = warp; r < p.rows; r += kWarps) {
    const float* st = states + int64_t(r) * (D + 2);
    const float mz = lane < p.splits ? __ldcg(st + lane * stride) : -INFINITY;
    const float lz = lane < p.splits ? __ldcg(st + lane * stride + 1) : 0.0f;
    const float mx = warp_reduce(mz, MaxOp{});
    const float w = mz == -INFINITY ? 0.0f : expf(mz - mx);
    const float sum = warp_reduce(lz * w, SumOp{});
    weight_s[r][lane] = w;
    if (lane == 0) inv_s[r] = sum == 0.0f ? 0.0f : 1.0f / sum;   // no key seen: 0
  }
  __syncthreads();
  for (int e = threadIdx.x; e < R * D; e += kThreads) {
    const int r = e / D, c = e % D;
    if (r >= p.rows) continue;
    const float* st = states + int64_t(r) * (D + 2) + 2 + c;
    float a = 0.0f;
#pragma unroll
    for (int z = 0; z < kMaxSplits; ++z) {
      if (z < p.splits) a += weight_s[r][z] * __ldcg(st + z * stride);
    }
    out[head(r) * p.os[1] + query(r) * p.os[2] + c] = from_float<T>(a * inv_s[r]);
  }
  if (threadIdx.x == 0) *arrivals = 0u;   // ready for the next launch (graph replays too)
}

using DecodeKernel = void (*)(DecodeParams);

template <typename T, int L, bool kCluster>
DecodeKernel kernel_for_rows(int rows) {
  return rows <= 1 ? decode_attention_kernel<T, L, 1, kCluster>
         : rows <= 2 ? decode_attention_kernel<T, L, 2, kCluster>
         : rows <= 4 ? decode_attention_kernel<T, L, 4, kCluster>
                     : decode_attention_kernel<T, L, kMaxRows, kCluster>;
}

template <typename T, bool kCluster>
DecodeKernel kernel_for(int64_t head_dim, int rows) {
  const int64_t lanes = head_dim * int64_t(sizeof(T)) / 16;
  return lanes == 8 ? kernel_for_rows<T, 8, kCluster>(rows)
         : lanes == 16 ? kernel_for_rows<T, 16, kCluster>(rows)
                       : kernel_for_rows<T, 32, kCluster>(rows);
}

DecodeKernel kernel_for(blob::DType dtype, int64_t head_dim, int rows, bool cluster) {
  DecodeKernel k = nullptr;
  visit_floating(dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    k = cluster ? kernel_for<T, true>(head_dim, rows) : kernel_for<T, false>(head_dim, rows);
  });
  return k;
}

int round_rows(int rows) { return rows <= 1 ? 1 : rows <= 2 ? 2 : rows <= 4 ? 4 : kMaxRows; }

class DecodeAttentionStep final : public Step {
 public:
  DecodeAttentionStep(const AttentionArgs& a, const DecodeParams& p, DecodeKernel kernel,
                      unsigned cluster, float* partial, unsigned* arrivals)
      : a_(a), p_(p), kernel_(kernel), cluster_(cluster), partial_(partial), arrivals_(arrivals) {}
  ~DecodeAttentionStep() override {
    cudaFree(partial_);
    cudaFree(arrivals_);
  }

  Error enqueue(const RunContext& ctx) override {
    if (a_.batch == 0 || a_.seq_q == 0) return Error::Ok;
    DecodeParams p = p_;
    p.q = ctx.ptr(a_.q);
    p.k = ctx.ptr(a_.k);
    p.v = ctx.ptr(a_.v);
    p.mask = a_.mask == kNoTensor ? nullptr : ctx.ptr(a_.mask);
    p.out = ctx.ptr(a_.out);
    const dim3 grid(static_cast<unsigned>(p.splits), static_cast<unsigned>(a_.batch * a_.heads_kv));
    launch_overlapped_clusters(kernel_, grid, kThreads, 0, ctx.stream, cluster_, p);
    return Error::Ok;
  }

 private:
  AttentionArgs a_;
  DecodeParams p_;
  DecodeKernel kernel_;
  unsigned cluster_;   // blocks per cluster (the splits), or 0: merged through `partial_`
  float* partial_;
  unsigned* arrivals_;
};

}  // namespace

const char* decode_attention_unsupported(const AttentionArgs& a, const InitContext& ctx) {
  if (env_is("KILN_ATTENTION_DECODE", "off")) return "KILN_ATTENTION_DECODE=off";
  if (std::getenv("KILN_ATTENTION_QUERIES") != nullptr) return "KILN_ATTENTION_QUERIES is set";
  const Graph& g = ctx.graph;
  const int64_t size = int64_t(element_size(g.tensors[a.q].dtype));
  if (a.heads_q % a.heads_kv != 0) return "heads_q is no multiple of heads_kv";
  if (a.seq_q * (a.heads_q / a.heads_kv) > kMaxRows) return "more than 8 query rows per KV head";
  if (a.head_dim != a.head_dim_v) return "head_dim differs from head_dim_v";
  const int64_t bytes = a.head_dim * size;
  if (bytes != 128 && bytes != 256 && bytes != 512) {
    return "a K/V row is not 128, 256 or 512 bytes";
  }
  if (a.batch * a.heads_kv > 65535) return "batch * heads_kv past the grid's y";
  // K and V rows are read with 16-byte loads: every row must start 16-byte aligned.
  const int64_t k_elems[4] = {a.k_offset, a.k_stride_b, a.k_stride_h, a.k_stride_s};
  const int64_t v_elems[4] = {a.v_offset, a.v_stride_b, a.v_stride_h, a.v_stride_s};
  for (int i = 0; i < 4; ++i) {
    if ((k_elems[i] * size) % 16 != 0 || (v_elems[i] * size) % 16 != 0) {
      return "K or V rows are not 16-byte aligned";
    }
  }
  if (ctx.alignment[size_t(a.k)] % 16 != 0 || ctx.alignment[size_t(a.v)] % 16 != 0) {
    return "the K or V tensor is not 16-byte aligned";
  }
  return nullptr;
}

StepResult make_decode_attention_step(const AttentionArgs& a, const InitContext& ctx) {
  const Graph& g = ctx.graph;
  const blob::DType dtype = g.tensors[a.q].dtype;
  DecodeParams p{};
  p.mask_kind = mask_kind(a, g);
  p.heads_kv = a.heads_kv;
  p.group = int(a.heads_q / a.heads_kv);
  p.seq_q = a.seq_q;
  p.seq_kv = a.seq_kv;
  p.q_offset = a.q_offset;
  p.k_offset = a.k_offset;
  p.v_offset = a.v_offset;
  const int64_t qs[3] = {a.q_stride_b, a.q_stride_h, a.q_stride_s};
  const int64_t ks[3] = {a.k_stride_b, a.k_stride_h, a.k_stride_s};
  const int64_t vs[3] = {a.v_stride_b, a.v_stride_h, a.v_stride_s};
  const int64_t ms[4] = {a.mask_stride_b, a.mask_stride_h, a.mask_stride_q, a.mask_stride_k};
  const int64_t os[3] = {a.out_stride_b, a.out_stride_h, a.out_stride_s};
  std::copy(qs, qs + 3, p.qs);
  std::copy(ks, ks + 3, p.ks);
  std::copy(vs, vs + 3, p.vs);
  std::copy(ms, ms + 4, p.ms);
  std::copy(os, os + 3, p.os);
  p.causal = a.causal;
  p.scale = static_cast<float>(a.scale);
  p.rows = int(a.seq_q * p.group);
  // Splits: enough CTAs for about two per SM, each split at least one iteration of keys.
  int device = 0, sms = 0;
  KILN_TRY(cuda_status(cudaGetDevice(&device), Error::Internal,
                       "Kiln engine: op %zu (attention): cudaGetDevice", ctx.op_index));
  KILN_TRY(cuda_status(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device),
                       Error::Internal, "Kiln engine: op %zu (attention): SM count",
                       ctx.op_index));
  const int64_t step = kStep;
  const int64_t heads = std::max<int64_t>(1, a.batch * a.heads_kv);
  // A cluster of the splits merges them in distributed shared memory (sm_90 and later, up to 16
  // blocks; KILN_ATTENTION_CLUSTER=off merges through global memory).
  auto plan_splits = [&](int64_t most) {
    int64_t splits = std::min<int64_t>({most, (2 * sms + heads - 1) / heads,
                                        std::max<int64_t>(1, (a.seq_kv + step - 1) / step)});
    splits = std::max<int64_t>(splits, 1);
    p.chunk = ((a.seq_kv + splits - 1) / splits + step - 1) / step * step;
    p.chunk = std::max<int64_t>(p.chunk, step);
    p.splits = int(std::max<int64_t>(1, (a.seq_kv + p.chunk - 1) / p.chunk));
  };
  int major = 0;
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
  bool cluster = major >= 9 && !env_is("KILN_ATTENTION_CLUSTER", "off");
  plan_splits(cluster ? kMaxClusterSplits : kMaxSplits);
  DecodeKernel kernel = kernel_for(dtype, a.head_dim, p.rows, cluster && p.splits > 1);
  if (cluster && p.splits > 1) {
    // How large a cluster of these blocks the device can run (16 needs the non-portable size).
    cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
    cudaLaunchAttribute dims{};
    dims.id = cudaLaunchAttributeClusterDimension;
    dims.val.clusterDim.x = unsigned(p.splits);
    dims.val.clusterDim.y = dims.val.clusterDim.z = 1;
    cudaLaunchConfig_t config{};
    config.gridDim = dim3(unsigned(p.splits), unsigned(heads));
    config.blockDim = dim3(kThreads);
    config.attrs = &dims;
    config.numAttrs = 1;
    int most = 0;
    if (cudaOccupancyMaxPotentialClusterSize(&most, kernel, &config) != cudaSuccess || most < 2) {
      cudaGetLastError();   // not an error of the run: merge through global memory instead
      cluster = false;
      plan_splits(kMaxSplits);
    } else if (most < p.splits) {
      plan_splits(most);
    }
  }
  cluster = cluster && p.splits > 1;
  kernel = kernel_for(dtype, a.head_dim, p.rows, cluster);

  float* partial = nullptr;
  unsigned* arrivals = nullptr;
  if (p.splits > 1 && !cluster) {
    const size_t bytes = size_t(heads) * size_t(p.splits) * size_t(round_rows(p.rows)) *
                         size_t(a.head_dim + 2) * sizeof(float);
    KILN_TRY(cuda_status(cudaMalloc(&partial, bytes), Error::MemoryAllocationFailed,
                         "Kiln engine: op %zu (attention): cudaMalloc of %zu bytes for the "
                         "decode splits' partial results",
                         ctx.op_index, bytes));
    cudaError_t status = cudaMalloc(&arrivals, size_t(heads) * sizeof(unsigned));
    if (status == cudaSuccess) status = cudaMemset(arrivals, 0, size_t(heads) * sizeof(unsigned));
    if (status != cudaSuccess) {
      cudaFree(partial);
      cudaFree(arrivals);
      return cuda_status(status, Error::MemoryAllocationFailed,
                         "Kiln engine: op %zu (attention): the decode splits' arrival counters",
                         ctx.op_index);
    }
  }
  p.partial = partial;
  p.arrivals = arrivals;
  return std::unique_ptr<Step>(new DecodeAttentionStep(
      a, p, kernel, cluster ? unsigned(p.splits) : 0u, partial, arrivals));
}

}  // namespace kiln::engine::kernels
