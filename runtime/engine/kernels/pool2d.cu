#include "runtime/engine/kernels/pool2d.cuh"

#include "runtime/engine/kernels/common.cuh"

namespace kiln::engine::kernels {
namespace {

using executorch::runtime::Error;

struct PoolShape {
  int64_t planes, h, w, kh, kw, stride_h, stride_w, pad_h, pad_w, dil_h, dil_w, h_out, w_out;
  bool count_include_pad;
  int64_t channels;     // C
  bool channels_last;   // x and out NHWC instead of NCHW
};

// Where output element i's window lies: its (oh, ow), its plane's first input element in x and
// the distance between neighbouring pixels of that plane (1 in NCHW, C in NHWC).
struct Window {
  int64_t oh, ow, base, pixel;
};

__device__ __forceinline__ Window window_of(int64_t i, const PoolShape& s) {
  if (s.channels_last) {
    const int64_t c = i % s.channels;
    const int64_t pix = i / s.channels;
    const int64_t ow = pix % s.w_out;
    const int64_t oh = (pix / s.w_out) % s.h_out;
    const int64_t n = pix / (s.w_out * s.h_out);
    return {oh, ow, n * s.h * s.w * s.channels + c, s.channels};
  }
  const int64_t ow = i % s.w_out;
  const int64_t oh = (i / s.w_out) % s.h_out;
  const int64_t plane = i / (s.w_out * s.h_out);
  return {oh, ow, plane * s.h * s.w, 1};
}

// One thread per output element; neighbouring threads take neighbouring output columns (NCHW) or
// channels (NHWC).
template <typename T>
__global__ void max_pool_kernel(const T* __restrict__ x, T* __restrict__ out, const PoolShape s) {
  const int64_t total = s.planes * s.h_out * s.w_out;
  for (int64_t i = thread_index(); i < total; i += thread_count()) {
    const Window win = window_of(i, s);
    const int64_t oh = win.oh, ow = win.ow;
    const T* xp = x + win.base;
    float best = -INFINITY;
    for (int64_t ky = 0; ky < s.kh; ++ky) {
      const int64_t iy = oh * s.stride_h - s.pad_h + ky * s.dil_h;
      if (iy < 0 || iy >= s.h) continue;
      for (int64_t kx = 0; kx < s.kw; ++kx) {
        const int64_t ix = ow * s.stride_w - s.pad_w + kx * s.dil_w;
        if (ix < 0 || ix >= s.w) continue;
        const float v = to_float(xp[(iy * s.w + ix) * win.pixel]);
        if (v > best || v != v) {
          best = v;
        }
        if (best != best) break;
      }
      if (best != best) break;
    }
    out[i] = from_float<T>(best);
  }
}

// c10's avg_pool2d: the divisor counts the window clipped to the padded input, or only the
// clipped-to-input part when count_include_pad is false.
template <typename T>
__global__ void avg_pool_kernel(const T* __restrict__ x, T* __restrict__ out, const PoolShape s) {
  const int64_t total = s.planes * s.h_out * s.w_out;
  for (int64_t i = thread_index(); i < total; i += thread_count()) {
    const Window win = window_of(i, s);
    const int64_t oh = win.oh, ow = win.ow;
    const T* xp = x + win.base;
    int64_t h0 = oh * s.stride_h - s.pad_h;
    int64_t w0 = ow * s.stride_w - s.pad_w;
    int64_t h1 = min(h0 + s.kh, s.h + s.pad_h);
    int64_t w1 = min(w0 + s.kw, s.w + s.pad_w);
    const int64_t padded_count = (h1 - h0) * (w1 - w0);
    h0 = max(h0, int64_t{0});
    w0 = max(w0, int64_t{0});
    h1 = min(h1, s.h);
    w1 = min(w1, s.w);
    float sum = 0.0f;
    for (int64_t iy = h0; iy < h1; ++iy) {
      for (int64_t ix = w0; ix < w1; ++ix) {
        sum += to_float(xp[(iy * s.w + ix) * win.pixel]);
      }
    }
    const int64_t count = s.count_include_pad ? padded_count : (h1 - h0) * (w1 - w0);
    out[i] = from_float<T>(count > 0 ? sum / static_cast<float>(count) : 0.0f);
  }
}

class Pool2dStep final : public Step {
 public:
  Pool2dStep(const Pool2dArgs& a, const Graph& graph)
      : kind_(a.kind),
        x_(a.x),
        out_(a.out),
        dtype_(graph.tensors[a.x].dtype),
        shape_{a.n * a.c, a.h,     a.w,     a.kh,    a.kw,    a.stride_h, a.stride_w,
               a.pad_h,   a.pad_w, a.dil_h, a.dil_w, a.h_out, a.w_out,    a.count_include_pad,
               a.c,       a.channels_last} {}

  Error enqueue(const RunContext& ctx) override {
    const int64_t total = shape_.planes * shape_.h_out * shape_.w_out;
    if (total == 0) {
      return Error::Ok;
    }
    const unsigned blocks = blocks_for(total, kBlock, ctx.max_blocks);
    visit_floating(dtype_, [&](auto tag) {
      using T = typename decltype(tag)::type;
      const T* x = ctx.ptr<const T>(x_);
      T* out = ctx.ptr<T>(out_);
      if (kind_ == blob::PoolKind::kMax) {
        max_pool_kernel<T><<<blocks, kBlock, 0, ctx.stream>>>(x, out, shape_);
      } else {
        avg_pool_kernel<T><<<blocks, kBlock, 0, ctx.stream>>>(x, out, shape_);
      }
    });
    return Error::Ok;
  }

 private:
  blob::PoolKind kind_;
  int64_t x_, out_;
  blob::DType dtype_;
  PoolShape shape_;
};

}  // namespace

StepResult make_pool2d_step(const Pool2dArgs& args, const InitContext& ctx) {
  return std::unique_ptr<Step>(new Pool2dStep(args, ctx.graph));
}

}  // namespace kiln::engine::kernels
