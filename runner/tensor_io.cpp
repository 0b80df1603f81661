// kiln_runner's input tensors and printed outputs (tensor_io.h).
#include "runner/tensor_io.h"

#include <executorch/runtime/core/device_allocator.h>
#include <executorch/runtime/core/exec_aten/util/scalar_type_util.h>

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <type_traits>

#include "runner/diagnostics.h"

namespace kiln::runner {
namespace {

using executorch::aten::ScalarType;
using executorch::aten::Tensor;
using executorch::aten::TensorImpl;
using executorch::runtime::etensor::DeviceType;

void fill_ones(ScalarType t, void* p, size_t numel) {
  switch (t) {
#define KILN_FILL(ctype, name)                                    \
  case ScalarType::name:                                          \
    std::fill_n(static_cast<ctype*>(p), numel, static_cast<ctype>(1)); \
    return;
    ET_FORALL_REAL_TYPES_AND3(Bool, Half, BFloat16, KILN_FILL)
#undef KILN_FILL
    default:
      fail(std::string("cannot fill an input of dtype ") + executorch::runtime::toString(t) +
           " with ones; pass it with --input");
  }
}

std::vector<char> read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) fail("cannot open input file '" + path + "'");
  return std::vector<char>((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

// Copies a tensor's bytes to host memory (through the registered device allocator when the tensor
// lives on a GPU).
std::vector<uint8_t> host_bytes(const Tensor& t) {
  std::vector<uint8_t> out(t.nbytes());
  if (t.nbytes() == 0) return out;
  const auto device = t.unsafeGetTensorImpl()->device_type();
  if (device == executorch::runtime::etensor::DeviceType::CPU) {
    std::memcpy(out.data(), t.const_data_ptr(), t.nbytes());
    return out;
  }
  et::DeviceAllocator* alloc = et::get_device_allocator(device);
  if (alloc == nullptr) {
    fail("an output lives on a device with no registered device allocator; link "
         "kiln::executorch_backend");
  }
  et::Error err = alloc->copy_device_to_host(out.data(), t.const_data_ptr(), t.nbytes(),
                                             t.unsafeGetTensorImpl()->device_index());
  if (err != et::Error::Ok) fail("copy of an output from the device", err);
  return out;
}

std::string format_value(ScalarType t, const uint8_t* p) {
  char buf[64];
  switch (t) {
#define KILN_FMT(ctype, name)                                                     \
  case ScalarType::name: {                                                         \
    ctype v;                                                                       \
    std::memcpy(&v, p, sizeof(v));                                                 \
    if constexpr (std::is_integral_v<ctype>) {                                     \
      std::snprintf(buf, sizeof(buf), "%" PRId64, static_cast<int64_t>(v));        \
    } else {                                                                       \
      std::snprintf(buf, sizeof(buf), "%.6g", static_cast<double>(v));             \
    }                                                                              \
    return buf;                                                                    \
  }
    ET_FORALL_REAL_TYPES_AND2(Half, BFloat16, KILN_FMT)
#undef KILN_FMT
    case ScalarType::Bool:
      return *p ? "1" : "0";
    default:
      return "?";
  }
}

}  // namespace

std::string shape_string(const std::vector<int64_t>& sizes) {
  std::string s = "[";
  for (size_t i = 0; i < sizes.size(); ++i) {
    s += (i ? "," : "") + std::to_string(sizes[i]);
  }
  return s + "]";
}

et::etensor::Device value_device(const et::EValue& v) {
  if (!v.isTensor()) return {DeviceType::CPU, 0};
  const TensorImpl* impl = v.toTensor().unsafeGetTensorImpl();
  return {impl->device_type(), impl->device_index()};
}

std::vector<et::etensor::Device> input_devices(et::Method& method) {
  std::vector<et::etensor::Device> devices;
  // The pinned ExecuTorch states an input's device only on its EValue, whose accessor is
  // deprecated (MethodMeta's TensorInfo has no device).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
  for (size_t i = 0; i < method.inputs_size(); ++i) devices.push_back(value_device(method.get_input(i)));
#pragma GCC diagnostic pop
  return devices;
}

void make_inputs(const et::MethodMeta& meta, const Run& run, const Options& opts,
                 const std::vector<et::etensor::Device>& devices, std::vector<InputTensor>& keep) {
  keep.clear();
  keep.resize(meta.num_inputs());
  for (const auto& [index, _] : run.input_files) {
    if (index >= meta.num_inputs()) {
      fail("--input " + std::to_string(index) + "=...: method '" + opts.method + "' has only " +
           std::to_string(meta.num_inputs()) + " inputs");
    }
  }
  for (size_t i = 0; i < meta.num_inputs(); ++i) {
    auto tag = meta.input_tag(i);
    if (!tag.ok()) fail("input_tag(" + std::to_string(i) + ")", tag.error());
    if (tag.get() != et::Tag::Tensor) {
      fail("input " + std::to_string(i) + " is not a tensor; kiln_runner feeds tensors only");
    }
    auto info = meta.input_tensor_meta(i);
    if (!info.ok()) fail("input_tensor_meta(" + std::to_string(i) + ")", info.error());
    InputTensor& in = keep[i];
    auto s = info->sizes();
    in.sizes.assign(s.begin(), s.end());
    auto d = info->dim_order();
    in.dim_order.assign(d.begin(), d.end());
    if (auto it = opts.shapes.find(i); it != opts.shapes.end()) {
      if (it->second.size() != in.sizes.size()) {
        fail("--shape " + std::to_string(i) + ": rank " + std::to_string(it->second.size()) +
             " but the input has rank " + std::to_string(in.sizes.size()));
      }
      // The serialized sizes of a dynamic input are its upper bounds: say so before ExecuTorch
      // refuses the resize with a bare NotSupported.
      for (size_t d = 0; d < in.sizes.size(); ++d) {
        if (it->second[d] > in.sizes[d]) {
          std::vector<int64_t> bound(in.sizes.begin(), in.sizes.end());
          fail("--shape " + std::to_string(i) + "=" + shape_string(it->second) + " is past the bound " +
               shape_string(bound) + " input " + std::to_string(i) +
               " was exported with (dimension " + std::to_string(d) + "); export with a larger max");
        }
      }
      in.sizes.assign(it->second.begin(), it->second.end());
    }
    size_t numel = 1;
    for (auto v : in.sizes) numel *= static_cast<size_t>(v);
    const ScalarType dtype = info->scalar_type();
    const size_t nbytes = numel * executorch::runtime::elementSize(dtype);
    in.data = std::make_unique<HostBuffer>(nbytes);
    if (auto f = run.input_files.find(i); f != run.input_files.end()) {
      std::vector<char> bytes = read_file(f->second);
      if (bytes.size() != nbytes) {
        std::vector<int64_t> shape(in.sizes.begin(), in.sizes.end());
        fail("input " + std::to_string(i) + " ('" + f->second + "') has " +
             std::to_string(bytes.size()) + " bytes, expected " + std::to_string(nbytes) +
             " for dtype " + executorch::runtime::toString(dtype) + " shape " +
             shape_string(shape) + " (use --shape for a dynamic dimension)");
      }
      std::memcpy(in.data->data.get(), bytes.data(), nbytes);
    } else {
      fill_ones(dtype, in.data->data.get(), numel);
    }
    void* data = in.data->data.get();
    const et::etensor::Device device = devices[i];
    if (device.type() != DeviceType::CPU) {
      const std::string what = "input " + std::to_string(i);
      in.device = device_memory(device, nbytes, what);
      et::Error err = in.device->alloc->copy_host_to_device(in.device->ptr, data, nbytes, device.index());
      if (err != et::Error::Ok) fail("copying " + what + " to the device", err);
      data = in.device->ptr;
    }
    in.impl = std::make_unique<TensorImpl>(dtype, static_cast<ssize_t>(in.sizes.size()),
                                           in.sizes.data(), data, in.dim_order.data(), nullptr,
                                           executorch::aten::TensorShapeDynamism::DYNAMIC_BOUND,
                                           device.type(), device.index());
  }
}

void bind_inputs(et::Method& method, std::vector<InputTensor>& inputs) {
  for (size_t i = 0; i < inputs.size(); ++i) {
    et::Error err = method.set_input(et::EValue(Tensor(inputs[i].impl.get())), i);
    if (err != et::Error::Ok) fail("set_input(" + std::to_string(i) + ")", err);
  }
}

void print_outputs(et::Method& method, const Options& opts, size_t run_index) {
  for (size_t i = 0; i < method.outputs_size(); ++i) {
    const et::EValue& v = method.get_output(i);
    if (!v.isTensor()) {
      if (v.isInt()) std::printf("output[%zu] value=%" PRId64 " type=Int\n", i, v.toInt());
      else if (v.isDouble()) std::printf("output[%zu] value=%.6g type=Double\n", i, v.toDouble());
      else if (v.isBool()) std::printf("output[%zu] value=%d type=Bool\n", i, v.toBool() ? 1 : 0);
      else std::printf("output[%zu] value=none type=None\n", i);
      continue;
    }
    const Tensor& t = v.toTensor();
    std::vector<int64_t> shape(t.sizes().begin(), t.sizes().end());
    std::printf("output[%zu] shape=%s dtype=%s\n", i, shape_string(shape).c_str(),
                executorch::runtime::toString(t.scalar_type()));
    std::vector<uint8_t> bytes = host_bytes(t);
    const size_t elem = t.element_size();
    const size_t n = std::min<size_t>(opts.values, static_cast<size_t>(t.numel()));
    std::string line;
    for (size_t k = 0; k < n; ++k) {
      line += (k ? " " : "") + format_value(t.scalar_type(), bytes.data() + k * elem);
    }
    std::printf("%s\n", line.c_str());
    if (!opts.output_dir.empty()) {
      std::error_code ec;
      std::filesystem::create_directories(opts.output_dir, ec);
      std::string name = opts.runs.size() > 1
                             ? "run" + std::to_string(run_index) + "_output_" + std::to_string(i)
                             : "output_" + std::to_string(i);
      std::string path = opts.output_dir + "/" + name + ".bin";
      std::ofstream f(path, std::ios::binary);
      f.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
      if (!f) fail("cannot write '" + path + "'");
    }
  }
}

}  // namespace kiln::runner
