// kConv2d: NCHW convolution through cuDNN (any stride, padding, dilation and groups, including
// depthwise), plus a per-channel bias pass. The algorithm is chosen once at init.
#pragma once

#include "runtime/engine/device.h"
#include "runtime/engine/step.h"

namespace kiln::engine::kernels {

using UniqueCudnn = UniqueHandle<cudnnHandle_t, cudnnDestroy>;

/// Creates the engine's cuDNN handle (only when the graph has a conv2d: loading cuDNN is slow).
executorch::runtime::Result<UniqueCudnn> create_cudnn();

StepResult make_conv2d_step(const Conv2dArgs& args, const InitContext& ctx);

}  // namespace kiln::engine::kernels
