// Elementwise families: kBinary (every BinaryKind, broadcasting through 0 strides, a scalar in
// place of b), kUnary (every UnaryKind, optionally casting) and kWhere (broadcast select).
// Floating math runs in fp32 whatever the storage; integer and Bool operands use int64 math.
#pragma once

#include "runtime/engine/step.h"

namespace kiln::engine::kernels {

StepResult make_binary_step(const BinaryArgs& args, const InitContext& ctx);
StepResult make_unary_step(const UnaryArgs& args, const InitContext& ctx);
StepResult make_where_step(const WhereArgs& args, const InitContext& ctx);
// kFusedElementwise: a chain of the above in one kernel, each step rounded as the unfused op's
// result would be (same math functions, so the same bits).
StepResult make_fused_elementwise_step(const FusedElementwiseArgs& args, const InitContext& ctx);

/// Whether the fused program is the gated activation of a SwiGLU / GeGLU block, act(input
/// *act_input) * the other input, each step rounded to `dtype` (what glu_kernel runs and a GEMV
/// folds in); sets *act_input and *act when it is.
bool glu_program(const FusedElementwiseArgs& args, blob::DType dtype, int32_t* act_input,
                 blob::UnaryKind* act);

}  // namespace kiln::engine::kernels
