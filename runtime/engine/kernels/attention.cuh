// kAttention: fused scaled-dot-product attention (scores, mask, causal, online softmax and the
// weighted sum of values in one kernel), fp32 math for every floating dtype.
#pragma once

#include "runtime/engine/step.h"

namespace kiln::engine::kernels {

/// The largest head_dim / head_dim_v the kernel takes (the lowering refuses larger ones).
inline constexpr int64_t kMaxAttentionHeadDim = 256;

/// How an op's mask applies: none, added to the scores (the query's dtype), or a Bool keep-mask.
enum class MaskKind : int { kNone, kAdditive, kBool };

inline MaskKind mask_kind(const AttentionArgs& a, const Graph& graph) {
  if (a.mask == kNoTensor) return MaskKind::kNone;
  return graph.tensors[a.mask].dtype == blob::DType::kBool ? MaskKind::kBool : MaskKind::kAdditive;
}

StepResult make_attention_step(const AttentionArgs& args, const InitContext& ctx);

}  // namespace kiln::engine::kernels
