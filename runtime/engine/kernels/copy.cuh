// kCopy: strided copy with dtype cast, rank <= 8 (permute, expand, slice, select, transpose,
// reshape, clone, cat pieces, dtype conversion).
#pragma once

#include "runtime/engine/step.h"

namespace kiln::engine::kernels {

StepResult make_copy_step(const CopyArgs& args, const InitContext& ctx);

}  // namespace kiln::engine::kernels
