// kAttention: fused scaled-dot-product attention (scores, mask, causal, online softmax and the
// weighted sum of values in one kernel), fp32 math for every floating dtype.
#pragma once

#include "runtime/engine/step.h"

namespace kiln::engine::kernels {

/// The largest head_dim / head_dim_v the kernel takes (the lowering refuses larger ones).
inline constexpr int64_t kMaxAttentionHeadDim = 256;

StepResult make_attention_step(const AttentionArgs& args, const InitContext& ctx);

}  // namespace kiln::engine::kernels
