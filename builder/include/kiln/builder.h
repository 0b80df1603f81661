/* Kiln AOT builder, C API: lowered Kiln IR in, engine blob (or variant set) out.
 *
 * libkiln_builder.so runs the builder's passes over a graph that Python (or any C/C++ tool)
 * lowered into Kiln IR, writes the engine blob (format/blob_format.h) and verifies it with
 * the runtime's own blob reader before handing it back. No CUDA is needed to use it.
 *
 * Passes, in order (each selected by a KILN_BUILDER_PASS_* bit):
 *   dead-op elimination; RMSNorm chains (pow-mean-add-rsqrt-mul) into one kLayerNorm (rms);
 *   residual+activation epilogue fusion into kMatmul and kConv2d (their
 *   bias is already in them), and the transpose after kAttention into its out strides; precision conversion (fp16/bf16 graphs: float32 tensors other than
 *   delegate inputs become the low dtype, weights rounded to nearest even as torch's Tensor.to()
 *   does, casts at the delegate's float inputs and outputs); channels-last layout (conv nets'
 *   activations NHWC between convolutions and pools, conv weights KRSC, a layout copy only where
 *   another op needs NCHW); redundant copies (a copy of a copy reads the first one's source
 *   through composed strides; same-dtype dense copies and multiplies by 1, the casts precision
 *   conversion left, become views) and a norm's per-column weight multiply folded into the
 *   kLayerNorm; elementwise-chain fusion into kFusedElementwise; binding of outputs
 *   to the runtime's output memory; compaction (unreferenced tensors dropped, ids renumbered); liveness-based
 *   best-fit planning of the arena (256-byte aligned). With passes == 0 the IR is written as given
 *   (its arena offsets and arena_size are then used as they are).
 *
 * Errors: every function returns KILN_BUILDER_OK (0) or a nonzero code, and then writes one
 * NUL-terminated sentence naming the problem (the op index or tensor id and what is wrong) into
 * `error` (at most error_size bytes, truncated to fit; nothing is written when error is NULL or
 * error_size is 0). No C++ exception leaves the library. Malformed IR is rejected, never a crash.
 *
 * Threading: the functions keep no state between calls; concurrent calls are safe.
 *
 * -------------------------------------------------------------------------------------------------
 * The IR interchange format ("KILNIR", version 2). All integers little-endian; the sections follow
 * each other without padding, in this order:
 *
 *   Header (64 bytes)
 *     char     magic[8]        "KILNIR\0\0"
 *     uint32   version         2 (KILN_IR_VERSION)
 *     uint32   header_size     64
 *     uint32   precision       blob::Precision (0 fp32, 1 tf32, 2 fp16, 3 bf16)
 *     uint32   num_tensors
 *     uint32   num_ops
 *     uint32   num_inputs
 *     uint32   num_outputs
 *     uint32   reserved        0
 *     uint64   num_operands
 *     uint64   arena_size      used only when the plan-memory pass is off
 *     uint64   total_size      bytes of the whole buffer
 *   TensorEntry[num_tensors] (104 bytes each; tensor id = index)
 *     uint32   dtype           ExecuTorch ScalarType code (blob::DType)
 *     uint32   rank            <= 8
 *     int64    sizes[8]        first `rank` used, rest 0; each >= 0
 *     uint32   storage         blob::Storage (a view's own storage is ignored: its root's counts)
 *     int32    alias_of        -1, or the tensor id whose bytes this view shares (same nbytes)
 *     uint64   offset          kInput/kOutput: argument index; kArena: byte offset (unplanned: 0)
 *     uint64   data_size       bytes of contents in the data section: numel * element size for a
 *                              kWeight or kState tensor that is not a view, 0 for any other
 *     uint32   name_size       bytes of its name in the names section (informational)
 *     uint32   reserved        0
 *   OpEntry[num_ops] (8 bytes each)
 *     uint32   opcode          blob::Opcode
 *     uint32   num_operands    slots this op takes from the operand pool, in op order
 *   int64      operands[num_operands]   each op's operands encoded exactly as the blob's operand
 *                                       pool (op_table.def layouts; doubles as IEEE-754 bits)
 *   uint32     io[num_inputs + num_outputs]   tensor ids: delegate inputs, then outputs
 *   names      the tensors' names, concatenated in tensor order (UTF-8, no terminators)
 *   data       the contents of every tensor with data_size > 0, concatenated in tensor order,
 *              raw little-endian elements of its dtype, row-major
 *
 * A change to this layout, or to an operand layout of format/op_table.def (version 2:
 * kMatmul's residual), bumps KILN_IR_VERSION; the builder rejects any other version.
 */
#ifndef KILN_BUILDER_H_
#define KILN_BUILDER_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define KILN_IR_MAGIC "KILNIR\0\0"
#define KILN_IR_VERSION 2u
#define KILN_IR_HEADER_SIZE 64u
#define KILN_IR_TENSOR_ENTRY_SIZE 104u
#define KILN_IR_OP_ENTRY_SIZE 8u

/* Version of this C API; a caller checks it before using the functions below.
 * 2: kiln_builder_format_description. */
#define KILN_BUILDER_API_VERSION 2u

/* Pass selection bits. */
#define KILN_BUILDER_PASS_DEAD_OPS (1u << 0)
#define KILN_BUILDER_PASS_MATMUL_EPILOGUES (1u << 1)
#define KILN_BUILDER_PASS_PRECISION (1u << 2)
#define KILN_BUILDER_PASS_FUSE_ELEMENTWISE (1u << 3)
#define KILN_BUILDER_PASS_BIND_OUTPUTS (1u << 4)
#define KILN_BUILDER_PASS_COMPACT (1u << 5)
#define KILN_BUILDER_PASS_PLAN_MEMORY (1u << 6)
#define KILN_BUILDER_PASS_FUSE_NORMS (1u << 7)
#define KILN_BUILDER_PASS_CHANNELS_LAST (1u << 8)
#define KILN_BUILDER_PASS_REDUNDANT_COPIES (1u << 9)
#define KILN_BUILDER_PASSES_ALL 0x3ffu
/* Skip the final check with the runtime's blob reader. Only for tools that write deliberately
 * malformed blobs (the reader's fuzz seeds); a blob for a program is always checked. */
#define KILN_BUILDER_UNCHECKED (1u << 31)

/* Return codes. */
#define KILN_BUILDER_OK 0
#define KILN_BUILDER_INVALID_IR 1      /* the IR buffer is malformed */
#define KILN_BUILDER_BUILD_FAILED 2    /* a pass or the writer could not build this graph */
#define KILN_BUILDER_INVALID_BLOB 3    /* the runtime's reader rejected what was written (a bug) */
#define KILN_BUILDER_INTERNAL 4        /* out of memory, bad arguments */

/* KILN_BUILDER_API_VERSION of the loaded library. */
uint32_t kiln_builder_api_version(void);

/* Builds one engine blob from the IR at [ir, ir + ir_size) (borrowed for the call only).
 * `passes`: KILN_BUILDER_PASS_* bits (KILN_BUILDER_PASSES_ALL for a program), optionally with
 * KILN_BUILDER_UNCHECKED. On success *blob points to *blob_size bytes allocated with malloc that
 * the caller owns and releases with kiln_builder_free; on error *blob is NULL and *blob_size 0. */
int kiln_builder_build_blob(const void* ir, size_t ir_size, uint32_t passes, void** blob,
                            size_t* blob_size, char* error, size_t error_size);

/* Builds a variant set (format/variant_set.h) from `count` IR buffers, one per shape
 * assignment of a dynamic partition: each is built as kiln_builder_build_blob does, each blob
 * serves the shapes of its own input tensors, and when every blob has the same non-empty weights
 * section it is stored once for all. Ownership and errors as kiln_builder_build_blob; an error
 * names the variant index. */
int kiln_builder_build_variant_set(const void* const* irs, const size_t* ir_sizes, size_t count,
                                   uint32_t passes, void** out, size_t* out_size, char* error,
                                   size_t error_size);

/* The engine blob format as one JSON document (UTF-8, NUL-terminated, owned by the library and
 * valid while it is loaded; do not free it): everything format/blob_format.h, format/op_table.def
 * and format/variant_set.h define, so a binding in another language derives its mirror from it.
 *   "magic", "format_version", "header_size", "max_rank", "weight_alignment",
 *   "flag_external_weights", "max_fused_inputs", "max_fused_instrs", "fused_instr_width",
 *   "max_scatter_indices": numbers
 *   (the magic a string); "vset": the variant set's magic, format_version, header_size,
 *   max_variants, max_inputs, blob_alignment;
 *   "dtypes": [[name ("Float32"), ScalarType code, element size, floating], ...];
 *   "enums": {"Storage" | "Precision" | "FusedForm" | "BinaryKind" | "UnaryKind" | "ReduceKind" |
 *             "PoolKind" | "Epilogue": [[snake_case name, value], ...]};
 *   "opcodes": [{"name": "layer_norm", "value": 7, "fields": [field, ...]}, ...] in operand order,
 *     a field being {"name", "kind": "tensor" | "int" | "enum" | "double" | "int_list" |
 *     "tensor_list", "role" (tensors: "input" | "optional_input" | "output" | "state_output"),
 *     "min" / "max" (ints; lists: "min" per element; null: unbounded), "enum" (enums: its name),
 *     "count" (lists: a product of earlier int fields and numbers, "num_inputs*rank")};
 *   "records": {"Header" | "TensorRecord" | "OpRecord" | "VariantSetHeader" | "VariantRecord" |
 *               "InputShape": [[member, byte offset, byte size], ...]}. */
const char* kiln_builder_format_description(void);

/* Releases a buffer returned by the functions above (NULL is ignored). */
void kiln_builder_free(void* buffer);

#ifdef __cplusplus
}  /* extern "C" */
#endif

#endif  /* KILN_BUILDER_H_ */
