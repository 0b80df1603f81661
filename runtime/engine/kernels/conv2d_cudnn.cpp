// kConv2d through the cuDNN frontend's graph: conv_fprop -> (+ bias) -> (+ residual) ->
// activation, one graph per op built at init with its sizes, executed with the run's pointers.
// Plain C++ (no device code): the frontend's headers are heavy, so they stay in this file and in
// attention_cudnn.cpp.
#include "runtime/engine/kernels/conv2d_cudnn.h"

#include <cudnn_frontend.h>

#include <cstdlib>
#include <cstring>
#include <exception>
#include <memory>
#include <unordered_map>

#include "format/dtype.h"
#include "format/fail.h"

namespace kiln::engine::kernels {
namespace {

namespace fe = cudnn_frontend;
using executorch::runtime::Error;
using Epilogue = blob::Epilogue;

// The graph's tensor uids.
constexpr int64_t kX = 1, kW = 2, kB = 3, kR = 4, kY = 5;

// cuDNN's fused convolution engines read NHWC operands with 16-byte vector loads.
constexpr uint32_t kAlignment = 16;

bool enabled() {
  const char* env = std::getenv("KILN_CONV");
  return env == nullptr || env[0] == '\0' || std::strcmp(env, "auto") == 0 ||
         std::strcmp(env, "fused") == 0;
}

fe::DataType_t fe_type(blob::DType dtype) {
  switch (dtype) {
    case blob::DType::kBFloat16: return fe::DataType_t::BFLOAT16;
    case blob::DType::kFloat16: return fe::DataType_t::HALF;
    default: return fe::DataType_t::FLOAT;
  }
}

// NHWC strides of a logical [N, C, H, W] tensor.
std::vector<int64_t> nhwc(int64_t c, int64_t h, int64_t w) { return {h * w * c, 1, w * c, c}; }

class CudnnFusedConvStep final : public Step {
 public:
  CudnnFusedConvStep(const Conv2dArgs& a, std::shared_ptr<fe::graph::Graph> graph,
                     size_t workspace)
      : a_(a), graph_(std::move(graph)), workspace_(workspace) {}

  Error enqueue(const RunContext& ctx) override {
    const cudnnStatus_t s = cudnnSetStream(ctx.cudnn, ctx.stream);
    if (s != CUDNN_STATUS_SUCCESS) {
      return fail(nullptr, Error::Internal, "Kiln engine: op %zu (conv2d): cudnnSetStream: %s",
                  ctx.op_index, cudnnGetErrorString(s));
    }
    std::unordered_map<int64_t, void*> pack{
        {kX, ctx.ptr(a_.x)}, {kW, ctx.ptr(a_.weight)}, {kY, ctx.ptr(a_.out)}};
    if (a_.bias != kNoTensor) pack[kB] = ctx.ptr(a_.bias);
    if (a_.residual != kNoTensor) pack[kR] = ctx.ptr(a_.residual);
    try {
      fe::error_t e = graph_->execute(ctx.cudnn, pack, ctx.workspace);
      if (e.is_bad()) {
        return fail(nullptr, Error::Internal,
                    "Kiln engine: op %zu (conv2d): cuDNN's fused convolution failed: %s",
                    ctx.op_index, e.get_message().c_str());
      }
    } catch (const std::exception& ex) {
      return fail(nullptr, Error::Internal,
                  "Kiln engine: op %zu (conv2d): cuDNN's fused convolution failed: %s",
                  ctx.op_index, ex.what());
    }
    return Error::Ok;
  }

  size_t workspace_bytes() const override { return workspace_; }

 private:
  Conv2dArgs a_;
  std::shared_ptr<fe::graph::Graph> graph_;
  size_t workspace_;
};

// The activation node for `e`, or false when the graph has none for it.
bool activation(Epilogue e, fe::graph::Pointwise_attributes* p) {
  switch (e) {
    case Epilogue::kRelu: p->set_mode(fe::PointwiseMode_t::RELU_FWD); return true;
    case Epilogue::kRelu6:
      p->set_mode(fe::PointwiseMode_t::RELU_FWD).set_relu_upper_clip(6.0f);
      return true;
    case Epilogue::kSilu: p->set_mode(fe::PointwiseMode_t::SWISH_FWD).set_swish_beta(1.0f); return true;
    case Epilogue::kGeluErf: p->set_mode(fe::PointwiseMode_t::GELU_FWD); return true;
    case Epilogue::kGeluTanh: p->set_mode(fe::PointwiseMode_t::GELU_APPROX_TANH_FWD); return true;
    default: return false;
  }
}

}  // namespace

const char* cudnn_fused_conv_unsupported(const Conv2dArgs& a, const Graph& graph) {
  if (!enabled()) return "KILN_CONV selects the legacy path";
  if (!a.channels_last) return "NCHW (the fused engines take NHWC)";
  const blob::DType dtype = graph.tensors[a.x].dtype;
  if (dtype == blob::DType::kFloat32 && graph.precision != blob::Precision::kTf32) {
    return "strict fp32 (the fused engines use tensor cores)";
  }
  if (a.epilogue == Epilogue::kHardswish) return "hardswish (no such pointwise node)";
  if (a.n * a.c_in * a.h * a.w * a.c_out * a.h_out * a.w_out == 0) return "an empty operand";
  if (a.groups != 1) return "a grouped convolution";
  return nullptr;
}

StepResult make_cudnn_fused_conv_step(const Conv2dArgs& a, const InitContext& ctx) {
  const Graph& g = ctx.graph;
  const blob::DType dtype = g.tensors[a.x].dtype;
  uint32_t align = std::min({ctx.alignment[a.x], ctx.alignment[a.weight], ctx.alignment[a.out]});
  if (a.residual != kNoTensor) align = std::min(align, ctx.alignment[a.residual]);
  if (ctx.cudnn == nullptr || align < kAlignment) {
    ET_LOG(Info, "Kiln engine: op %zu (conv2d): operands %u-byte aligned; the legacy path runs it",
           ctx.op_index, align);
    return Error::NotSupported;
  }
  auto graph = std::make_shared<fe::graph::Graph>();
  size_t workspace = 0;
  try {
    const fe::DataType_t io = fe_type(dtype);
    graph->set_io_data_type(io)
        .set_intermediate_data_type(fe::DataType_t::FLOAT)
        .set_compute_data_type(fe::DataType_t::FLOAT);
    const int64_t cg = a.c_in / a.groups;
    auto x = graph->tensor(fe::graph::Tensor_attributes()
                               .set_name("x")
                               .set_uid(kX)
                               .set_dim({a.n, a.c_in, a.h, a.w})
                               .set_stride(nhwc(a.c_in, a.h, a.w)));
    auto w = graph->tensor(fe::graph::Tensor_attributes()
                               .set_name("w")
                               .set_uid(kW)
                               .set_dim({a.c_out, cg, a.kh, a.kw})
                               .set_stride(nhwc(cg, a.kh, a.kw)));
    auto y = graph->conv_fprop(x, w,
                               fe::graph::Conv_fprop_attributes()
                                   .set_name("conv")
                                   .set_padding({a.pad_h, a.pad_w})
                                   .set_stride({a.stride_h, a.stride_w})
                                   .set_dilation({a.dil_h, a.dil_w}));
    if (a.bias != kNoTensor) {
      auto b = graph->tensor(fe::graph::Tensor_attributes()
                                 .set_name("bias")
                                 .set_uid(kB)
                                 .set_dim({1, a.c_out, 1, 1})
                                 .set_stride({a.c_out, 1, a.c_out, a.c_out})
                                 .set_data_type(fe_type(g.tensors[a.bias].dtype)));
      y = graph->pointwise(y, b, fe::graph::Pointwise_attributes().set_name("bias").set_mode(
                                     fe::PointwiseMode_t::ADD));
    }
    if (a.residual != kNoTensor) {
      auto r = graph->tensor(fe::graph::Tensor_attributes()
                                 .set_name("residual")
                                 .set_uid(kR)
                                 .set_dim({a.n, a.c_out, a.h_out, a.w_out})
                                 .set_stride(nhwc(a.c_out, a.h_out, a.w_out)));
      y = graph->pointwise(y, r, fe::graph::Pointwise_attributes().set_name("residual").set_mode(
                                     fe::PointwiseMode_t::ADD));
    }
    fe::graph::Pointwise_attributes act;
    if (activation(a.epilogue, &act)) y = graph->pointwise(y, act.set_name("activation"));
    y->set_output(true)
        .set_uid(kY)
        .set_dim({a.n, a.c_out, a.h_out, a.w_out})
        .set_stride(nhwc(a.c_out, a.h_out, a.w_out))
        .set_data_type(io);
    fe::error_t built = graph->build(ctx.cudnn, {fe::HeurMode_t::A});
    if (built.is_bad()) {
      ET_LOG(Info,
             "Kiln engine: op %zu (conv2d): cuDNN %zu has no fused plan for it (%s); the legacy "
             "path runs it",
             ctx.op_index, cudnnGetVersion(), built.get_message().c_str());
      return Error::NotSupported;
    }
    int64_t bytes = 0;
    fe::error_t sized = graph->get_workspace_size(bytes);
    if (sized.is_bad() || bytes < 0) {
      return fail(nullptr, Error::Internal,
                  "Kiln engine: op %zu (conv2d): cuDNN's workspace size: %s", ctx.op_index,
                  sized.get_message().c_str());
    }
    workspace = static_cast<size_t>(bytes);
  } catch (const std::exception& ex) {
    ET_LOG(Info, "Kiln engine: op %zu (conv2d): building cuDNN's fused convolution failed (%s); "
           "the legacy path runs it", ctx.op_index, ex.what());
    return Error::NotSupported;
  }
  return std::unique_ptr<Step>(new CudnnFusedConvStep(a, std::move(graph), workspace));
}

}  // namespace kiln::engine::kernels
