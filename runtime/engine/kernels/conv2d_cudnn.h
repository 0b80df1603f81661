// kConv2d as one fused cuDNN graph (the cuDNN frontend's conv_fprop followed by pointwise nodes):
// convolution, per-channel bias, residual add and activation in one launch on NHWC activations,
// where the legacy path runs cuDNN's convolution and then Kiln's epilogue pass over the result.
// make_conv2d_step (conv2d.cu) tries it first for channels_last BFloat16 / Float16 / TF32 ops and
// keeps the legacy path for everything cuDNN has no fused plan for (strict fp32, NCHW, hardswish,
// most grouped convolutions on some cuDNN versions).
#pragma once

#include "runtime/engine/step.h"

namespace kiln::engine::kernels {

/// Why the fused path cannot take this op (a phrase for the log), or nullptr when it may try.
/// KILN_CONV=legacy turns the path off; the default (unset or "auto") uses it.
const char* cudnn_fused_conv_unsupported(const Conv2dArgs& a, const Graph& graph);

/// Builds the fused plan. NotSupported (with an Info log line) when cuDNN has none for this op on
/// this device; the caller then uses the legacy path.
StepResult make_cudnn_fused_conv_step(const Conv2dArgs& a, const InitContext& ctx);

}  // namespace kiln::engine::kernels
