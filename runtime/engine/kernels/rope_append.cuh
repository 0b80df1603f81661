// kRope and kIndexPut ops in a row as one kernel: a decoder layer's rotary embedding of q and k
// and its two KV-cache writes are four launches of a few thousand elements each, so each costs
// its launch and its memory round trips rather than its bytes. Run together, k's rotated rows go
// straight into the cache (the rope's own output is never written when only that write reads it)
// and every block checks the write positions before it writes any, as kIndexPut does.
#pragma once

#include <cstddef>

#include "runtime/engine/step.h"

namespace kiln::engine::kernels {

/// How many ops from ctx.op_index run as one rope-and-append step: 2 or more kRope / kIndexPut
/// ops in a row, or 0 when none can (KILN_ROPE_APPEND=off turns it off).
size_t rope_append_length(const InitContext& ctx);

/// Why ops [ctx.op_index, ctx.op_index + count) cannot run as one step, or nullptr when they can:
/// each is a kRope or a kIndexPut of one floating dtype, no op reads or overwrites what another
/// writes (except an index_put whose values are a rope's output that nothing else reads), and
/// each index_put writes at most kSelfCheckedPositions positions.
const char* rope_append_unsupported(size_t count, const InitContext& ctx);

/// The step of ops [ctx.op_index, + count) (rope_append_unsupported said they may); the steps of
/// the other ops of the group are make_folded_step()'s.
StepResult make_rope_append_step(size_t count, const InitContext& ctx);

}  // namespace kiln::engine::kernels
