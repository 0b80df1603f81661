// Micro-benchmark of batch-1 bf16 GEMV variants, out[n] = sum_k x[k] * W[n, k], at a
// Llama-3.2-1B layer's shapes, each launch in a CUDA graph reading another copy of the weight
// (400 MB in rotation, so L2 holds none): Kiln's kernel (v0: a warp per column), several columns
// per warp with the first weights loaded before the activations are staged (v1), split-K inside a
// block (v2), and programmatic dependent launch (v3: the next GEMV starts and loads its weights
// while the previous one finishes), alone and with a small dependent kernel between GEMVs.
// Standalone (no Kiln code):
//   nvcc -O3 -arch=sm_90 -std=c++17 bench/gemv_variants.cu -o gemv_variants && ./gemv_variants
// bench/results/h200_gemv_variants.txt is one H200 run: no variant beats v0 by more than ~10 %;
// a mid-sized GEMV pays ~3 us of launch and ramp whatever its loop, so merging projections
// (fewer, larger GEMVs) is what pays.
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <cstdio>
#include <cstdint>
#include <vector>
#include <cmath>

#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { printf("%s: %s\n", #x, cudaGetErrorString(e)); exit(1);} } while (0)
using T = __nv_bfloat16;

// x[v * 8 .. v * 8 + 7] (fp32, staged) dotted with the 8 bf16 weights of one 16-byte load.
__device__ __forceinline__ float dot8(const uint4& packed, const float* staged, int v) {
  const T* w = reinterpret_cast<const T*>(&packed);
  const float4* x = reinterpret_cast<const float4*>(staged + v * 8);
  const float4 a = x[0], b = x[1];
  return __bfloat162float(w[0]) * a.x + __bfloat162float(w[1]) * a.y + __bfloat162float(w[2]) * a.z +
         __bfloat162float(w[3]) * a.w + __bfloat162float(w[4]) * b.x + __bfloat162float(w[5]) * b.y +
         __bfloat162float(w[6]) * b.z + __bfloat162float(w[7]) * b.w;
}

// A warp's C column sums reduced across its lanes; lane c writes column col0 + c.
template <int C>
__device__ __forceinline__ void store_columns(float (&acc)[C], int lane, int col0, int n, T* out) {
#pragma unroll
  for (int c = 0; c < C; ++c) {
    for (int o = 16; o; o /= 2) acc[c] += __shfl_xor_sync(~0u, acc[c], o);
  }
  if (lane < C && col0 + lane < n) {
    float v = acc[0];
#pragma unroll
    for (int c = 1; c < C; ++c) if (lane == c) v = acc[c];
    out[col0 + lane] = __float2bfloat16(v);
  }
}

// V0: the current kernel: a warp per column, x staged fp32 in smem, unroll 4.
__global__ void __launch_bounds__(256) v0(const T* x, const T* w, T* out, int n, int k) {
  extern __shared__ float staged[];
  for (int i = threadIdx.x; i < k; i += blockDim.x) staged[i] = __bfloat162float(x[i]);
  __syncthreads();
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  for (int col = blockIdx.x * 8 + warp; col < n; col += gridDim.x * 8) {
    const uint4* row = reinterpret_cast<const uint4*>(w + size_t(col) * k);
    float acc = 0;
#pragma unroll 4
    for (int v = lane; v < k / 8; v += 32) {
      const uint4 p = __ldg(row + v);
      acc += dot8(p, staged, v);
    }
    for (int o = 16; o; o /= 2) acc += __shfl_xor_sync(~0u, acc, o);
    if (lane == 0) out[col] = __float2bfloat16(acc);
  }
}

// V1<C, U>: a warp computes C adjacent columns; per step each lane loads one uint4 of each
// column (C loads), U steps unrolled; x staged fp32 in smem and read once per step for all C
// columns. The first step's weights are loaded before staging x.
template <int C, int U>
__global__ void __launch_bounds__(256) v1(const T* x, const T* w, T* out, int n, int k) {
  extern __shared__ float staged[];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int steps = k / 256;  // 32 lanes x 8 elements
  const int col0 = (blockIdx.x * 8 + warp) * C;
  uint4 first[C];
#pragma unroll
  for (int c = 0; c < C; ++c) {
    first[c] = col0 + c < n ? __ldg(reinterpret_cast<const uint4*>(w + size_t(col0 + c) * k) + lane) : make_uint4(0, 0, 0, 0);
  }
  for (int i = threadIdx.x; i < k; i += blockDim.x) staged[i] = __bfloat162float(x[i]);
  __syncthreads();
  if (col0 >= n) return;
  float acc[C] = {};
  auto fma8 = [&](const uint4& p, int v, float& a) { a += dot8(p, staged, v); };
#pragma unroll
  for (int c = 0; c < C; ++c) fma8(first[c], lane, acc[c]);
  for (int s = 1; s < steps; s += U) {
    uint4 p[U][C];
#pragma unroll
    for (int u = 0; u < U; ++u)
#pragma unroll
      for (int c = 0; c < C; ++c)
        p[u][c] = (s + u < steps && col0 + c < n) ? __ldg(reinterpret_cast<const uint4*>(w + size_t(col0 + c) * k) + (s + u) * 32 + lane) : make_uint4(0, 0, 0, 0);
#pragma unroll
    for (int u = 0; u < U; ++u)
      if (s + u < steps)
#pragma unroll
        for (int c = 0; c < C; ++c) fma8(p[u][c], (s + u) * 32 + lane, acc[c]);
  }
  store_columns<C>(acc, lane, col0, n, out);
}

// V2<C>: like V1 but the steps of a warp are split across the block's warps for long K
// (split-K inside a block: 8 warps share C columns, reduce through smem).
template <int C>
__global__ void __launch_bounds__(256) v2(const T* x, const T* w, T* out, int n, int k) {
  extern __shared__ float staged[];
  __shared__ float part[8][C];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int steps = k / 256;
  const int col0 = blockIdx.x * C;
  for (int i = threadIdx.x; i < k; i += blockDim.x) staged[i] = __bfloat162float(x[i]);
  __syncthreads();
  float acc[C] = {};
  for (int s = warp; s < steps; s += 8) {
    uint4 p[C];
#pragma unroll
    for (int c = 0; c < C; ++c) p[c] = col0 + c < n ? __ldg(reinterpret_cast<const uint4*>(w + size_t(col0 + c) * k) + s * 32 + lane) : make_uint4(0,0,0,0);
#pragma unroll
    for (int c = 0; c < C; ++c) {
      acc[c] += dot8(p[c], staged, s * 32 + lane);
    }
  }
#pragma unroll
  for (int c = 0; c < C; ++c) {
    for (int o = 16; o; o /= 2) acc[c] += __shfl_xor_sync(~0u, acc[c], o);
    if (lane == 0) part[warp][c] = acc[c];
  }
  __syncthreads();
  if (threadIdx.x < C && col0 + threadIdx.x < n) {
    float v = 0;
    for (int q = 0; q < 8; ++q) v += part[q][threadIdx.x];
    out[col0 + threadIdx.x] = __float2bfloat16(v);
  }
}

// V3: v1<1, 4> under programmatic dependent launch: it lets the next kernel launch at once
// (launch_dependents), loads its first weights, and only then waits for the previous grid.
template <int C, int U>
__global__ void __launch_bounds__(256) v3(const T* x, const T* w, T* out, int n, int k) {
  extern __shared__ float staged[];
  asm volatile("griddepcontrol.launch_dependents;");
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int steps = k / 256;
  const int col0 = (blockIdx.x * 8 + warp) * C;
  uint4 first[U][C];
#pragma unroll
  for (int u = 0; u < U; ++u)
#pragma unroll
  for (int c = 0; c < C; ++c) {
    first[u][c] = (col0 + c < n && u < steps) ? __ldg(reinterpret_cast<const uint4*>(w + size_t(col0 + c) * k) + u * 32 + lane) : make_uint4(0, 0, 0, 0);
  }
  asm volatile("griddepcontrol.wait;" ::: "memory");
  for (int i = threadIdx.x; i < k; i += blockDim.x) staged[i] = __bfloat162float(x[i]);
  __syncthreads();
  if (col0 >= n) return;
  float acc[C] = {};
  auto fma8 = [&](const uint4& p, int v, float& a) { a += dot8(p, staged, v); };
#pragma unroll
  for (int u = 0; u < U; ++u)
    if (u < steps)
#pragma unroll
      for (int c = 0; c < C; ++c) fma8(first[u][c], u * 32 + lane, acc[c]);
  for (int s = U; s < steps; s += U) {
    uint4 p[U][C];
#pragma unroll
    for (int u = 0; u < U; ++u)
#pragma unroll
      for (int c = 0; c < C; ++c)
        p[u][c] = (s + u < steps && col0 + c < n) ? __ldg(reinterpret_cast<const uint4*>(w + size_t(col0 + c) * k) + (s + u) * 32 + lane) : make_uint4(0, 0, 0, 0);
#pragma unroll
    for (int u = 0; u < U; ++u)
      if (s + u < steps)
#pragma unroll
        for (int c = 0; c < C; ++c) fma8(p[u][c], (s + u) * 32 + lane, acc[c]);
  }
  store_columns<C>(acc, lane, col0, n, out);
}

// A small dependent kernel between GEMVs (a norm's stand-in): reads the GEMV's output and writes x.
__global__ void between(const T* y, T* x, int n, int pdl) {
  if (pdl) asm volatile("griddepcontrol.launch_dependents;");
  if (pdl) asm volatile("griddepcontrol.wait;" ::: "memory");
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) x[i] = y[i % 512];
}

float time_graph(void (*launch)(cudaStream_t), cudaStream_t s, int reps) {
  cudaGraph_t g; cudaGraphExec_t ge;
  CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  for (int i = 0; i < reps; ++i) launch(s);
  CK(cudaStreamEndCapture(s, &g));
  CK(cudaGraphInstantiate(&ge, g, 0));
  cudaEvent_t a, b; cudaEventCreate(&a); cudaEventCreate(&b);
  CK(cudaGraphLaunch(ge, s)); CK(cudaStreamSynchronize(s));
  float best = 1e9;
  for (int t = 0; t < 5; ++t) {
    cudaEventRecord(a, s); CK(cudaGraphLaunch(ge, s)); cudaEventRecord(b, s); CK(cudaEventSynchronize(b));
    float ms; cudaEventElapsedTime(&ms, a, b); best = fminf(best, ms);
  }
  cudaGraphExecDestroy(ge); cudaGraphDestroy(g);
  return best * 1000.0f / reps;  // us per launch
}

// The shapes of a Llama-3.2-1B layer and of several weights in rotation (so L2 does not hold them).
static T *gx, *gout; static std::vector<T*> gw; static int gn, gk, gi; static void (*gkern)(const T*, const T*, T*, int, int); static int gblocks, gsmem, gpdl, gbetween;
void launch_cur(cudaStream_t s) {
  if (gbetween) {
    cudaLaunchConfig_t cb{}; cb.gridDim = 4; cb.blockDim = 256; cb.stream = s;
    cudaLaunchAttribute ab; ab.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    ab.val.programmaticStreamSerializationAllowed = 1; cb.attrs = &ab; cb.numAttrs = gpdl ? 1 : 0;
    CK(cudaLaunchKernelEx(&cb, between, (const T*)gout, gx, gk, gpdl));
  }
  if (!gpdl) { gkern<<<gblocks, 256, gsmem, s>>>(gx, gw[gi++ % gw.size()], gout, gn, gk); return; }
  cudaLaunchConfig_t cfg{}; cfg.gridDim = gblocks; cfg.blockDim = 256; cfg.dynamicSmemBytes = gsmem; cfg.stream = s;
  cudaLaunchAttribute attr; attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr.val.programmaticStreamSerializationAllowed = 1; cfg.attrs = &attr; cfg.numAttrs = 1;
  CK(cudaLaunchKernelEx(&cfg, gkern, (const T*)gx, (const T*)gw[gi++ % gw.size()], gout, gn, gk));
}

int main() {
  cudaStream_t s; cudaStreamCreate(&s);
  int sms; cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  const int shapes[][2] = {{2048, 2048}, {512, 2048}, {3072, 2048}, {8192, 2048}, {16384, 2048}, {2048, 8192}};
  for (auto& sh : shapes) {
    gn = sh[0]; gk = sh[1];
    const size_t bytes = size_t(gn) * gk * sizeof(T);
    const int copies = int(std::max<size_t>(2, (size_t(400) << 20) / bytes));
    gw.clear();
    for (int c = 0; c < copies; ++c) { T* p; CK(cudaMalloc(&p, bytes)); CK(cudaMemset(p, 0x3c, bytes)); gw.push_back(p); }
    CK(cudaMalloc(&gx, gk * sizeof(T))); CK(cudaMemset(gx, 0x3c, gk * sizeof(T)));
    CK(cudaMalloc(&gout, gn * sizeof(T)));
    gsmem = gk * 4;
    struct V { const char* name; void (*k)(const T*, const T*, T*, int, int); int cols_per_block; int pdl = 0; int between = 0; };
    V vs[] = {{"v0 warp/col", v0, 8},
              {"v0 +between", v0, 8, 0, 1}, {"v3 C1U4 +betw", v3<1, 4>, 8, 0, 1},
              {"v3 C1U4 pdl", v3<1, 4>, 8, 1, 0}, {"v3 C1U4 pdl+b", v3<1, 4>, 8, 1, 1},
              {"v3 C2U2 pdl", v3<2, 2>, 16, 1, 0}, {"v3 C1U8 pdl", v3<1, 8>, 8, 1, 0},
              {"v1 C2 U2", v1<2, 2>, 16}, {"v1 C4 U1", v1<4, 1>, 32}, {"v1 C4 U2", v1<4, 2>, 32},
              {"v1 C8 U1", v1<8, 1>, 64}, {"v1 C2 U4", v1<2, 4>, 16}, {"v1 C1 U4", v1<1, 4>, 8},
              {"v2 C4", v2<4>, 4}, {"v2 C8", v2<8>, 8}, {"v2 C16", v2<16>, 16}};
    for (auto& v : vs) {
      gkern = v.k; gpdl = v.pdl; gbetween = v.between;
      CK(cudaFuncSetAttribute(v.k, cudaFuncAttributeMaxDynamicSharedMemorySize, gsmem));
      gblocks = (gn + v.cols_per_block - 1) / v.cols_per_block;
      if (v.k == v0) gblocks = std::min(gblocks, sms * 8);
      gi = 0;
      const float us = time_graph(launch_cur, s, 40);
      CK(cudaGetLastError());
      printf("N=%5d K=%5d %-12s blocks=%5d %7.2f us %6.2f TB/s\n", gn, gk, v.name, gblocks, us, bytes / us / 1e6);
    }
    for (T* p : gw) cudaFree(p);
    cudaFree(gx); cudaFree(gout);
  }
  // Copy bandwidth for reference.
  size_t b = size_t(1) << 30; void *p, *q; CK(cudaMalloc(&p, b)); CK(cudaMalloc(&q, b));
  cudaEvent_t e0, e1; cudaEventCreate(&e0); cudaEventCreate(&e1);
  cudaMemcpyAsync(q, p, b, cudaMemcpyDeviceToDevice, s); cudaEventRecord(e0, s);
  for (int i = 0; i < 5; ++i) cudaMemcpyAsync(q, p, b, cudaMemcpyDeviceToDevice, s);
  cudaEventRecord(e1, s); cudaEventSynchronize(e1); float ms; cudaEventElapsedTime(&ms, e0, e1);
  printf("d2d copy: %.2f TB/s (read+write)\n", 2.0 * 5 * b / (ms * 1e-3) / 1e12);
  return 0;
}
