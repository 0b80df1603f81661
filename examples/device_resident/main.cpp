// Runs a device-resident Kiln program (examples/device_resident/export.py): the inputs are
// cudaMalloc'd and filled from files, `forward` runs on this app's CUDA stream with device tensors,
// and the outputs come back as device pointers. They are copied to the host only to compare them
// with the expected (eager) outputs. Prints the max error and the median latency of one execute
// (enqueue + the stream finishing), which is the device-resident latency figure.
//
//   device_resident model.pte --input x.bin --input r.bin --expected o0.bin --expected o1.bin
//                   [--iterations N] [--tolerance T]
//
// Float32 inputs and outputs. Exit status 0 only when every output is device memory and within
// the tolerance.

#include <executorch/extension/module/module.h>
#include <executorch/extension/tensor/tensor.h>
#include <executorch/runtime/platform/runtime.h>
#include <kiln/executorch/stream.h>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

namespace et = executorch::runtime;
using executorch::aten::Device;
using executorch::aten::DeviceType;
using executorch::aten::SizesType;
using executorch::extension::Module;
using executorch::extension::TensorPtr;
using executorch::extension::make_tensor_ptr;

namespace {

int fail(const std::string& why) {
  std::fprintf(stderr, "device_resident: %s\n", why.c_str());
  return 1;
}

bool cuda_ok(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return true;
  std::fprintf(stderr, "device_resident: %s: %s\n", what, cudaGetErrorString(e));
  return false;
}

bool read_floats(const std::string& path, size_t n, std::vector<float>& out) {
  std::ifstream f(path, std::ios::binary);
  std::vector<char> bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  if (!f.good() && !f.eof()) return false;
  if (bytes.size() != n * sizeof(float)) {
    std::fprintf(stderr, "device_resident: %s has %zu bytes, expected %zu\n", path.c_str(),
                 bytes.size(), n * sizeof(float));
    return false;
  }
  out.resize(n);
  std::memcpy(out.data(), bytes.data(), bytes.size());
  return true;
}

bool is_device_memory(const void* p) {
  cudaPointerAttributes attr{};
  if (cudaPointerGetAttributes(&attr, p) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return attr.type == cudaMemoryTypeDevice;
}

// A float32 device buffer shaped like one method input or output, as an ExecuTorch tensor.
struct DeviceTensor {
  std::vector<SizesType> sizes;
  size_t numel = 1;
  void* data = nullptr;
  TensorPtr tensor;
};

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) return fail("usage: device_resident model.pte --input F... --expected F... "
                            "[--iterations N] [--tolerance T]");
  std::vector<std::string> input_files, expected_files;
  int iterations = 100;
  double tolerance = 1e-3;
  for (int i = 2; i < argc; ++i) {
    const std::string a = argv[i];
    if (i + 1 >= argc) return fail(a + " needs a value");
    const std::string v = argv[++i];
    if (a == "--input") input_files.push_back(v);
    else if (a == "--expected") expected_files.push_back(v);
    else if (a == "--iterations") iterations = std::max(1, std::atoi(v.c_str()));
    else if (a == "--tolerance") tolerance = std::atof(v.c_str());
    else return fail("unknown option " + a);
  }
  et::runtime_init();

  Module module(argv[1]);
  if (module.load_method("forward") != et::Error::Ok) return fail("cannot load 'forward'");
  auto meta = module.method_meta("forward");
  if (!meta.ok()) return fail("cannot read the method's metadata");
  if (meta->num_inputs() != input_files.size() || meta->num_outputs() != expected_files.size()) {
    return fail("the method takes " + std::to_string(meta->num_inputs()) + " inputs and " +
                std::to_string(meta->num_outputs()) + " outputs; give one --input / --expected each");
  }

  cudaStream_t stream = nullptr;
  if (!cuda_ok(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate")) return 1;
  const Device cuda(DeviceType::CUDA, 0);
  std::vector<DeviceTensor> inputs(meta->num_inputs()), outputs(meta->num_outputs());
  auto make = [&](DeviceTensor& d, et::Result<et::TensorInfo> info) {
    if (!info.ok() || info->scalar_type() != executorch::aten::ScalarType::Float) return false;
    d.sizes.assign(info->sizes().begin(), info->sizes().end());
    for (SizesType s : d.sizes) d.numel *= static_cast<size_t>(s);
    if (!cuda_ok(cudaMalloc(&d.data, d.numel * sizeof(float)), "cudaMalloc")) return false;
    d.tensor = make_tensor_ptr(d.sizes, d.data, executorch::aten::ScalarType::Float, cuda);
    return true;
  };
  for (size_t i = 0; i < inputs.size(); ++i) {
    std::vector<float> host;
    if (!make(inputs[i], meta->input_tensor_meta(i))) return fail("input " + std::to_string(i) + " is not a float32 tensor");
    if (!read_floats(input_files[i], inputs[i].numel, host)) return fail("cannot read " + input_files[i]);
    // The inputs are produced on the app's stream; Kiln runs after them on that same stream.
    if (!cuda_ok(cudaMemcpyAsync(inputs[i].data, host.data(), host.size() * sizeof(float),
                                 cudaMemcpyHostToDevice, stream), "filling an input")) return 1;
    if (!cuda_ok(cudaStreamSynchronize(stream), "filling an input")) return 1;  // `host` goes away
    if (module.set_input("forward", *inputs[i].tensor, i) != et::Error::Ok) return fail("set_input failed");
  }
  for (size_t i = 0; i < outputs.size(); ++i) {
    if (!make(outputs[i], meta->output_tensor_meta(i))) return fail("output " + std::to_string(i) + " is not a float32 tensor");
    if (module.set_output("forward", *outputs[i].tensor, i) != et::Error::Ok) {
      return fail("set_output failed: was the program exported with device_resident=True?");
    }
  }

  kiln::ScopedStream on_app_stream(stream);  // Kiln enqueues on `stream` for this thread
  std::vector<double> latency_ms, enqueue_ms;
  std::vector<et::EValue> result;
  for (int it = 0; it < iterations + 1; ++it) {  // the first run is a warm-up (graph capture)
    const auto t0 = std::chrono::steady_clock::now();
    auto r = module.execute("forward");
    const auto t1 = std::chrono::steady_clock::now();
    if (!r.ok()) return fail("execute failed: error " + std::to_string(static_cast<int>(r.error())));
    // execute returned once the work was enqueued (all bindings are device memory): wait here.
    if (!cuda_ok(cudaStreamSynchronize(stream), "cudaStreamSynchronize")) return 1;
    const auto t2 = std::chrono::steady_clock::now();
    if (it > 0) {
      latency_ms.push_back(std::chrono::duration<double, std::milli>(t2 - t0).count());
      enqueue_ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
    }
    result = std::move(r.get());
  }

  bool ok = true;
  double max_error = 0.0;
  for (size_t i = 0; i < outputs.size(); ++i) {
    const void* p = result.at(i).toTensor().const_data_ptr();
    const bool device = is_device_memory(p);
    std::printf("output[%zu] pointer=%p device_memory=%s same_as_bound=%s\n", i, p,
                device ? "yes" : "no", p == outputs[i].data ? "yes" : "no");
    ok = ok && device;
    std::vector<float> got(outputs[i].numel), want;
    if (!cuda_ok(cudaMemcpy(got.data(), p, got.size() * sizeof(float), cudaMemcpyDeviceToHost),
                 "reading an output back")) return 1;
    if (!read_floats(expected_files[i], outputs[i].numel, want)) return fail("cannot read " + expected_files[i]);
    for (size_t k = 0; k < got.size(); ++k) {
      const double e = std::fabs(static_cast<double>(got[k]) - want[k]);
      max_error = std::isnan(e) ? INFINITY : std::max(max_error, e);
    }
  }
  auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  std::printf("max_error=%.3g tolerance=%.3g\n", max_error, tolerance);
  std::printf("median_latency_ms=%.4f median_enqueue_ms=%.4f iterations=%d\n", median(latency_ms),
              median(enqueue_ms), iterations);
  ok = ok && max_error <= tolerance;
  std::printf("%s\n", ok ? "PASS" : "FAIL");
  for (auto& d : inputs) cudaFree(d.data);
  for (auto& d : outputs) cudaFree(d.data);
  cudaStreamDestroy(stream);
  return ok ? 0 : 1;
}
