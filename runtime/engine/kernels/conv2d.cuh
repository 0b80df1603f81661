// kConv2d: NCHW or NHWC (channels_last, KRSC weight) convolution through cuDNN (any stride,
// padding, dilation and groups, including depthwise), plus one epilogue pass (per-channel bias,
// residual and activation together, fp32 math) when the op has any of them. The algorithm is chosen once at init: cuDNN's
// heuristic choice, or with KILN_AUTOTUNE=1 the fastest candidate timed on the device under CUDA
// graph replay (as the engine runs it), remembered in the persistent algorithm cache
// (algo_cache.h) so later loads of the same blob on the same kind of device skip the timing.
// Measured on the H200 (mobilenet_v3_small, cnn_small), the timed choice was 2-6% slower than the
// heuristic's end to end, so it is off by default.
#pragma once


#include "runtime/engine/device.h"
#include "runtime/engine/step.h"

namespace kiln::engine::kernels {

using UniqueCudnn = UniqueHandle<cudnnHandle_t, cudnnDestroy>;

/// Creates the engine's cuDNN handle (only when the graph has a conv2d: loading cuDNN is slow).
executorch::runtime::Result<UniqueCudnn> create_cudnn();

StepResult make_conv2d_step(const Conv2dArgs& args, const InitContext& ctx);

/// Enqueues Kiln's epilogue pass over a convolution's result `out` (of `dtype`, laid out as
/// args.channels_last says): out = act(out + bias[c] + residual), bias / residual may be null.
executorch::runtime::Error enqueue_conv_epilogue(const Conv2dArgs& args, blob::DType dtype,
                                                 void* out, const void* bias,
                                                 blob::DType bias_dtype, const void* residual,
                                                 blob::Epilogue act, const RunContext& ctx);

/// Enqueues the copy that turns a patch convolution (kernel == stride, no padding or dilation,
/// NHWC) into a 1x1 one: patches[n, oh, ow, r, s, c] = x[n, oh * kH + r, ow * kW + s, c], so the
/// KRSC filter read as [C_out, kH * kW * C_in] applies to it unchanged.
executorch::runtime::Error enqueue_space_to_depth(const Conv2dArgs& args, blob::DType dtype,
                                                  const void* x, void* patches,
                                                  const RunContext& ctx);

}  // namespace kiln::engine::kernels
