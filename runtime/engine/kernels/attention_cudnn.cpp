// kAttention through the cuDNN frontend's SDPA node: one graph per op, built at init with the
// op's sizes and strides, executed with the run's pointers. Plain C++ (no device code): the
// frontend's headers are heavy, so they stay in this one file.
#include "runtime/engine/kernels/attention_cudnn.h"

#include <cudnn_frontend.h>

#include <exception>
#include <memory>
#include <string>
#include <unordered_map>

#include "format/dtype.h"
#include "format/fail.h"
#include "runtime/engine/cuda_check.h"
#include "runtime/engine/kernels/attention.cuh"
#include "runtime/engine/kernels/attention_mask.cuh"
#include "runtime/engine/kernels/cudnn_graph.h"
#include "runtime/engine/env_switch.h"

namespace kiln::engine::kernels {
namespace {

namespace fe = cudnn_frontend;
using executorch::runtime::Error;

// The graph's tensor uids.
constexpr int64_t kQ = 1, kK = 2, kV = 3, kO = 4, kBias = 5;

// A masked op goes to cuDNN from this many queries up (a prefill chunk over a KV cache, an
// encoder with a padding mask); fewer (decode) stay on Kiln's split-K kernel, which skips the
// cache rows the mask hides where cuDNN would read every one.
constexpr int64_t kMinMaskedQueries = 16;
// The largest bias (the mask in the query's dtype, in the workspace) worth writing per run.
constexpr size_t kMaxBiasBytes = size_t{64} << 20;
constexpr size_t kWorkspaceAlign = 256;

size_t round_up(size_t n, size_t to) { return (n + to - 1) / to * to; }

// Where the bias goes: [rows_b, rows_h, seq_q, bias_ld], broadcast over batch / heads where the
// mask is.
struct BiasShape {
  int64_t rows_b, rows_h, ld;
  size_t bias_bytes, dead_bytes;
};

BiasShape bias_shape(const AttentionArgs& a, size_t elt) {
  BiasShape s{};
  s.rows_b = a.mask_stride_b == 0 ? 1 : a.batch;
  s.rows_h = a.mask_stride_h == 0 ? 1 : a.heads_q;
  s.ld = (a.seq_kv + 7) / 8 * 8;  // 16-byte rows for cuDNN's vector loads
  const size_t rows = static_cast<size_t>(s.rows_b * s.rows_h * a.seq_q);
  s.bias_bytes = round_up(rows * static_cast<size_t>(s.ld) * elt, kWorkspaceAlign);
  s.dead_bytes = round_up(rows, kWorkspaceAlign);
  return s;
}

// Every operand address and row stride on a 16-byte boundary: cuDNN's fused attention reads
// q/k/v with 16-byte vector loads.
constexpr uint32_t kAlignment = 16;

bool enabled() { return env_auto_or("KILN_ATTENTION", "cudnn"); }

class CudnnAttentionStep final : public Step {
 public:
  CudnnAttentionStep(const AttentionArgs& a, std::shared_ptr<fe::graph::Graph> graph,
                     blob::DType dtype, MaskKind mask, size_t cudnn_workspace)
      : a_(a),
        graph_(std::move(graph)),
        dtype_(dtype),
        elt_(element_size(dtype)),
        mask_(mask),
        cudnn_workspace_(round_up(cudnn_workspace, kWorkspaceAlign)),
        bias_(bias_shape(a, elt_)) {}

  Error enqueue(const RunContext& ctx) override {
    char* bias = static_cast<char*>(ctx.workspace) + cudnn_workspace_;
    uint8_t* dead = reinterpret_cast<uint8_t*>(bias + bias_.bias_bytes);
    if (mask_ != MaskKind::kNone) {
      const MaskToBias p{ctx.ptr(a_.mask), mask_ == MaskKind::kBool, dtype_, bias_.rows_b,
                         bias_.rows_h, a_.seq_q, a_.seq_kv, a_.mask_stride_b, a_.mask_stride_h,
                         a_.mask_stride_q, a_.mask_stride_k, bias_.ld, a_.causal != 0, bias,
                         dead};
      KILN_TRY(cuda_status(launch_mask_to_bias(p, ctx.stream), Error::Internal,
                           "Kiln engine: op %zu (attention): the mask's bias kernel failed",
                           ctx.op_index));
    }
    std::unordered_map<int64_t, void*> pack{
        {kQ, ctx.ptr<char>(a_.q) + a_.q_offset * elt_},
        {kK, ctx.ptr<char>(a_.k) + a_.k_offset * elt_},
        {kV, ctx.ptr<char>(a_.v) + a_.v_offset * elt_},
        {kO, ctx.ptr(a_.out)}};
    if (mask_ != MaskKind::kNone) pack.emplace(kBias, bias);
    KILN_TRY(execute_cudnn_graph(*graph_, pack, ctx, "attention", "cuDNN's fused attention"));
    if (mask_ != MaskKind::kNone) {
      const ZeroDeadRows z{dead, dtype_, a_.batch, a_.heads_q, a_.seq_q, a_.head_dim_v,
                           bias_.rows_b, bias_.rows_h, a_.out_stride_b, a_.out_stride_h,
                           a_.out_stride_s, ctx.ptr(a_.out)};
      KILN_TRY(cuda_status(launch_zero_dead_rows(z, ctx.stream), Error::Internal,
                           "Kiln engine: op %zu (attention): the dead-row kernel failed",
                           ctx.op_index));
    }
    return Error::Ok;
  }

  size_t workspace_bytes() const override {
    return cudnn_workspace_ +
           (mask_ == MaskKind::kNone ? 0 : bias_.bias_bytes + bias_.dead_bytes);
  }

 private:
  AttentionArgs a_;
  std::shared_ptr<fe::graph::Graph> graph_;
  blob::DType dtype_;
  size_t elt_;
  MaskKind mask_;
  size_t cudnn_workspace_;
  BiasShape bias_;
};

}  // namespace

const char* cudnn_attention_unsupported(const AttentionArgs& a, const Graph& graph) {
  if (!enabled()) return "KILN_ATTENTION selects Kiln's kernel";
  const blob::DType dtype = graph.tensors[a.q].dtype;
  if (dtype != blob::DType::kBFloat16 && dtype != blob::DType::kFloat16) {
    return "cuDNN's fused attention takes Float16 and BFloat16 only";
  }
  if (a.batch == 0 || a.seq_q == 0 || a.seq_kv == 0) return "an empty operand";
  if (a.mask != kNoTensor) {
    if (a.seq_q < kMinMaskedQueries) return "a mask over few queries (Kiln's split-K kernel)";
    const BiasShape b = bias_shape(a, element_size(dtype));
    if (b.bias_bytes + b.dead_bytes > kMaxBiasBytes ||
        b.rows_b * b.rows_h * a.seq_q > 0x7fffffffLL) {
      return "a mask too large to write as cuDNN's bias";
    }
  }
  if (a.head_dim % 8 != 0 || a.head_dim_v % 8 != 0 || a.head_dim > 256 || a.head_dim_v > 256) {
    return "head dims that are not multiples of 8 up to 256";
  }
  const int64_t strides[] = {a.q_stride_b,  a.q_stride_h,   a.q_stride_s,  a.k_stride_b,
                             a.k_stride_h,  a.k_stride_s,   a.v_stride_b,  a.v_stride_h,
                             a.v_stride_s,  a.out_stride_b, a.out_stride_h, a.out_stride_s};
  const int64_t sizes[] = {a.batch, a.heads_q,  a.seq_q,  a.batch, a.heads_kv, a.seq_kv,
                           a.batch, a.heads_kv, a.seq_kv, a.batch, a.heads_q,  a.seq_q};
  const int64_t elt = static_cast<int64_t>(element_size(dtype));
  for (int i = 0; i < 12; ++i) {
    if ((strides[i] == 0 && sizes[i] > 1) || (strides[i] * elt) % kAlignment != 0) {
      return "a broadcast or unaligned stride";
    }
  }
  if ((a.q_offset * elt) % kAlignment != 0 || (a.k_offset * elt) % kAlignment != 0 ||
      (a.v_offset * elt) % kAlignment != 0) {
    return "an unaligned view offset";
  }
  return nullptr;
}

bool graph_has_cudnn_attention(const Graph& graph) {
  for (const Op& op : graph.ops) {
    if (const auto* a = std::get_if<AttentionArgs>(&op.args)) {
      if (cudnn_attention_unsupported(*a, graph) == nullptr) return true;
    }
  }
  return false;
}

StepResult make_cudnn_attention_step(const AttentionArgs& a, const InitContext& ctx) {
  const blob::DType dtype = ctx.graph.tensors[a.q].dtype;
  const int64_t elt = static_cast<int64_t>(element_size(dtype));
  const uint32_t align = std::min({min_alignment(ctx.alignment[a.q], a.q_offset * elt),
                                   min_alignment(ctx.alignment[a.k], a.k_offset * elt),
                                   min_alignment(ctx.alignment[a.v], a.v_offset * elt),
                                   ctx.alignment[a.out]});
  if (ctx.cudnn == nullptr || align < kAlignment) {
    ET_LOG(Info, "Kiln engine: op %zu (attention): operands %u-byte aligned; Kiln's kernel runs it",
           ctx.op_index, align);
    return Error::NotSupported;
  }
  auto graph = std::make_shared<fe::graph::Graph>();
  size_t workspace = 0;
  try {
    graph->set_io_data_type(dtype == blob::DType::kBFloat16 ? fe::DataType_t::BFLOAT16
                                                             : fe::DataType_t::HALF)
        .set_intermediate_data_type(fe::DataType_t::FLOAT)
        .set_compute_data_type(fe::DataType_t::FLOAT);
    auto q = graph->tensor(fe::graph::Tensor_attributes()
                               .set_name("q")
                               .set_uid(kQ)
                               .set_dim({a.batch, a.heads_q, a.seq_q, a.head_dim})
                               .set_stride({a.q_stride_b, a.q_stride_h, a.q_stride_s, 1}));
    auto k = graph->tensor(fe::graph::Tensor_attributes()
                               .set_name("k")
                               .set_uid(kK)
                               .set_dim({a.batch, a.heads_kv, a.seq_kv, a.head_dim})
                               .set_stride({a.k_stride_b, a.k_stride_h, a.k_stride_s, 1}));
    auto v = graph->tensor(fe::graph::Tensor_attributes()
                               .set_name("v")
                               .set_uid(kV)
                               .set_dim({a.batch, a.heads_kv, a.seq_kv, a.head_dim_v})
                               .set_stride({a.v_stride_b, a.v_stride_h, a.v_stride_s, 1}));
    auto options = fe::graph::SDPA_attributes()
                       .set_name("attention")
                       .set_generate_stats(false)
                       .set_attn_scale(static_cast<float>(a.scale));
    if (a.causal) options.set_causal_mask(true);  // top-left, as torch's is_causal
    if (a.mask != kNoTensor) {
      const BiasShape b = bias_shape(a, static_cast<size_t>(elt));
      auto bias = graph->tensor(fe::graph::Tensor_attributes()
                                    .set_name("bias")
                                    .set_uid(kBias)
                                    .set_dim({b.rows_b, b.rows_h, a.seq_q, a.seq_kv})
                                    .set_stride({b.rows_h * a.seq_q * b.ld, a.seq_q * b.ld, b.ld, 1}));
      options.set_bias(bias);
    }
    auto outputs = graph->sdpa(q, k, v, options);
    outputs[0]
        ->set_output(true)
        .set_uid(kO)
        .set_dim({a.batch, a.heads_q, a.seq_q, a.head_dim_v})
        .set_stride({a.out_stride_b, a.out_stride_h, a.out_stride_s, 1});
    fe::error_t built = graph->build(ctx.cudnn, {fe::HeurMode_t::A});
    if (built.is_bad()) {
      ET_LOG(Info,
             "Kiln engine: op %zu (attention): cuDNN %zu has no fused-attention plan for it (%s); "
             "Kiln's kernel runs it",
             ctx.op_index, cudnnGetVersion(), built.get_message().c_str());
      return Error::NotSupported;
    }
    int64_t bytes = 0;
    fe::error_t sized = graph->get_workspace_size(bytes);
    if (sized.is_bad() || bytes < 0) {
      return fail(nullptr, Error::Internal,
                  "Kiln engine: op %zu (attention): cuDNN's workspace size: %s", ctx.op_index,
                  sized.get_message().c_str());
    }
    workspace = static_cast<size_t>(bytes);
  } catch (const std::exception& ex) {
    ET_LOG(Info, "Kiln engine: op %zu (attention): building cuDNN's fused attention failed (%s); "
           "Kiln's kernel runs it", ctx.op_index, ex.what());
    return Error::NotSupported;
  }
  return std::unique_ptr<Step>(
      new CudnnAttentionStep(a, std::move(graph), dtype, mask_kind(a, ctx.graph), workspace));
}

}  // namespace kiln::engine::kernels
