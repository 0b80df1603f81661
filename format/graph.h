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
#include "format/dtype.h"
#include "format/op_table.h"

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

// One struct per opcode, generated from the op table (op_table.def): one member per operand field,
// in order, named as the kernels read it (a.x, a.out, a.sizes). Tensor ids are int64_t so that
// kNoTensor fits (an optional input may hold it); integers have the type the table gives;
// strides and offsets are in elements; a list of `rank` integers is an array of kMaxRank. An op
// whose table row says `custom` has its struct written here by hand.

#define KILN_ARGS_T(member, wire, role) int64_t member;
#define KILN_ARGS_I(type, member, wire, lo, hi) type member;
#define KILN_ARGS_E(Enum, member, wire) blob::Enum member;
#define KILN_ARGS_R(member, wire) double member;
#define KILN_ARGS_L(member, wire, count, lo)                                               \
  static_assert(blob::same_name(count, "rank"), "a generated Args struct holds only lists " \
                                                "of `rank` integers; make the op custom"); \
  int64_t member[blob::kMaxRank];
#define KILN_ARGS_TL(member, wire, count, role) \
  static_assert(sizeof(wire) == 0,                       \
                "a generated Args struct has no tensor lists; make the op custom");
#define KILN_ARGS_STRUCT_table(Name)                                                        \
  struct Name##Args {                                                                       \
    KILN_FIELDS_##Name(KILN_ARGS_T, KILN_ARGS_I, KILN_ARGS_E, KILN_ARGS_R, KILN_ARGS_L,     \
                       KILN_ARGS_TL)                                                        \
  };
#define KILN_ARGS_STRUCT_custom(Name)
#define KILN_ARGS_STRUCT(Name, code, snake, args) KILN_ARGS_STRUCT_##args(Name)
KILN_OPCODES(KILN_ARGS_STRUCT)
#undef KILN_ARGS_STRUCT
#undef KILN_ARGS_STRUCT_custom
#undef KILN_ARGS_STRUCT_table
#undef KILN_ARGS_T
#undef KILN_ARGS_I
#undef KILN_ARGS_E
#undef KILN_ARGS_R
#undef KILN_ARGS_L
#undef KILN_ARGS_TL

// kFusedElementwise (custom): its lists become per-input arrays and decoded instructions.
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

// kScatter (custom): per-index arrays from its index lists.
struct ScatterArgs {
  int64_t values;
  int64_t out;
  uint32_t rank;
  int64_t sizes[blob::kMaxRank];
  int64_t out_strides[blob::kMaxRank];
  int64_t values_strides[blob::kMaxRank];
  uint32_t num_indices;
  int64_t indices[blob::kMaxScatterIndices];
  int64_t index_strides[blob::kMaxScatterIndices][blob::kMaxRank];
  int64_t index_out_strides[blob::kMaxScatterIndices];
  int64_t dim_sizes[blob::kMaxScatterIndices];
  uint32_t accumulate;
};

template <typename Ignored, typename... Args>
using VariantOfArgs = std::variant<Args...>;
#define KILN_ARGS_TYPE(Name, code, snake, args) , Name##Args
/// Every opcode's Args struct, in table order.
using OpArgs = VariantOfArgs<void KILN_OPCODES(KILN_ARGS_TYPE)>;
#undef KILN_ARGS_TYPE

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

}  // namespace kiln::engine
