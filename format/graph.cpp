#include "format/graph.h"

namespace kiln::engine {

size_t element_size(blob::DType dtype) {
  switch (dtype) {
    case blob::DType::kBool: return 1;
    case blob::DType::kFloat16:
    case blob::DType::kBFloat16: return 2;
    case blob::DType::kInt32:
    case blob::DType::kFloat32: return 4;
    case blob::DType::kInt64: return 8;
  }
  return 0;
}

bool is_floating(blob::DType dtype) {
  return dtype == blob::DType::kFloat32 || dtype == blob::DType::kFloat16 ||
         dtype == blob::DType::kBFloat16;
}

const char* dtype_name(blob::DType dtype) {
  switch (dtype) {
    case blob::DType::kInt32: return "Int32";
    case blob::DType::kInt64: return "Int64";
    case blob::DType::kFloat16: return "Float16";
    case blob::DType::kFloat32: return "Float32";
    case blob::DType::kBool: return "Bool";
    case blob::DType::kBFloat16: return "BFloat16";
  }
  return "unknown dtype";
}

const char* storage_name(blob::Storage storage) {
  switch (storage) {
    case blob::Storage::kArena: return "Arena";
    case blob::Storage::kWeight: return "Weight";
    case blob::Storage::kInput: return "Input";
    case blob::Storage::kOutput: return "Output";
    case blob::Storage::kState: return "State";
  }
  return "unknown";
}

const char* opcode_name(blob::Opcode opcode) {
  switch (opcode) {
    case blob::Opcode::kCopy: return "copy";
    case blob::Opcode::kBinary: return "binary";
    case blob::Opcode::kUnary: return "unary";
    case blob::Opcode::kWhere: return "where";
    case blob::Opcode::kMatmul: return "matmul";
    case blob::Opcode::kSoftmax: return "softmax";
    case blob::Opcode::kLayerNorm: return "layer_norm";
    case blob::Opcode::kReduce: return "reduce";
    case blob::Opcode::kEmbedding: return "embedding";
    case blob::Opcode::kFill: return "fill";
    case blob::Opcode::kConv2d: return "conv2d";
    case blob::Opcode::kPool2d: return "pool2d";
    case blob::Opcode::kIndexPut: return "index_put";
    case blob::Opcode::kFusedElementwise: return "fused_elementwise";
  }
  return "unknown opcode";
}

}  // namespace kiln::engine
