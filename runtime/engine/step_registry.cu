// The step registry: each opcode's Step comes from its kernel family's factory (kernels/*.cuh).
// A new opcode adds its case here.
#include <variant>

#include "runtime/engine/cuda_engine.h"
#include "runtime/engine/fail.h"
#include "runtime/engine/kernels/conv2d.cuh"
#include "runtime/engine/kernels/copy.cuh"
#include "runtime/engine/kernels/elementwise.cuh"
#include "runtime/engine/kernels/embedding.cuh"
#include "runtime/engine/kernels/fill.cuh"
#include "runtime/engine/kernels/index_put.cuh"
#include "runtime/engine/kernels/layer_norm.cuh"
#include "runtime/engine/kernels/matmul.cuh"
#include "runtime/engine/kernels/pool2d.cuh"
#include "runtime/engine/kernels/reduce.cuh"
#include "runtime/engine/kernels/softmax.cuh"
#include "runtime/engine/step.h"

namespace kiln::engine {

using executorch::runtime::Error;

StepResult make_step(const Op& op, const InitContext& ctx) {
  switch (op.opcode) {
    case blob::Opcode::kCopy: return kernels::make_copy_step(std::get<CopyArgs>(op.args), ctx);
    case blob::Opcode::kBinary:
      return kernels::make_binary_step(std::get<BinaryArgs>(op.args), ctx);
    case blob::Opcode::kUnary: return kernels::make_unary_step(std::get<UnaryArgs>(op.args), ctx);
    case blob::Opcode::kWhere: return kernels::make_where_step(std::get<WhereArgs>(op.args), ctx);
    case blob::Opcode::kMatmul:
      return kernels::make_matmul_step(std::get<MatmulArgs>(op.args), ctx);
    case blob::Opcode::kSoftmax:
      return kernels::make_softmax_step(std::get<SoftmaxArgs>(op.args), ctx);
    case blob::Opcode::kLayerNorm:
      return kernels::make_layer_norm_step(std::get<LayerNormArgs>(op.args), ctx);
    case blob::Opcode::kReduce:
      return kernels::make_reduce_step(std::get<ReduceArgs>(op.args), ctx);
    case blob::Opcode::kEmbedding:
      return kernels::make_embedding_step(std::get<EmbeddingArgs>(op.args), ctx);
    case blob::Opcode::kFill: return kernels::make_fill_step(std::get<FillArgs>(op.args), ctx);
    case blob::Opcode::kConv2d:
      return kernels::make_conv2d_step(std::get<Conv2dArgs>(op.args), ctx);
    case blob::Opcode::kPool2d:
      return kernels::make_pool2d_step(std::get<Pool2dArgs>(op.args), ctx);
    case blob::Opcode::kIndexPut:
      return kernels::make_index_put_step(std::get<IndexPutArgs>(op.args), ctx);
    case blob::Opcode::kFusedElementwise:
      return kernels::make_fused_elementwise_step(std::get<FusedElementwiseArgs>(op.args), ctx);
  }
  return fail(nullptr, Error::InvalidProgram, "Kiln engine: op %zu has unknown opcode %u",
              ctx.op_index, static_cast<unsigned>(op.opcode));
}

}  // namespace kiln::engine
