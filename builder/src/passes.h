// The builder's passes over the IR, in the order the builder runs them (kiln/builder.h). Each
// throws BuildError naming the tensor or op when it cannot do its job.
#pragma once

#include <cstdint>
#include <unordered_set>
#include <vector>

#include "builder/src/ir.h"

namespace kiln::builder {

/// Drops ops whose result no output or state depends on.
void eliminate_dead_ops(Graph& g);

/// RMSNorm as decoders write it, x * rsqrt(mean(x^2, last dim) + eps) (times a weight), a chain
/// of pow, mean, add, rsqrt and mul ops whose intermediates nothing else reads, becomes one
/// kLayerNorm with rms set.
void fuse_rms_norms(Graph& g);

/// A kLayerNorm without weight or bias whose result only a multiply by a constant per-column
/// weight reads (the `weight * norm(x).to(dtype)` of HF's RMSNorms, once drop_identity_ops has
/// removed the cast) takes that weight and writes the product.
void fold_norm_weights(Graph& g);

/// Copies of a whole dense tensor into a same-dtype dense tensor, and multiplies by the scalar 1,
/// whose result is a plain arena tensor: the result becomes a view of the operand (unless the
/// operand's storage is written after the op) and the op goes.
void drop_identity_ops(Graph& g);

/// A kCopy reading a tensor that one earlier kCopy alone wrote, whole and densely, reads that
/// copy's source instead through composed strides (where the reads map to strides there); the
/// earlier copy goes when nothing else reads its result.
void compose_copies(Graph& g);

/// Whether `strides` address `sizes` row-major without gaps or broadcast (a size-1 dimension's
/// stride never matters).
bool dense_strides(const std::vector<int64_t>& sizes, const std::vector<int64_t>& strides);

/// x * sigmoid(x) (the decomposition of silu ExecuTorch's export writes) becomes one kUnary
/// silu, which the conv and matmul epilogue passes can then fold.
void fuse_silu(Graph& g);

/// kMatmul whose result only an add of a same-shaped tensor reads: that tensor becomes the
/// matmul's residual (the add's result a view of the matmul's). Then kMatmul followed by
/// relu/gelu as the only reader of its result: the activation runs in the matmul's epilogue and
/// its result becomes a view of the matmul's.
void fuse_matmul_epilogues(Graph& g);

/// The same for kConv2d (whose bias the lowering keeps in it): a following same-shaped residual
/// add, then relu / relu6 (clamp(0, 6)) / silu / hardswish / gelu as the only reader of the
/// result, run in the convolution's epilogue.
void fuse_conv_epilogues(Graph& g);

/// kAttention whose result only a kCopy reads that permutes its [B, H, S, D] dimensions (the
/// transpose back to [B, S, H, D] before the output projection): the attention writes the copy's
/// result through its out strides and the copy goes.
void fold_attention_transposes(Graph& g);

/// fp16/bf16: float32 tensors other than the delegate's inputs become the low dtype (weights and
/// state initial values converted), float32 inputs are cast on entry and outputs on exit; fp32
/// outputs written directly by one elementwise op stay float32, and so do the operand and result
/// of a float32-only op (erfinv, as torch.autocast runs it) where their writers can write
/// float32 (ops taking one dtype then read a low-precision copy). fp32/tf32: nothing.
void convert_precision(Graph& g);

/// Graphs with a kConv2d: activations NHWC between convolutions and pools, conv weights KRSC,
/// one layout copy where an op needs the other layout (layout.cpp says which ops follow NHWC).
void convert_to_channels_last(Graph& g);

/// Chains of kUnary / kBinary / kWhere in fp32 math become kFusedElementwise ops.
void fuse_elementwise(Graph& g);

/// Output i lives in the runtime's output memory i (a copy when it cannot be retargeted).
void bind_outputs(Graph& g);

/// Removes tensors nothing refers to and renumbers the rest, keeping their order.
void compact(Graph& g);

/// A kCopy of one contiguous run of an arena tensor's elements (from any offset, dense strides,
/// same dtype) into a whole arena tensor becomes a view that starts inside the source
/// (Tensor::view_bytes), when nothing else writes the result or, after the copy, the source.
/// Runs after the fusion passes, which take tensors of one root to hold the same values.
void view_contiguous_copies(Graph& g);

/// Greedy best-fit placement of arena tensors by liveness, kArenaAlignment aligned; sets
/// Graph::arena_size.
void plan_memory(Graph& g);

/// Readers of `root` (ops reading it or a view of it), in op order.
std::vector<const Op*> readers(const Graph& g, int64_t root);

/// The one op reading `op`'s result (or a view of it), or nullptr when that result is a delegate
/// output (a root in `output_roots`) or has no reader or several: only then can a fusion fold
/// that reader into `op`, or `op` into it.
const Op* sole_reader(const Graph& g, const Op& op,
                      const std::unordered_set<int64_t>& output_roots);

/// A kCopy of every element of `x` into `out` (same numel, both contiguous).
Op flat_copy(const Graph& g, int64_t x, int64_t out);

/// fp32 -> bf16 / fp16 bits, rounded to nearest even as torch's CPU Tensor.to() does (subnormals
/// kept, overflow to inf; NaN: 0xFFFF for bf16, sign | 0x7E00 | payload >> 13 for fp16).
uint16_t float_to_bfloat16(float value);
uint16_t float_to_half(float value);

}  // namespace kiln::builder
