// The Kiln engine blob, format version 2: what the AOT builder writes into the .pte and what
// KilnBackend::init reads. This header is the single definition of the format; the C++ builder
// (builder/) writes it from here, the Python mirror (python/kiln_executorch/aot/blob_format.py)
// repeats these numbers for the IR interchange and the test reader, and a test checks that the two
// agree.
//
// Layout (all integers little-endian; every offset is from the start of the blob):
//
//   [0, 128)                 Header
//   tensors_offset           TensorRecord[num_tensors]        (96 bytes each, 8-byte aligned)
//   ops_offset               OpRecord[num_ops]                (16 bytes each)
//   operands_offset          int64[num_operands]              operand pool the ops index into
//   io_offset                uint32[num_inputs + num_outputs] tensor ids: delegate inputs, then outputs
//   weights_offset           weights_size bytes               constant data, each tensor 64-aligned
//
// Semantics
// - Tensors are dense and row-major (C-contiguous) in the dtype they are declared with.
// - A tensor's storage says where its bytes live at run time: kArena tensors at `offset` inside the
//   engine's activation arena (arena_size bytes, planned by the builder from liveness); kWeight
//   tensors at `offset` inside the weights section; kInput / kOutput tensors in the memory the
//   runtime binds for delegate argument `offset` (0-based among inputs, resp. outputs); kState
//   tensors in a device buffer of their own (see Storage::kState).
// - Ops run in order. Each op reads operands[first_operand, first_operand + num_operands). Operand
//   layouts per opcode are listed with the opcode below; "t" is a tensor id, "f" a double stored as
//   its IEEE-754 bit pattern in the int64 slot, "n" a plain integer, "[k]" k consecutive integers.
// - Strides and offsets in operands are in elements of the tensor they describe.
// - Every op writes only its output tensor(s), never one of its inputs (the builder inserts copies).
//   The one exception is program state: kIndexPut writes rows of a kState tensor in place, and
//   other ops read that tensor before or after it in op order. Ops are therefore not pure: a run
//   reads what the previous run left in its state tensors, and replaying the ops (a CUDA graph)
//   must keep their order. No other opcode writes a kState tensor.
#pragma once

#include <cstdint>

namespace kiln::engine::blob {

inline constexpr char kMagic[8] = {'K', 'I', 'L', 'N', 'B', 'L', 'O', 'B'};
inline constexpr uint32_t kFormatVersion = 2;  // 2: kMatmul's residual operand
inline constexpr uint32_t kHeaderSize = 128;
inline constexpr uint32_t kMaxRank = 8;
inline constexpr uint32_t kWeightAlignment = 64;
/// Header::flags bit 0: the weights are external (weights_size is 0; kWeight tensors address the
/// shared weights section of the variant set holding the blob, see variant_set.h). No other bit
/// is defined; a reader rejects any other bit set.
inline constexpr uint32_t kFlagExternalWeights = 1;

struct Header {
  char magic[8];             // kMagic
  uint32_t format_version;   // kFormatVersion
  uint32_t header_size;      // kHeaderSize
  uint64_t blob_size;        // total bytes, equals the size of the buffer
  uint32_t num_tensors;
  uint32_t num_ops;
  uint32_t num_inputs;       // delegate inputs (ExecuTorch passes these first in `args`)
  uint32_t num_outputs;      // delegate outputs (after the inputs in `args`)
  uint64_t tensors_offset;
  uint64_t ops_offset;
  uint64_t operands_offset;
  uint64_t num_operands;
  uint64_t io_offset;
  uint64_t weights_offset;
  uint64_t weights_size;
  uint64_t arena_size;       // bytes of device memory for kArena tensors
  uint32_t precision;        // Precision the builder compiled for (informational; dtypes are explicit)
  uint32_t flags;            // kFlag* bits; 0 unless the weights are external
  uint8_t reserved[16];      // 0
};
static_assert(sizeof(Header) == kHeaderSize, "Header layout");

// ExecuTorch ScalarType codes, so a tensor's dtype is the same number on both sides of the boundary.
enum class DType : uint32_t {
  kInt32 = 3,
  kInt64 = 4,
  kFloat16 = 5,
  kFloat32 = 6,
  kBool = 11,
  kBFloat16 = 15,
};

enum class Storage : uint32_t {
  kArena = 0,
  kWeight = 1,
  kInput = 2,
  kOutput = 3,
  // Program state that persists across runs (e.g. a KV cache). `offset` locates its initial value
  // in the weights section (64-byte aligned, like a weight); at init the engine copies it into a
  // device buffer of the state's own, outside the arena, that every later run reads and kIndexPut
  // writes. Records with the same offset are views of one state (all of the same size); records
  // with different offsets are different states and their initial values may not overlap.
  kState = 4,
};

enum class Precision : uint32_t { kFp32 = 0, kTf32 = 1, kFp16 = 2, kBf16 = 3 };

struct TensorRecord {
  uint32_t dtype;            // DType
  uint32_t rank;             // <= kMaxRank
  int64_t sizes[kMaxRank];   // first `rank` used, rest 0; each >= 0
  uint32_t storage;          // Storage
  uint32_t reserved;         // 0
  uint64_t offset;           // see Storage
  uint64_t nbytes;           // numel * element size
};
static_assert(sizeof(TensorRecord) == 96, "TensorRecord layout");

struct OpRecord {
  uint32_t opcode;           // Opcode
  uint32_t num_operands;
  uint64_t first_operand;    // index into the operand pool
};
static_assert(sizeof(OpRecord) == 16, "OpRecord layout");

enum class Opcode : uint32_t {
  // out[idx] = cast(x[in_offset + sum(idx_d * in_strides[d])]) written at
  // out_offset + sum(idx_d * out_strides[d]) for every idx in `sizes`. Covers permute, expand,
  // slice, select, transpose, view/reshape, clone, cat (one copy per piece), dtype conversion.
  // [t x, t out, n rank, [rank] sizes, n in_offset, [rank] in_strides, n out_offset, [rank] out_strides]
  kCopy = 1,
  // out[idx] = op(a[idx . a_strides], b[idx . b_strides]) with broadcasting expressed by 0 strides;
  // out contiguous with shape `sizes`. b == -1 means the scalar `scalar` instead of a tensor.
  // add/sub compute a + alpha * b and a - alpha * b. Floating math runs in fp32 whatever the storage
  // dtype; integer tensors use int64 math; compare and logical kinds write Bool.
  // [n kind(BinaryKind), t a, t b, t out, f alpha, f scalar, n rank, [rank] sizes, [rank] a_strides,
  //  [rank] b_strides]
  kBinary = 2,
  // out = op(x) elementwise, x and out contiguous with the same numel.
  // [n kind(UnaryKind), t x, t out, f p0, f p1]
  kUnary = 3,
  // out[idx] = cond[idx] ? a[idx] : b[idx] with broadcast strides; out contiguous.
  // [t cond, t a, t b, t out, n rank, [rank] sizes, [rank] cond_strides, [rank] a_strides,
  //  [rank] b_strides]
  kWhere = 4,
  // out[g] = epilogue(alpha * op(A[g]) @ op(B[g]) + beta * bias + residual[g]) for g in [0, batch).
  // A[g] is the M x K (K x M when trans_a) row-major matrix at a + g * a_batch_stride; B[g] the
  // K x N (N x K when trans_b) matrix at b + g * b_batch_stride (a batch stride of 0 broadcasts);
  // out is [batch, M, N] contiguous. bias == -1: none; otherwise a tensor broadcast to [M, N] with
  // strides (bias_row_stride, bias_col_stride) (e.g. (0, 1) for a per-column bias vector).
  // residual == -1: none; otherwise a contiguous tensor of out's dtype and numel (a residual
  // connection added before the activation, in fp32, so the sum is rounded once).
  // Accumulation is fp32 at every precision.
  // [t a, t b, t bias, t out, n batch, n M, n N, n K, n trans_a, n trans_b, n a_batch_stride,
  //  n b_batch_stride, n bias_row_stride, n bias_col_stride, f alpha, f beta, n epilogue(Epilogue),
  //  t residual]
  kMatmul = 5,
  // Softmax (log_softmax when is_log) over the middle axis of x viewed as [outer, dim, inner].
  // [t x, t out, n outer, n dim, n inner, n is_log]
  kSoftmax = 6,
  // Normalises each of `rows` contiguous rows of `cols` elements; weight/bias per column or -1.
  // [t x, t weight, t bias, t out, n rows, n cols, f eps]
  kLayerNorm = 7,
  // Reduces the middle axis of x viewed as [outer, reduce, inner]; out is [outer, inner].
  // [n kind(ReduceKind), t x, t out, n outer, n reduce, n inner]
  kReduce = 8,
  // out[i, :] = weight[indices[i], :]; indices Int64 or Int32, weight [vocab, dim].
  // An index outside [0, vocab) is an execution error (reported, not a crash).
  // [t weight, t indices, t out, n num_indices, n dim, n vocab]
  kEmbedding = 9,
  // out[:] = value.
  // [t out, f value]
  kFill = 10,
  // 2-D convolution, NCHW, weight [C_out, C_in / groups, kH, kW], optional bias [C_out] or -1.
  // [t x, t weight, t bias, t out, n N, n C_in, n H, n W, n C_out, n kH, n kW, n stride_h,
  //  n stride_w, n pad_h, n pad_w, n dil_h, n dil_w, n groups, n H_out, n W_out]
  kConv2d = 11,
  // 2-D pooling, NCHW. For kAvg, count_include_pad selects the divisor; ceil_mode is already
  // folded into H_out / W_out by the builder.
  // [n kind(PoolKind), t x, t out, n N, n C, n H, n W, n kH, n kW, n stride_h, n stride_w,
  //  n pad_h, n pad_w, n dil_h, n dil_w, n H_out, n W_out, n count_include_pad]
  kPool2d = 12,
  // In-place indexed row write into program state: with out viewed as [outer, dim_size, inner]
  // and values as [outer, num_positions, inner] (contiguous, same dtype),
  //   out[o, positions[i], j] = values[o, i, j]
  // for every o, i, j. out must be a kState tensor (the exception to "ops never write their
  // inputs"); positions is an Int64 or Int32 tensor of num_positions elements read on the device
  // at run time. A position outside [0, dim_size) is an execution error (reported, not a crash)
  // and then nothing of out is written. With duplicate positions any one of the rows wins.
  // [t values, t positions, t out, n outer, n dim_size, n inner, n num_positions]
  kIndexPut = 13,
  // A straight-line program of elementwise instructions evaluated per output element in one
  // kernel (what the builder makes of a chain of kUnary / kBinary / kWhere ops). out is
  // contiguous with shape `sizes`; input i (a Float32, Float16, BFloat16 or Bool tensor; Bool
  // reads as 0 / 1) is read at sum(idx_d * strides[i * rank + d]). Registers are fp32: register
  // i < num_inputs holds input i, and instruction j writes register num_inputs + j; out is the
  // last register. Instruction j is the kFusedInstrWidth integers of program[j * 8, j * 8 + 8):
  //   [n form(FusedForm), n kind, n src0, n src1, n src2, f p0, f p1, n round(DType)]
  // kUnary: op kind(UnaryKind)(src0; p0, p1). kBinary: kind(BinaryKind)(src0, src1) with alpha
  // p0, and src1 == -1 meaning the scalar p1. kWhere: src0 != 0 ? src1 : src2 (kind 0). Every
  // source is a register written before (< num_inputs + j). The result is rounded to `round`
  // (Float32, Float16 or BFloat16: the dtype the unfused op's result had), so the fused program
  // gives the same bits as the ops it replaces, then stored to out's dtype (floating). Kinds are
  // the floating ones: no compare or logical kind, no logical_not.
  // [t out, n rank, [rank] sizes, n num_inputs, t[num_inputs] inputs, [num_inputs*rank] strides,
  //  n num_instrs, [num_instrs*8] program]
  kFusedElementwise = 14,
};

inline constexpr uint32_t kMaxFusedInputs = 8;
inline constexpr uint32_t kMaxFusedInstrs = 16;
inline constexpr uint32_t kFusedInstrWidth = 8;

enum class FusedForm : int64_t { kUnary = 0, kBinary = 1, kWhere = 2 };

enum class BinaryKind : int64_t {
  kAdd = 0, kSub = 1, kMul = 2, kDiv = 3, kPow = 4, kMaximum = 5, kMinimum = 6,
  kEq = 7, kNe = 8, kLt = 9, kLe = 10, kGt = 11, kGe = 12, kLogicalAnd = 13, kLogicalOr = 14,
  kFloorDiv = 15, kRemainder = 16,
};

enum class UnaryKind : int64_t {
  kRelu = 0, kGeluErf = 1, kGeluTanh = 2, kSigmoid = 3, kTanh = 4, kSilu = 5, kExp = 6, kLog = 7,
  kCos = 8, kSin = 9, kRsqrt = 10, kSqrt = 11, kNeg = 12, kAbs = 13, kHardswish = 14,
  kHardsigmoid = 15,
  kClamp = 16,        // min(max(x, p0), p1); a missing bound is -inf / +inf
  kLogicalNot = 17,   // Bool out
  kErf = 18, kReciprocal = 19,
  kPowScalar = 20,    // x ** p0
  kLeakyRelu = 21,    // x > 0 ? x : p0 * x
  kIdentity = 22,     // plain copy / dtype cast
  kErfinv = 23,
};

enum class ReduceKind : int64_t { kSum = 0, kMean = 1, kAmax = 2, kAmin = 3, kAny = 4 };

enum class PoolKind : int64_t { kMax = 0, kAvg = 1 };

enum class Epilogue : int64_t { kNone = 0, kRelu = 1, kGeluErf = 2, kGeluTanh = 3 };

}  // namespace kiln::engine::blob
