// kAttention through cuDNN's fused flash attention (the cuDNN frontend's SDPA graph): tensor-core
// attention for Float16 / BFloat16 with the causal flag, grouped-query heads and strided q/k/v,
// and with a mask tensor from 16 queries up (written as cuDNN's additive bias first,
// attention_mask.cuh). make_attention_step (attention.cu) uses it where it applies and keeps
// Kiln's own kernel for everything else (Float32, masked decode, head dims or alignments cuDNN
// has no plan for).
#pragma once

#include "runtime/engine/step.h"

namespace kiln::engine::kernels {

/// Why the cuDNN path cannot take this op (a phrase for the log), or nullptr when it may.
/// KILN_ATTENTION=kiln turns the path off; the default (unset or "auto") uses it.
const char* cudnn_attention_unsupported(const AttentionArgs& a, const Graph& graph);

/// Whether any attention op of `graph` may go through cuDNN (the engine then creates a cuDNN
/// handle even without a convolution).
bool graph_has_cudnn_attention(const Graph& graph);

/// Builds the cuDNN plan for the op. NotSupported (with a log line) when cuDNN has no plan for
/// it on this device; the caller then falls back to Kiln's kernel.
StepResult make_cudnn_attention_step(const AttentionArgs& a, const InitContext& ctx);

}  // namespace kiln::engine::kernels
