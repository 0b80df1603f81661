// The Kiln engine blob, format version 4: what the AOT builder writes into the .pte and what
// KilnBackend::init reads. This header and the op table (op_table.def: every enum, opcode and
// operand layout) are the single definition of the format; the C++ builder (builder/) writes it
// from here, and the Python mirror (python/kiln_executorch/aot/blob_format.py) is built from the
// builder's kiln_builder_format_description(), the same definition as JSON.
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
//   tensors in a device buffer of their own (see TensorRecord).
// - Ops run in order. Each op reads operands[first_operand, first_operand + num_operands). Operand
//   layouts per opcode are the KILN_FIELDS_<Name> lists of op_table.def: a tensor id, an integer,
//   a double stored as its IEEE-754 bit pattern in the int64 slot, or a list of consecutive slots.
// - Strides and offsets in operands are in elements of the tensor they describe.
// - Every op writes only its output tensor(s), never one of its inputs (the builder inserts copies).
//   The one exception is program state: kIndexPut writes rows of a kState tensor in place, and
//   other ops read that tensor before or after it in op order. Ops are therefore not pure: a run
//   reads what the previous run left in its state tensors, and replaying the ops (a CUDA graph)
//   must keep their order. No other opcode writes a kState tensor.
#pragma once

#include <cstdint>

#include "format/op_table.def"

namespace kiln::engine::blob {

inline constexpr char kMagic[8] = {'K', 'I', 'L', 'N', 'B', 'L', 'O', 'B'};
inline constexpr uint32_t kFormatVersion = 4;  // 2: kMatmul's residual; 3: kConv2d's epilogue,
                                               // residual and layout, kPool2d's layout,
                                               // kLayerNorm's rms; 4: kAttention's out strides
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

// TensorRecord::storage is a Storage (op_table.def). kState is program state that persists across
// runs (e.g. a KV cache): `offset` locates its initial value in the weights section (64-byte
// aligned, like a weight); at init the engine copies it into a device buffer of the state's own,
// outside the arena, that every later run reads and kIndexPut writes. Records with the same offset
// are views of one state (all of the same size); records with different offsets are different
// states and their initial values may not overlap.
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

// The enums, generated from the op table (op_table.def): DType, Storage, Precision, Opcode and
// the kinds ops carry, with k<Name> enumerators (op_table.h adds their counts and names).
#define KILN_ENUMERATOR(Name, value, ...) k##Name = value,

enum class DType : uint32_t { KILN_DTYPES(KILN_ENUMERATOR) };

#define KILN_DECLARE_ENUM(Enum, Type, operand_kind) \
  enum class Enum : Type { KILN_ENUM_##Enum(KILN_ENUMERATOR) };
KILN_ENUMS(KILN_DECLARE_ENUM)
#undef KILN_DECLARE_ENUM

enum class Opcode : uint32_t { KILN_OPCODES(KILN_ENUMERATOR) };

#undef KILN_ENUMERATOR

inline constexpr uint32_t kMaxFusedInputs = 8;
inline constexpr uint32_t kMaxFusedInstrs = 16;
inline constexpr uint32_t kFusedInstrWidth = 8;
/// The most index tensors one kScatter reads (index_put's advanced indices).
inline constexpr uint32_t kMaxScatterIndices = 4;

}  // namespace kiln::engine::blob
