// kiln_llm's steps over a program's prefill and decode methods (llm_session.h).
#include "runner/llm_session.h"

#include <cuda_runtime.h>
#include <dlfcn.h>
#include <executorch/runtime/core/exec_aten/exec_aten.h>
#include <kiln/executorch/stream.h>

#include <algorithm>
#include <cstring>
#include <type_traits>

#include "runner/diagnostics.h"
#include "runner/llm_feed.cuh"
#include "runner/tensor_io.h"

namespace kiln::runner {
namespace {

using executorch::aten::ScalarType;
using executorch::aten::Tensor;
using executorch::aten::TensorImpl;
using executorch::runtime::etensor::Device;
using executorch::runtime::etensor::DeviceType;

void cuda_ok(cudaError_t status, const std::string& what) {
  if (status != cudaSuccess) fail(what + " failed: " + cudaGetErrorString(status));
}

// An int64 or float tensor over memory someone else owns (host, or device for a device-resident
// program), shaped as the method declares it.
struct View {
  std::vector<TensorImpl::SizesType> sizes;
  std::vector<TensorImpl::DimOrderType> dim_order;
  std::unique_ptr<TensorImpl> impl;

  View(ScalarType dtype, std::vector<TensorImpl::SizesType> shape, void* data, Device device)
      : sizes(std::move(shape)) {
    for (size_t d = 0; d < sizes.size(); ++d) dim_order.push_back(TensorImpl::DimOrderType(d));
    impl = std::make_unique<TensorImpl>(dtype, ssize_t(sizes.size()), sizes.data(), data,
                                        dim_order.data(), nullptr,
                                        executorch::aten::TensorShapeDynamism::STATIC,
                                        device.type(), device.index());
  }
  Tensor tensor() { return Tensor(impl.get()); }
};

// Input `index` of `method` must be an int64 tensor of `sizes`; otherwise the program is not one
// export_llm wrote (or was exported with other sizes than its constant methods say).
void expect_input(const et::MethodMeta& meta, const char* method, size_t index,
                  const std::vector<int64_t>& sizes) {
  auto info = meta.input_tensor_meta(index);
  bool ok = meta.num_inputs() > index && info.ok() && info->scalar_type() == ScalarType::Long &&
            info->sizes().size() == sizes.size();
  for (size_t d = 0; ok && d < sizes.size(); ++d) ok = info->sizes()[d] == sizes[d];
  if (!ok) {
    std::string want = "[";
    for (size_t d = 0; d < sizes.size(); ++d) want += (d ? "," : "") + std::to_string(sizes[d]);
    fail(std::string("method '") + method + "' input " + std::to_string(index) +
         " is not an int64 tensor " + want + "]; export the program with "
         "kiln_executorch.llm.export_llm");
  }
}

// Outputs: float32 logits of `vocab` values, then the int64 greedy token [1, 1].
void expect_outputs(const et::MethodMeta& meta, const char* method, int64_t vocab) {
  auto logits = meta.output_tensor_meta(0);
  auto token = meta.output_tensor_meta(1);
  bool ok = meta.num_outputs() == 2 && logits.ok() && token.ok() &&
            logits->scalar_type() == ScalarType::Float && token->scalar_type() == ScalarType::Long;
  int64_t n = 1;
  for (size_t d = 0; ok && d < logits->sizes().size(); ++d) n *= logits->sizes()[d];
  if (!ok || n != vocab || token->nbytes() != sizeof(int64_t)) {
    fail(std::string("method '") + method + "' does not return float32 logits of " +
         std::to_string(vocab) + " values and an int64 token; re-export the program with this "
         "kiln_executorch's kiln_executorch.llm.export_llm");
  }
}

}  // namespace

struct LlmSession::Impl {
  LoadedMethod prefill, decode;
  int64_t chunk, vocab;
  LoadedMethod* last = nullptr;   // the method of the last step: its outputs are the step's
  std::vector<int64_t> greedy;    // host I/O: decode_greedy's tokens

  // Host I/O: the inputs in host memory ExecuTorch copies from.
  std::vector<int64_t> h_tokens, h_positions, h_last, h_token, h_position;
  std::vector<View> prefill_in, decode_in;

  // Device-resident: inputs and outputs in device memory, host staging in pinned memory.
  cudaStream_t stream = nullptr;
  CUstream_st* (*set_stream)(CUstream_st*) = nullptr;
  CUstream_st* previous_stream = nullptr;
  cudaEvent_t staged = nullptr;   // the prefill inputs' copies have read the staging
  // Device memory from the registered device allocator (kiln_runner's device_memory).
  std::unique_ptr<DeviceMemory> prefill_mem, decode_mem, next_mem, history_mem, logits_mem;
  int64_t* d_prefill = nullptr;   // tokens [chunk], positions [chunk], last [1]
  int64_t* d_decode = nullptr;    // token [1], position [1]
  int64_t* d_next = nullptr;      // the step's token output
  int64_t* d_history = nullptr;   // decode_greedy's tokens [max_context]
  float* d_logits = nullptr;
  int64_t* p_prefill = nullptr;   // pinned staging of the prefill inputs
  int64_t* p_next = nullptr;
  int64_t* p_history = nullptr;
  float* p_logits = nullptr;
  int64_t history = 0, max_context = 0;

  Impl(et::Program& program, const std::string& model, int64_t chunk_, int64_t vocab_)
      : prefill(program, "prefill", model), decode(program, "decode", model), chunk(chunk_),
        vocab(vocab_) {}

  ~Impl() {
    if (stream != nullptr) {
      cudaStreamSynchronize(stream);
      set_stream(previous_stream);
      for (void* p : {static_cast<void*>(p_prefill), static_cast<void*>(p_next),
                      static_cast<void*>(p_history), static_cast<void*>(p_logits)}) {
        cudaFreeHost(p);
      }
      cudaEventDestroy(staged);
      cudaStreamDestroy(stream);
    }
  }

  void execute(LoadedMethod& m, std::vector<View>& inputs, const std::string& what) {
    for (size_t i = 0; i < inputs.size(); ++i) {
      et::Error err = m.method().set_input(et::EValue(inputs[i].tensor()), i);
      if (err != et::Error::Ok) fail(what + ": set_input(" + std::to_string(i) + ")", err);
    }
    et::Error err = m.method().execute();
    if (err != et::Error::Ok) fail(what, err);
    last = &m;
  }

  void bind_outputs(LoadedMethod& m, const char* name) {
    et::Error err = m.method().set_output_data_ptr(d_logits, size_t(vocab) * sizeof(float), 0);
    if (err == et::Error::Ok) err = m.method().set_output_data_ptr(d_next, sizeof(int64_t), 1);
    if (err != et::Error::Ok) {
      fail(std::string("binding the device outputs of '") + name + "'", err);
    }
  }

  void init_device(Device device) {
    set_stream = reinterpret_cast<decltype(set_stream)>(
        dlsym(RTLD_DEFAULT, "kiln_executorch_set_stream"));
    if (set_stream == nullptr) {
      fail("a device-resident program needs kiln_executorch_set_stream in the process (load "
           "libkiln_executorch_backend.so)");
    }
    cuda_ok(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
    cuda_ok(cudaEventCreateWithFlags(&staged, cudaEventDisableTiming), "cudaEventCreate");
    // Kiln enqueues this thread's executes on the session's stream, after its own copies.
    previous_stream = set_stream(stream);
    auto device_alloc = [&](auto** p, std::unique_ptr<DeviceMemory>& mem, size_t count,
                            const char* what) {
      mem = device_memory(device, count * sizeof(**p), what);
      *p = static_cast<std::remove_reference_t<decltype(*p)>>(mem->ptr);
    };
    auto pinned_alloc = [](auto** p, size_t count, const char* what) {
      cuda_ok(cudaMallocHost(reinterpret_cast<void**>(p), std::max<size_t>(count, 1) * sizeof(**p)),
              std::string("cudaMallocHost of ") + what);
    };
    device_alloc(&d_prefill, prefill_mem, size_t(2 * chunk + 1), "the prefill inputs");
    device_alloc(&d_decode, decode_mem, 2, "the decode inputs");
    device_alloc(&d_next, next_mem, 1, "the token output");
    device_alloc(&d_history, history_mem, size_t(max_context), "the generated tokens");
    device_alloc(&d_logits, logits_mem, size_t(vocab), "the logits");
    pinned_alloc(&p_prefill, size_t(2 * chunk + 1), "the prefill inputs");
    pinned_alloc(&p_next, 1, "the token");
    pinned_alloc(&p_history, size_t(max_context), "the generated tokens");
    pinned_alloc(&p_logits, size_t(vocab), "the logits");
    cuda_ok(cudaEventRecord(staged, stream), "cudaEventRecord");
    const auto c = TensorImpl::SizesType(chunk);
    prefill_in.emplace_back(ScalarType::Long, std::vector<TensorImpl::SizesType>{1, c}, d_prefill,
                            device);
    prefill_in.emplace_back(ScalarType::Long, std::vector<TensorImpl::SizesType>{c},
                            d_prefill + chunk, device);
    prefill_in.emplace_back(ScalarType::Long, std::vector<TensorImpl::SizesType>{1},
                            d_prefill + 2 * chunk, device);
    decode_in.emplace_back(ScalarType::Long, std::vector<TensorImpl::SizesType>{1, 1}, d_decode,
                           device);
    decode_in.emplace_back(ScalarType::Long, std::vector<TensorImpl::SizesType>{1}, d_decode + 1,
                           device);
    bind_outputs(prefill, "prefill");
    bind_outputs(decode, "decode");
  }

  void init_host() {
    h_tokens.assign(size_t(chunk), 0);
    h_positions.assign(size_t(chunk), 0);
    h_last.assign(1, 0);
    h_token.assign(1, 0);
    h_position.assign(1, 0);
    const Device cpu{DeviceType::CPU, 0};
    const auto c = TensorImpl::SizesType(chunk);
    prefill_in.emplace_back(ScalarType::Long, std::vector<TensorImpl::SizesType>{1, c},
                            h_tokens.data(), cpu);
    prefill_in.emplace_back(ScalarType::Long, std::vector<TensorImpl::SizesType>{c},
                            h_positions.data(), cpu);
    prefill_in.emplace_back(ScalarType::Long, std::vector<TensorImpl::SizesType>{1},
                            h_last.data(), cpu);
    decode_in.emplace_back(ScalarType::Long, std::vector<TensorImpl::SizesType>{1, 1},
                           h_token.data(), cpu);
    decode_in.emplace_back(ScalarType::Long, std::vector<TensorImpl::SizesType>{1},
                           h_position.data(), cpu);
  }

  const Tensor& output(size_t i) {
    if (last == nullptr) fail("no step has run yet");
    return last->method().get_output(i).toTensor();
  }
};

LlmSession::LlmSession(et::Program& program, const std::string& model, int64_t chunk,
                       int64_t vocab, int64_t max_context)
    : impl_(std::make_unique<Impl>(program, model, chunk, vocab)) {
  Impl& s = *impl_;
  s.max_context = max_context;
  expect_input(s.prefill.meta(), "prefill", 0, {1, chunk});
  expect_input(s.prefill.meta(), "prefill", 1, {chunk});
  expect_input(s.prefill.meta(), "prefill", 2, {1});
  expect_input(s.decode.meta(), "decode", 0, {1, 1});
  expect_input(s.decode.meta(), "decode", 1, {1});
  expect_outputs(s.prefill.meta(), "prefill", vocab);
  expect_outputs(s.decode.meta(), "decode", vocab);
  const Device device = input_devices(s.decode.method())[0];
  device_ = device.type() != DeviceType::CPU;
  for (LoadedMethod* m : {&s.prefill, &s.decode}) {
    for (const Device& d : input_devices(m->method())) {
      if ((d.type() != DeviceType::CPU) != device_) {
        fail("the program mixes host and device inputs; export it with "
             "kiln_executorch.llm.export_llm (device_resident=True or False)");
      }
    }
  }
  if (device_) {
    s.init_device(device);
  } else {
    s.init_host();
  }
}

LlmSession::~LlmSession() = default;

double LlmSession::load_ms(bool prefill) const {
  return prefill ? impl_->prefill.load_ms() : impl_->decode.load_ms();
}

void LlmSession::prefill(const std::vector<int64_t>& tokens, const std::vector<int64_t>& positions,
                         int64_t last, const std::string& what) {
  Impl& s = *impl_;
  const size_t n = size_t(s.chunk);
  if (!device_) {
    std::copy(tokens.begin(), tokens.begin() + n, s.h_tokens.begin());
    std::copy(positions.begin(), positions.begin() + n, s.h_positions.begin());
    s.h_last[0] = last;
    s.execute(s.prefill, s.prefill_in, what);
    return;
  }
  // The staging may still be read by the previous chunk's copies.
  cuda_ok(cudaEventSynchronize(s.staged), "waiting for the prefill staging");
  std::copy(tokens.begin(), tokens.begin() + n, s.p_prefill);
  std::copy(positions.begin(), positions.begin() + n, s.p_prefill + n);
  s.p_prefill[2 * n] = last;
  cuda_ok(cudaMemcpyAsync(s.d_prefill, s.p_prefill, (2 * n + 1) * sizeof(int64_t),
                          cudaMemcpyHostToDevice, s.stream),
          "copying the prefill inputs to the device");
  cuda_ok(cudaEventRecord(s.staged, s.stream), "cudaEventRecord");
  s.execute(s.prefill, s.prefill_in, what);
}

void LlmSession::decode(int64_t token, int64_t position, const std::string& what) {
  Impl& s = *impl_;
  if (!device_) {
    s.h_token[0] = token;
    s.h_position[0] = position;
  } else {
    cuda_ok(enqueue_feed(nullptr, token, s.d_decode, position, s.d_decode + 1, nullptr, 0,
                         s.stream),
            "feeding the decode inputs");
  }
  s.execute(s.decode, s.decode_in, what);
}

void LlmSession::decode_greedy(int64_t position, const std::string& what) {
  Impl& s = *impl_;
  if (!device_) {
    const int64_t t = token();
    s.greedy.push_back(t);
    decode(t, position, what);
    return;
  }
  if (s.history >= s.max_context) fail("more greedy steps than the cache has rows");
  cuda_ok(enqueue_feed(s.d_next, 0, s.d_decode, position, s.d_decode + 1, s.d_history,
                       s.history++, s.stream),
          "feeding the decode inputs");
  s.execute(s.decode, s.decode_in, what);
}

int64_t LlmSession::token() {
  Impl& s = *impl_;
  if (!device_) return s.output(1).const_data_ptr<int64_t>()[0];
  cuda_ok(cudaMemcpyAsync(s.p_next, s.d_next, sizeof(int64_t), cudaMemcpyDeviceToHost, s.stream),
          "copying the token to the host");
  cuda_ok(cudaStreamSynchronize(s.stream), "waiting for the step");
  return *s.p_next;
}

const float* LlmSession::logits() {
  Impl& s = *impl_;
  if (!device_) return s.output(0).const_data_ptr<float>();
  cuda_ok(cudaMemcpyAsync(s.p_logits, s.d_logits, size_t(s.vocab) * sizeof(float),
                          cudaMemcpyDeviceToHost, s.stream),
          "copying the logits to the host");
  cuda_ok(cudaStreamSynchronize(s.stream), "waiting for the step");
  return s.p_logits;
}

std::vector<int64_t> LlmSession::greedy_tokens() {
  Impl& s = *impl_;
  if (!device_) return s.greedy;
  cuda_ok(cudaMemcpyAsync(s.p_history, s.d_history, size_t(s.history) * sizeof(int64_t),
                          cudaMemcpyDeviceToHost, s.stream),
          "copying the tokens to the host");
  cuda_ok(cudaStreamSynchronize(s.stream), "waiting for the steps");
  return std::vector<int64_t>(s.p_history, s.p_history + s.history);
}

}  // namespace kiln::runner
