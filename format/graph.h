// The engine's in-memory form of a validated blob: tensors with typed fields and every op's
// operands decoded into a struct per opcode. read_blob (blob_reader.h) is the only producer; once
// a Graph exists, every tensor id in it is valid and every strided access it describes stays
// inside its tensor, so the executor and the kernels do not re-check.
#pragma once

#include <cstddef>
#include <cstdint>
#include <variant>
#include <vector>

#include "format/blob_format.h"

namespace kiln::engine {

/// The tensor id operands use for "no tensor" (an optional bias, a scalar instead of `b`).
inline constexpr int64_t kNoTensor = -1;

struct Tensor {
  blob::DType dtype;
  uint32_t rank;
  int64_t sizes[blob::kMaxRank];
  blob::Storage storage;
  uint64_t offset;  // see blob::Storage
  uint64_t nbytes;
  int64_t numel;
};

// One struct per opcode; the fields follow the operand layouts in blob_format.h, in order. Tensor
// ids are int64_t so that kNoTensor fits; strides and offsets are in elements.

struct CopyArgs {
  int64_t x, out;
  uint32_t rank;
  int64_t sizes[blob::kMaxRank];
  int64_t in_offset;
  int64_t in_strides[blob::kMaxRank];
  int64_t out_offset;
  int64_t out_strides[blob::kMaxRank];
};

struct BinaryArgs {
  blob::BinaryKind kind;
  int64_t a, b, out;  // b may be kNoTensor: `scalar` instead
  double alpha, scalar;
  uint32_t rank;
  int64_t sizes[blob::kMaxRank];
  int64_t a_strides[blob::kMaxRank];
  int64_t b_strides[blob::kMaxRank];
};

struct UnaryArgs {
  blob::UnaryKind kind;
  int64_t x, out;
  double p0, p1;
};

struct WhereArgs {
  int64_t cond, a, b, out;
  uint32_t rank;
  int64_t sizes[blob::kMaxRank];
  int64_t cond_strides[blob::kMaxRank];
  int64_t a_strides[blob::kMaxRank];
  int64_t b_strides[blob::kMaxRank];
};

struct MatmulArgs {
  int64_t a, b, bias, out;  // bias may be kNoTensor
  int64_t batch, m, n, k;
  bool trans_a, trans_b;
  int64_t a_batch_stride, b_batch_stride;
  int64_t bias_row_stride, bias_col_stride;
  double alpha, beta;
  blob::Epilogue epilogue;
  int64_t residual;  // kNoTensor, or out's dtype and numel, added before the epilogue
};

struct SoftmaxArgs {
  int64_t x, out;
  int64_t outer, dim, inner;
  bool is_log;
};

struct LayerNormArgs {
  int64_t x, weight, bias, out;  // weight and bias may be kNoTensor
  int64_t rows, cols;
  double eps;
};

struct ReduceArgs {
  blob::ReduceKind kind;
  int64_t x, out;
  int64_t outer, reduce, inner;
};

struct EmbeddingArgs {
  int64_t weight, indices, out;
  int64_t num_indices, dim, vocab;
};

struct FillArgs {
  int64_t out;
  double value;
};

struct Conv2dArgs {
  int64_t x, weight, bias, out;  // bias may be kNoTensor
  int64_t n, c_in, h, w, c_out, kh, kw;
  int64_t stride_h, stride_w, pad_h, pad_w, dil_h, dil_w;
  int64_t groups, h_out, w_out;
};

struct Pool2dArgs {
  blob::PoolKind kind;
  int64_t x, out;
  int64_t n, c, h, w, kh, kw;
  int64_t stride_h, stride_w, pad_h, pad_w, dil_h, dil_w;
  int64_t h_out, w_out;
  bool count_include_pad;
};

struct IndexPutArgs {
  int64_t values, positions, out;  // out is a kState tensor, written in place
  int64_t outer, dim_size, inner, num_positions;
};

struct FusedInstr {
  blob::FusedForm form;
  int64_t kind;    // UnaryKind or BinaryKind (0 for kWhere)
  int32_t src[3];  // registers; src[1] == -1: a binary's scalar p1; unused sources are -1
  double p0, p1;
  blob::DType round;  // Float32, Float16 or BFloat16
};

struct FusedElementwiseArgs {
  int64_t out;
  uint32_t rank;
  int64_t sizes[blob::kMaxRank];
  uint32_t num_inputs;
  int64_t inputs[blob::kMaxFusedInputs];
  int64_t strides[blob::kMaxFusedInputs][blob::kMaxRank];
  uint32_t num_instrs;
  FusedInstr instrs[blob::kMaxFusedInstrs];
};

using OpArgs =
    std::variant<CopyArgs, BinaryArgs, UnaryArgs, WhereArgs, MatmulArgs, SoftmaxArgs, LayerNormArgs,
                 ReduceArgs, EmbeddingArgs, FillArgs, Conv2dArgs, Pool2dArgs, IndexPutArgs,
                 FusedElementwiseArgs>;

struct Op {
  blob::Opcode opcode;
  OpArgs args;
};

struct Graph {
  std::vector<Tensor> tensors;
  std::vector<Op> ops;
  std::vector<int64_t> inputs;   // tensor id of each delegate input
  std::vector<int64_t> outputs;  // tensor id of each delegate output
  uint64_t arena_size = 0;
  blob::Precision precision = blob::Precision::kFp32;
  /// The weights section. Borrowed: it points into the buffer given to read_blob and is valid only
  /// as long as that buffer (Engine::create uploads it before returning and then clears it).
  const uint8_t* weights = nullptr;
  uint64_t weights_size = 0;
};

/// Bytes per element of a known dtype (Bool is one byte).
size_t element_size(blob::DType dtype);
bool is_floating(blob::DType dtype);
const char* dtype_name(blob::DType dtype);
const char* storage_name(blob::Storage storage);
const char* opcode_name(blob::Opcode opcode);

}  // namespace kiln::engine
