// kConv2d through the cuDNN frontend's graph: conv_fprop -> (+ bias) -> (+ residual) ->
// activation, one graph per op built at init with its sizes, executed with the run's pointers.
// Plain C++ (no device code): the frontend's headers are heavy, so they stay in this file and in
// attention_cudnn.cpp.
#include "runtime/engine/kernels/conv2d_cudnn.h"

#include <cudnn_frontend.h>

#include <exception>
#include <memory>
#include <string>
#include <unordered_map>

#include "format/dtype.h"
#include "format/fail.h"
#include "runtime/engine/kernels/cudnn_graph.h"
#include "runtime/engine/kernels/conv2d.cuh"
#include "runtime/engine/env_switch.h"

namespace kiln::engine::kernels {
namespace {

namespace fe = cudnn_frontend;
using executorch::runtime::Error;
using Epilogue = blob::Epilogue;

// The graph's tensor uids.
constexpr int64_t kX = 1, kW = 2, kB = 3, kR = 4, kY = 5;

// cuDNN's fused convolution engines read NHWC operands with 16-byte vector loads.
constexpr uint32_t kAlignment = 16;

bool enabled() { return env_auto_or("KILN_CONV", "fused"); }

fe::DataType_t fe_type(blob::DType dtype) {
  switch (dtype) {
    case blob::DType::kBFloat16: return fe::DataType_t::BFLOAT16;
    case blob::DType::kFloat16: return fe::DataType_t::HALF;
    default: return fe::DataType_t::FLOAT;
  }
}

// NHWC strides of a logical [N, C, H, W] tensor.
std::vector<int64_t> nhwc(int64_t c, int64_t h, int64_t w) { return {h * w * c, 1, w * c, c}; }

// How much of the epilogue the graph holds; the rest runs as Kiln's epilogue pass after it.
enum class Fused { kAll, kAllButActivation, kConvolutionOnly };

// A patch convolution (a ViT's or ConvNeXt's stem: kernel == stride, no padding or dilation) on
// fewer input channels than cuDNN's fused engines take (C_in of 3): run as a 1x1 convolution
// over the patches regrouped into channels (kH * kW * C_in of them, a multiple of 8), where
// cuDNN's generic NHWC kernel took 57 us for ViT-B/16's stem on the H200.
bool patch_convolution(const Conv2dArgs& a) {
  return a.groups == 1 && (a.kh > 1 || a.kw > 1) && a.kh == a.stride_h && a.kw == a.stride_w &&
         a.pad_h == 0 && a.pad_w == 0 && a.dil_h == 1 && a.dil_w == 1 && a.c_in % 8 != 0 &&
         (a.kh * a.kw * a.c_in) % 8 == 0;
}

// The 1x1 convolution over the regrouped patches that computes patch convolution `a`.
Conv2dArgs as_pointwise(const Conv2dArgs& a) {
  Conv2dArgs p = a;
  p.c_in = a.kh * a.kw * a.c_in;
  p.h = a.h_out, p.w = a.w_out;
  p.kh = p.kw = p.stride_h = p.stride_w = 1;
  return p;
}

class CudnnFusedConvStep final : public Step {
 public:
  // `patch`: the patch convolution that `a` (its as_pointwise) computes, whose input this step
  // regroups into the workspace first; null for any other convolution.
  CudnnFusedConvStep(const Conv2dArgs& a, const Conv2dArgs* patch,
                     std::shared_ptr<fe::graph::Graph> graph, size_t workspace, Fused fused,
                     blob::DType dtype, blob::DType bias_dtype)
      : a_(a), patch_(patch != nullptr ? *patch : Conv2dArgs{}), graph_(std::move(graph)),
        workspace_(workspace), fused_(fused), dtype_(dtype), bias_dtype_(bias_dtype) {
    if (patch != nullptr) {  // the regrouped patches are a_'s input: [N, H, W, C_in]
      const size_t bytes = static_cast<size_t>(a.n * a.h * a.w * a.c_in) * element_size(dtype);
      patch_bytes_ = (bytes + 255) / 256 * 256;  // cuDNN's workspace follows, aligned
    }
  }

  Error enqueue(const RunContext& ctx) override {
    void* x = ctx.ptr(a_.x);
    RunContext run = ctx;
    if (patch_bytes_ != 0) {
      KILN_TRY(enqueue_space_to_depth(patch_, dtype_, x, ctx.workspace, ctx));
      x = ctx.workspace;
      run.workspace = static_cast<char*>(ctx.workspace) + patch_bytes_;
      run.workspace_bytes -= patch_bytes_;
    }
    std::unordered_map<int64_t, void*> pack{
        {kX, x}, {kW, ctx.ptr(a_.weight)}, {kY, ctx.ptr(a_.out)}};
    const bool in_graph = fused_ != Fused::kConvolutionOnly;
    if (in_graph && a_.bias != kNoTensor) pack[kB] = ctx.ptr(a_.bias);
    if (in_graph && a_.residual != kNoTensor) pack[kR] = ctx.ptr(a_.residual);
    KILN_TRY(execute_cudnn_graph(*graph_, pack, run, "conv2d", "cuDNN's fused convolution"));
    if (fused_ == Fused::kAll) return Error::Ok;
    const bool all = fused_ == Fused::kConvolutionOnly;
    const void* bias = all && a_.bias != kNoTensor ? ctx.ptr(a_.bias) : nullptr;
    const void* residual = all && a_.residual != kNoTensor ? ctx.ptr(a_.residual) : nullptr;
    if (bias == nullptr && residual == nullptr && a_.epilogue == Epilogue::kNone) {
      return Error::Ok;
    }
    return enqueue_conv_epilogue(a_, dtype_, ctx.ptr(a_.out), bias, bias_dtype_, residual,
                                 a_.epilogue, ctx);
  }

  size_t workspace_bytes() const override { return patch_bytes_ + workspace_; }

 private:
  Conv2dArgs a_;
  Conv2dArgs patch_;        // the patch convolution a_ computes, when patch_bytes_ != 0
  size_t patch_bytes_ = 0;  // the regrouped patches at the workspace's start
  std::shared_ptr<fe::graph::Graph> graph_;
  size_t workspace_;
  Fused fused_;
  blob::DType dtype_, bias_dtype_;
};

using TensorPtr = std::shared_ptr<fe::graph::Tensor_attributes>;

TensorPtr pointwise(fe::graph::Graph& g, TensorPtr y, fe::PointwiseMode_t mode) {
  return g.pointwise(y, fe::graph::Pointwise_attributes().set_mode(mode));
}

// y through the activation `e`'s nodes (relu6: relu, then the minimum with 6), or nullptr when
// the graph has none for it.
TensorPtr activation(fe::graph::Graph& g, TensorPtr y, Epilogue e) {
  switch (e) {
    case Epilogue::kNone: return y;
    case Epilogue::kRelu: return pointwise(g, y, fe::PointwiseMode_t::RELU_FWD);
    case Epilogue::kRelu6:
      return g.pointwise(pointwise(g, y, fe::PointwiseMode_t::RELU_FWD),
                         g.tensor(fe::graph::Tensor_attributes(6.0f)),
                         fe::graph::Pointwise_attributes().set_mode(fe::PointwiseMode_t::MIN));
    case Epilogue::kSilu:
      return g.pointwise(y, fe::graph::Pointwise_attributes()
                                .set_mode(fe::PointwiseMode_t::SWISH_FWD)
                                .set_swish_beta(1.0f));
    case Epilogue::kGeluErf: return pointwise(g, y, fe::PointwiseMode_t::GELU_FWD);
    case Epilogue::kGeluTanh: return pointwise(g, y, fe::PointwiseMode_t::GELU_APPROX_TANH_FWD);
    case Epilogue::kSigmoid: return pointwise(g, y, fe::PointwiseMode_t::SIGMOID_FWD);
    default: return nullptr;
  }
}

// The graph for `a` holding what `fused` says; false (with the reason) when cuDNN builds no plan
// for it or the activation has no node.
bool build_graph(const Conv2dArgs& a, const InitContext& ctx, Fused fused,
                 std::shared_ptr<fe::graph::Graph>* out, size_t* workspace, std::string* why) {
  const Graph& g = ctx.graph;
  auto graph = std::make_shared<fe::graph::Graph>();
  const fe::DataType_t io = fe_type(g.tensors[a.x].dtype);
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
  if (fused != Fused::kConvolutionOnly && a.bias != kNoTensor) {
    auto b = graph->tensor(fe::graph::Tensor_attributes()
                               .set_name("bias")
                               .set_uid(kB)
                               .set_dim({1, a.c_out, 1, 1})
                               .set_stride({a.c_out, 1, a.c_out, a.c_out})
                               .set_data_type(fe_type(g.tensors[a.bias].dtype)));
    y = graph->pointwise(y, b, fe::graph::Pointwise_attributes().set_mode(fe::PointwiseMode_t::ADD));
  }
  if (fused != Fused::kConvolutionOnly && a.residual != kNoTensor) {
    auto r = graph->tensor(fe::graph::Tensor_attributes()
                               .set_name("residual")
                               .set_uid(kR)
                               .set_dim({a.n, a.c_out, a.h_out, a.w_out})
                               .set_stride(nhwc(a.c_out, a.h_out, a.w_out)));
    y = graph->pointwise(y, r, fe::graph::Pointwise_attributes().set_mode(fe::PointwiseMode_t::ADD));
  }
  if (fused == Fused::kAll) {
    y = activation(*graph, y, a.epilogue);
    if (y == nullptr) {
      *why = "no pointwise node for the activation";
      return false;
    }
  }
  y->set_output(true)
      .set_uid(kY)
      .set_dim({a.n, a.c_out, a.h_out, a.w_out})
      .set_stride(nhwc(a.c_out, a.h_out, a.w_out))
      .set_data_type(io);
  fe::error_t built = graph->build(ctx.cudnn, {fe::HeurMode_t::A});
  int64_t bytes = 0;
  if (built.is_bad() || graph->get_workspace_size(bytes).is_bad() || bytes < 0) {
    *why = built.is_bad() ? built.get_message() : "no workspace size";
    return false;
  }
  *out = std::move(graph);
  *workspace = static_cast<size_t>(bytes);
  return true;
}

}  // namespace

const char* cudnn_fused_conv_unsupported(const Conv2dArgs& a, const Graph& graph) {
  if (!enabled()) return "KILN_CONV selects the legacy path";
  if (!a.channels_last) return "NCHW (the fused engines take NHWC)";
  const blob::DType dtype = graph.tensors[a.x].dtype;
  if (dtype == blob::DType::kFloat32 && graph.precision != blob::Precision::kTf32) {
    return "strict fp32 (the fused engines use tensor cores)";
  }
  if (a.n * a.c_in * a.h * a.w * a.c_out * a.h_out * a.w_out == 0) return "an empty operand";
  if (a.groups != 1) return "a grouped convolution";
  return nullptr;
}

StepResult make_cudnn_fused_conv_step(const Conv2dArgs& args, const InitContext& ctx) {
  const Graph& g = ctx.graph;
  const blob::DType dtype = g.tensors[args.x].dtype;
  const bool patches = patch_convolution(args);
  const Conv2dArgs a = patches ? as_pointwise(args) : args;
  // The regrouped patches live in the (256-byte aligned) workspace.
  uint32_t align = std::min({patches ? 256u : ctx.alignment[a.x], ctx.alignment[a.weight],
                             ctx.alignment[a.out]});
  if (a.residual != kNoTensor) align = std::min(align, ctx.alignment[a.residual]);
  if (ctx.cudnn == nullptr || align < kAlignment) {
    ET_LOG(Info, "Kiln engine: op %zu (conv2d): operands %u-byte aligned; the legacy path runs it",
           ctx.op_index, align);
    return Error::NotSupported;
  }
  std::string why;
  try {
    // The whole epilogue in the graph; else the activation in Kiln's pass after it; else only the
    // convolution in the graph (cuDNN's fused engines still beat its legacy NHWC kernels).
    for (Fused fused : {Fused::kAll, Fused::kAllButActivation, Fused::kConvolutionOnly}) {
      std::shared_ptr<fe::graph::Graph> graph;
      size_t workspace = 0;
      std::string reason;
      if (build_graph(a, ctx, fused, &graph, &workspace, &reason)) {
        const blob::DType bias_dtype =
            a.bias == kNoTensor ? dtype : g.tensors[a.bias].dtype;
        return std::unique_ptr<Step>(new CudnnFusedConvStep(
            a, patches ? &args : nullptr, std::move(graph), workspace, fused, dtype, bias_dtype));
      }
      if (why.empty()) why = reason;
    }
  } catch (const std::exception& ex) {
    why = ex.what();
  }
  ET_LOG(Info, "Kiln engine: op %zu (conv2d): cuDNN %zu has no graph plan for it (%s); the legacy "
         "path runs it", ctx.op_index, cudnnGetVersion(), why.c_str());
  return Error::NotSupported;
}

}  // namespace kiln::engine::kernels
