// Running a built cuDNN frontend graph on the run's stream, for the steps that hold one
// (attention_cudnn.cpp, conv2d_cudnn.cpp): cuDNN's status or the frontend's exception becomes an
// ExecuTorch Error with a log line naming the op. Include after <cudnn_frontend.h>.
#pragma once

#include <exception>
#include <unordered_map>

#include "format/fail.h"
#include "runtime/engine/cuda_check.h"
#include "runtime/engine/step.h"

namespace kiln::engine::kernels {

inline executorch::runtime::Error execute_cudnn_graph(
    cudnn_frontend::graph::Graph& graph, std::unordered_map<int64_t, void*>& pack,
    const RunContext& ctx, const char* op, const char* what) {
  using executorch::runtime::Error;
  const cudnnStatus_t s = cudnnSetStream(ctx.cudnn, ctx.stream);
  if (s != CUDNN_STATUS_SUCCESS) {
    return fail(nullptr, Error::Internal, "Kiln engine: op %zu (%s): cudnnSetStream: %s",
                ctx.op_index, op, cudnnGetErrorString(s));
  }
  try {
    cudnn_frontend::error_t e = graph.execute(ctx.cudnn, pack, ctx.workspace);
    if (e.is_bad()) {
      return fail(nullptr, Error::Internal, "Kiln engine: op %zu (%s): %s failed: %s",
                  ctx.op_index, op, what, e.get_message().c_str());
    }
  } catch (const std::exception& ex) {
    return fail(nullptr, Error::Internal, "Kiln engine: op %zu (%s): %s failed: %s",
                ctx.op_index, op, what, ex.what());
  }
  return Error::Ok;
}

}  // namespace kiln::engine::kernels
