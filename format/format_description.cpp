#include "format/format_description.h"

#include <cstddef>
#include <string>

#include "format/blob_format.h"
#include "format/dtype.h"
#include "format/op_table.h"
#include "format/state_keys.h"
#include "format/variant_set.h"

namespace kiln::engine::blob {
namespace {

std::string quoted(const char* s) { return std::string("\"") + s + "\""; }

std::string number(int64_t v, int64_t unbounded) {
  return v == unbounded ? "null" : std::to_string(v);
}

const char* kind_name(FieldKind k) {
  switch (k) {
    case FieldKind::kTensor: return "tensor";
    case FieldKind::kInt: return "int";
    case FieldKind::kEnum: return "enum";
    case FieldKind::kReal: return "double";
    case FieldKind::kList: return "int_list";
    case FieldKind::kTensorList: return "tensor_list";
  }
  return "?";
}

const char* role_name(Role r) {
  switch (r) {
    case Role::kNone: return "none";
    case Role::kInput: return "input";
    case Role::kOptionalInput: return "optional_input";
    case Role::kOutput: return "output";
    case Role::kStateOutput: return "state_output";
  }
  return "?";
}

std::string field_json(const FieldDesc& f) {
  std::string j = "{\"name\": " + quoted(f.name) + ", \"kind\": " + quoted(kind_name(f.kind));
  switch (f.kind) {
    case FieldKind::kTensor:
    case FieldKind::kTensorList: j += ", \"role\": " + quoted(role_name(f.role)); break;
    case FieldKind::kInt:
      j += ", \"min\": " + number(f.min, kAnyInt) + ", \"max\": " + number(f.max, kMaxInt);
      break;
    case FieldKind::kEnum: j += ", \"enum\": " + quoted(f.enum_name); break;
    case FieldKind::kList: j += ", \"min\": " + number(f.min, kAnyInt); break;
    case FieldKind::kReal: break;
  }
  if (f.count != nullptr) j += ", \"count\": " + quoted(f.count);
  return j + "}";
}

template <typename Enum>
std::string enum_json() {
  std::string j = quoted(EnumInfo<Enum>::name) + ": [";
  bool first = true;
  for (const EnumEntry& e : EnumInfo<Enum>::entries) {
    j += std::string(first ? "" : ", ") + "[" + quoted(e.name) + ", " + std::to_string(e.value) +
         "]";
    first = false;
  }
  return j + "]";
}

// [[name, offset, size], ...] for one record struct.
#define KILN_MEMBER(Struct, m)                                           \
  "[" + quoted(#m) + ", " + std::to_string(offsetof(Struct, m)) + ", " + \
      std::to_string(sizeof(Struct::m)) + "]"

std::string records_json() {
  std::string j = "{";
  j += "\"Header\": [" KILN_MEMBER(Header, magic) + ", " + KILN_MEMBER(Header, format_version) +
       ", " + KILN_MEMBER(Header, header_size) + ", " + KILN_MEMBER(Header, blob_size) + ", " +
       KILN_MEMBER(Header, num_tensors) + ", " + KILN_MEMBER(Header, num_ops) + ", " +
       KILN_MEMBER(Header, num_inputs) + ", " + KILN_MEMBER(Header, num_outputs) + ", " +
       KILN_MEMBER(Header, tensors_offset) + ", " + KILN_MEMBER(Header, ops_offset) + ", " +
       KILN_MEMBER(Header, operands_offset) + ", " + KILN_MEMBER(Header, num_operands) + ", " +
       KILN_MEMBER(Header, io_offset) + ", " + KILN_MEMBER(Header, weights_offset) + ", " +
       KILN_MEMBER(Header, weights_size) + ", " + KILN_MEMBER(Header, arena_size) + ", " +
       KILN_MEMBER(Header, precision) + ", " + KILN_MEMBER(Header, flags) + ", " +
       KILN_MEMBER(Header, reserved) + "], ";
  j += "\"TensorRecord\": [" KILN_MEMBER(TensorRecord, dtype) + ", " +
       KILN_MEMBER(TensorRecord, rank) + ", " + KILN_MEMBER(TensorRecord, sizes) + ", " +
       KILN_MEMBER(TensorRecord, storage) + ", " + KILN_MEMBER(TensorRecord, reserved) + ", " +
       KILN_MEMBER(TensorRecord, offset) + ", " + KILN_MEMBER(TensorRecord, nbytes) + "], ";
  j += "\"OpRecord\": [" KILN_MEMBER(OpRecord, opcode) + ", " +
       KILN_MEMBER(OpRecord, num_operands) + ", " + KILN_MEMBER(OpRecord, first_operand) + "], ";
  using vset::InputShape;
  using vset::VariantRecord;
  using vset::VariantSetHeader;
  j += "\"VariantSetHeader\": [" KILN_MEMBER(VariantSetHeader, magic) + ", " +
       KILN_MEMBER(VariantSetHeader, format_version) + ", " +
       KILN_MEMBER(VariantSetHeader, header_size) + ", " +
       KILN_MEMBER(VariantSetHeader, container_size) + ", " +
       KILN_MEMBER(VariantSetHeader, num_variants) + ", " +
       KILN_MEMBER(VariantSetHeader, num_inputs) + ", " +
       KILN_MEMBER(VariantSetHeader, variants_offset) + ", " +
       KILN_MEMBER(VariantSetHeader, shapes_offset) + ", " +
       KILN_MEMBER(VariantSetHeader, weights_offset) + ", " +
       KILN_MEMBER(VariantSetHeader, weights_size) + "], ";
  j += "\"VariantRecord\": [" KILN_MEMBER(VariantRecord, blob_offset) + ", " +
       KILN_MEMBER(VariantRecord, blob_size) + "], ";
  j += "\"InputShape\": [" KILN_MEMBER(InputShape, rank) + ", " +
       KILN_MEMBER(InputShape, reserved) + ", " + KILN_MEMBER(InputShape, sizes) + "]";
  return j + "}";
}
#undef KILN_MEMBER

std::string build() {
  std::string j = "{";
  j += "\"magic\": " + quoted(std::string(kMagic, sizeof(kMagic)).c_str());
  j += ", \"format_version\": " + std::to_string(kFormatVersion);
  j += ", \"header_size\": " + std::to_string(kHeaderSize);
  j += ", \"max_rank\": " + std::to_string(kMaxRank);
  j += ", \"weight_alignment\": " + std::to_string(kWeightAlignment);
  j += ", \"flag_external_weights\": " + std::to_string(kFlagExternalWeights);
  j += ", \"max_fused_inputs\": " + std::to_string(kMaxFusedInputs);
  j += ", \"max_fused_instrs\": " + std::to_string(kMaxFusedInstrs);
  j += ", \"fused_instr_width\": " + std::to_string(kFusedInstrWidth);
  j += ", \"max_scatter_indices\": " + std::to_string(kMaxScatterIndices);
  j +=
      ", \"vset\": {\"magic\": " + quoted(std::string(vset::kMagic, sizeof(vset::kMagic)).c_str()) +
      ", \"format_version\": " + std::to_string(vset::kFormatVersion) +
      ", \"header_size\": " + std::to_string(vset::kHeaderSize) +
      ", \"max_variants\": " + std::to_string(vset::kMaxVariants) +
      ", \"max_inputs\": " + std::to_string(vset::kMaxInputs) +
      ", \"blob_alignment\": " + std::to_string(vset::kBlobAlignment) + "}";
  j += ", \"skeys\": {\"magic\": " +
       quoted(std::string(skeys::kMagic, sizeof(skeys::kMagic)).c_str()) +
       ", \"format_version\": " + std::to_string(skeys::kFormatVersion) +
       ", \"header_size\": " + std::to_string(skeys::kHeaderSize) +
       ", \"max_states\": " + std::to_string(skeys::kMaxStates) +
       ", \"max_key_length\": " + std::to_string(skeys::kMaxKeyLength) +
       ", \"payload_alignment\": " + std::to_string(skeys::kPayloadAlignment) + "}";
  j += ", \"dtypes\": [";
#define KILN_DTYPE_JSON(Name, value, display, size, floating)                                    \
  j += std::string(DType::k##Name == DType::kInt32 ? "" : ", ") + "[" + quoted(display) + ", " + \
       std::to_string(value) + ", " + std::to_string(size) + ", " +                              \
       (floating ? "true" : "false") + "]";
  KILN_DTYPES(KILN_DTYPE_JSON)
#undef KILN_DTYPE_JSON
  j += "], \"enums\": {";
#define KILN_ENUM_JSON(Enum, Type, operand_kind) \
  j += std::string(j.back() == '{' ? "" : ", ") + enum_json<Enum>();
  KILN_ENUMS(KILN_ENUM_JSON)
#undef KILN_ENUM_JSON
  j += "}, \"opcodes\": [";
  for (size_t i = 0; i < kNumOpcodes; ++i) {
    const OpDesc& op = kOps[i];
    j += std::string(i == 0 ? "" : ", ") + "{\"name\": " + quoted(op.name) +
         ", \"value\": " + std::to_string(uint32_t(op.opcode)) + ", \"fields\": [";
    for (size_t f = 0; f < op.num_fields; ++f) {
      j += std::string(f == 0 ? "" : ", ") + field_json(op.fields[f]);
    }
    j += "]}";
  }
  j += "], \"records\": " + records_json();
  return j + "}";
}

}  // namespace

const char* format_description_json() {
  static const std::string json = build();
  return json.c_str();
}

}  // namespace kiln::engine::blob
