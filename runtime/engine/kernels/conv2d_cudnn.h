// kConv2d as one cuDNN graph (the cuDNN frontend's conv_fprop followed by pointwise nodes):
// convolution, per-channel bias, residual add and activation in one launch on NHWC activations,
// where the legacy path runs cuDNN's convolution and then Kiln's epilogue pass over the result.
// When cuDNN has no plan with the activation (hardswish has no node) or with any pointwise node,
// the graph keeps what it can and Kiln's epilogue pass does the rest: cuDNN's graph engines still
// beat its legacy NHWC kernels (fp32 ones by up to 10x at batch 1). make_conv2d_step (conv2d.cu)
// tries this first for channels-last BFloat16 / Float16 / TF32 convolutions that are not grouped.
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
