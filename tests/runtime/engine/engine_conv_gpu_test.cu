// kConv2d's epilogue (bias, residual and activation in one fp32 pass) in both memory layouts
// (NCHW, and channels_last: NHWC activations with a KRSC weight) on a GPU against a float64 host
// reference (engine_gpu_fixture.h says how). kPool2d's NHWC cases are in
// engine_matmul_conv_gpu_test.
#include "tests/runtime/engine/engine_gpu_fixture.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

namespace kiln::engine::gpu_test {
namespace {

using blob::Epilogue;

struct ConvCase {
  int64_t n, c_in, h, w, c_out, kh, kw;
  int64_t stride = 1, pad_h = 0, pad_w = 0, dil = 1, groups = 1;
  bool bias = true;
  bool residual = false;
  Epilogue epilogue = Epilogue::kNone;
  bool channels_last = false;
};

double activation(Epilogue e, double v) {
  switch (e) {
    case Epilogue::kRelu: return std::max(v, 0.0);
    case Epilogue::kGeluErf: return 0.5 * v * (1.0 + std::erf(v / std::sqrt(2.0)));
    case Epilogue::kGeluTanh:
      return 0.5 * v * (1.0 + std::tanh(0.7978845608028654 * (v + 0.044715 * v * v * v)));
    case Epilogue::kRelu6: return std::min(std::max(v, 0.0), 6.0);
    case Epilogue::kSilu: return v / (1.0 + std::exp(-v));
    case Epilogue::kHardswish: return v * std::min(std::max(v + 3.0, 0.0), 6.0) / 6.0;
    case Epilogue::kSigmoid: return 1.0 / (1.0 + std::exp(-v));
    case Epilogue::kNone: break;
  }
  return v;
}

// Element [a, b, c, d] of a logical [A, B, C, D] image (sizes s) stored NCHW, or NHWC ([A, C,
// D, B] in memory) when channels_last.
int64_t at(const Sizes& s, int64_t a, int64_t b, int64_t c, int64_t d, bool channels_last) {
  return channels_last ? ((a * s[2] + c) * s[3] + d) * s[1] + b
                       : ((a * s[1] + b) * s[2] + c) * s[3] + d;
}

Sizes memory_order(const Sizes& s, bool channels_last) {
  return channels_last ? Sizes{s[0], s[2], s[3], s[1]} : s;
}

void run_conv(const ConvCase& cc, DType dtype, const std::string& name) {
  OneOp c;
  BlobBuilder::Conv2d conv;
  conv.n = cc.n, conv.c_in = cc.c_in, conv.h = cc.h, conv.w = cc.w, conv.c_out = cc.c_out;
  conv.kh = cc.kh, conv.kw = cc.kw, conv.stride_h = conv.stride_w = cc.stride;
  conv.pad_h = cc.pad_h, conv.pad_w = cc.pad_w, conv.dil_h = conv.dil_w = cc.dil, conv.groups = cc.groups;
  conv.epilogue = cc.epilogue, conv.channels_last = cc.channels_last;
  const bool cl = cc.channels_last;
  const int64_t cig = cc.c_in / cc.groups, cog = cc.c_out / cc.groups;
  const int64_t ho = conv.h_out(), wo = conv.w_out();
  const Sizes xs{cc.n, cc.c_in, cc.h, cc.w}, ws{cc.c_out, cig, cc.kh, cc.kw};
  const Sizes ys{cc.n, cc.c_out, ho, wo};
  const HostTensor x = random(dtype, memory_order(xs, cl), -1.0, 1.0);
  const HostTensor wt = random(dtype, memory_order(ws, cl), -1.0, 1.0);
  const HostTensor bias = random(dtype, {cc.c_out}, -1.0, 1.0);
  const HostTensor res = random(dtype, memory_order(ys, cl), -2.0, 2.0);
  conv.x = c.add_input(x);
  if (cc.residual) conv.residual = c.add_input(res);
  const std::vector<uint8_t> w_bytes = wt.bytes(), b_bytes = bias.bytes();
  conv.weight = c.b.weight(dtype, wt.sizes, w_bytes.data());
  if (cc.bias) conv.bias = c.b.weight(dtype, bias.sizes, b_bytes.data());
  conv.out = c.b.output(dtype, memory_order(ys, cl));
  c.b.conv2d(conv);
  const auto runs = run_three_ways(c.b, c.inputs);
  std::vector<double> want(static_cast<size_t>(numel(ys)));
  for_each_index(ys, [&](int64_t, const Sizes& id) {
    const int64_t g = id[1] / cog;
    double acc = cc.bias ? bias.v[id[1]] : 0.0;
    for (int64_t ci = 0; ci < cig; ++ci) {
      for (int64_t ky = 0; ky < cc.kh; ++ky) {
        for (int64_t kx = 0; kx < cc.kw; ++kx) {
          const int64_t iy = id[2] * cc.stride - cc.pad_h + ky * cc.dil;
          const int64_t ix = id[3] * cc.stride - cc.pad_w + kx * cc.dil;
          if (iy < 0 || iy >= cc.h || ix < 0 || ix >= cc.w) continue;
          acc += x.v[at(xs, id[0], g * cig + ci, iy, ix, cl)] * wt.v[at(ws, id[1], ci, ky, kx, cl)];
        }
      }
    }
    const int64_t o = at(ys, id[0], id[1], id[2], id[3], cl);
    if (cc.residual) acc += res.v[o];
    want[o] = activation(cc.epilogue, acc);
  });
  expect_output(runs, 0, want, tol_for(dtype, std::sqrt(double(cig * cc.kh * cc.kw)) * 4), name);
}

// Bias only, NCHW: the shapes cuDNN must take.
TEST_F(EngineGpu, Conv2dStridedDilatedGroupedDepthwise) {
  const std::pair<ConvCase, const char*> cases[] = {
      {{1, 3, 9, 9, 4, 3, 3, 1, 1, 1, 1, 1, true}, "3x3 pad 1"},
      {{2, 3, 11, 10, 5, 3, 3, 2, 1, 1, 1, 1, true}, "stride 2, N 2"},
      {{1, 2, 12, 12, 3, 3, 3, 1, 2, 2, 2, 1, false}, "dilation 2"},
      {{1, 4, 8, 8, 4, 3, 3, 1, 1, 1, 1, 4, true}, "depthwise"},
      {{1, 4, 7, 7, 6, 3, 3, 1, 0, 0, 1, 2, true}, "groups 2"},
      {{1, 8, 5, 5, 3, 1, 1, 1, 0, 0, 1, 1, true}, "1x1"},
      {{1, 2, 6, 7, 2, 3, 1, 1, 1, 0, 1, 1, true}, "3x1 kernel, pad (1, 0)"},
      // Kiln's own depthwise kernel (NCHW, groups == C_in == C_out): N 2, dilation, stride 2.
      {{2, 6, 10, 9, 6, 3, 3, 1, 2, 2, 2, 6, true}, "depthwise dilation 2, N 2"},
      {{1, 5, 11, 12, 5, 5, 5, 2, 2, 2, 1, 5, false}, "depthwise 5x5 stride 2, no bias"},
      {{1, 3, 4, 4, 3, 7, 7, 1, 3, 3, 1, 3, true}, "depthwise 7x7 on a 4x4 plane"},
  };
  for (const auto& [cc, name] : cases) {
    run_conv(cc, DType::kFloat32, std::string("f32 ") + name);
  }
  run_conv(cases[0].first, DType::kFloat16, "f16 3x3 pad 1");
  run_conv(cases[3].first, DType::kBFloat16, "bf16 depthwise");
  run_conv(cases[7].first, DType::kFloat16, "f16 depthwise dilation 2, N 2");
}

TEST_F(EngineGpu, Conv2dEpiloguesInBothLayouts) {
  const std::pair<ConvCase, const char*> cases[] = {
      {{1, 8, 9, 9, 16, 3, 3, 1, 1, 1}, "3x3 pad 1"},
      {{2, 6, 11, 10, 8, 3, 3, 2, 1, 1}, "stride 2, N 2"},
      {{1, 4, 12, 12, 4, 3, 3, 1, 2, 2, 2}, "dilation 2"},
      {{1, 16, 8, 8, 16, 3, 3, 1, 1, 1, 1, 16}, "depthwise 3x3"},
      {{1, 16, 9, 9, 16, 5, 5, 2, 2, 2, 1, 16}, "depthwise 5x5 stride 2"},
      {{1, 8, 7, 7, 12, 3, 3, 1, 0, 0, 1, 2}, "groups 2"},
      {{1, 32, 5, 5, 24, 1, 1}, "1x1"},
      // Patch convolutions (kernel == stride) on 3 channels: in NHWC bf16 the patches are
      // regrouped into 48 / 192 channels of a 1x1 convolution; 34x33 drops the partial patches.
      {{1, 3, 34, 33, 16, 4, 4, 4}, "patch 4x4 stride 4"},
      {{2, 3, 32, 32, 24, 8, 8, 8}, "patch 8x8 stride 8, N 2"},
  };
  const Epilogue epilogues[] = {Epilogue::kNone, Epilogue::kRelu, Epilogue::kRelu6,
                                Epilogue::kSilu, Epilogue::kHardswish, Epilogue::kGeluErf,
                                Epilogue::kSigmoid};
  for (bool cl : {false, true}) {
    const std::string layout = cl ? "NHWC " : "NCHW ";
    size_t i = 0;
    for (const auto& [base, name] : cases) {
      ConvCase cc = base;
      cc.channels_last = cl;
      cc.epilogue = epilogues[i % std::size(epilogues)];
      cc.residual = i % 2 == 1;
      cc.bias = i != 2;
      const std::string what = layout + name + " epilogue " + std::to_string(int(cc.epilogue)) +
                               (cc.residual ? " + residual" : "");
      run_conv(cc, DType::kFloat32, "f32 " + what);
      run_conv(cc, DType::kBFloat16, "bf16 " + what);
      ++i;
    }
    ConvCase resnet{1, 16, 8, 8, 16, 3, 3, 1, 1, 1};
    resnet.channels_last = cl, resnet.residual = true, resnet.epilogue = Epilogue::kRelu;
    run_conv(resnet, DType::kFloat16, "f16 " + layout + "residual + relu");
  }
}

}  // namespace
}  // namespace kiln::engine::gpu_test
