// kConv2d: NCHW convolution through cuDNN (any stride, padding, dilation and groups, including
// depthwise), plus a per-channel bias pass. The algorithm is chosen once at init: the fastest one
// timed on the device (cudnnFind), remembered in the persistent algorithm cache (algo_cache.h) so
// later loads of the same blob on the same kind of device skip the timing.
#pragma once

#include <string>

#include "runtime/engine/device.h"
#include "runtime/engine/step.h"

namespace kiln::engine::kernels {

using UniqueCudnn = UniqueHandle<cudnnHandle_t, cudnnDestroy>;

/// Creates the engine's cuDNN handle (only when the graph has a conv2d: loading cuDNN is slow).
executorch::runtime::Result<UniqueCudnn> create_cudnn();

/// The algorithm cache's device key: compute capability, device name, cuDNN and blob versions.
std::string conv_algo_key(int device);

StepResult make_conv2d_step(const Conv2dArgs& args, const InitContext& ctx);

}  // namespace kiln::engine::kernels
