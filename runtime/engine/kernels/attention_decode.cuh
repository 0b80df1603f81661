// kAttention for a decode step (attention_decode.cu): up to 8 query rows per KV head over a
// long K/V cache, flash decoding with 16-byte K/V loads and no shared-memory staging.
#pragma once

#include "runtime/engine/kernels/attention.cuh"

namespace kiln::engine::kernels {

/// Why the decode kernel cannot take this op (a phrase for the log), or nullptr when it may:
/// seq_q * heads_q / heads_kv <= 8, head_dim == head_dim_v with rows of 128, 256 or 512 bytes,
/// and K/V rows 16-byte aligned. KILN_ATTENTION_DECODE=off turns it off (for comparison).
const char* decode_attention_unsupported(const AttentionArgs& a, const InitContext& ctx);

StepResult make_decode_attention_step(const AttentionArgs& a, const InitContext& ctx);

}  // namespace kiln::engine::kernels
