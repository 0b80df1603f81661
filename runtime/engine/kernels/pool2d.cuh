// kPool2d: max and average pooling over NCHW or NHWC (channels_last) with stride, padding and (for max) dilation.
// Max propagates NaN and gives -inf for a window entirely in padding; average follows PyTorch's
// divisor rules (count_include_pad, windows clipped at the padded border with ceil_mode).
#pragma once

#include "runtime/engine/step.h"

namespace kiln::engine::kernels {

StepResult make_pool2d_step(const Pool2dArgs& args, const InitContext& ctx);

}  // namespace kiln::engine::kernels
