// kiln_runner: the reference runner. Loads a .pte with the ExecuTorch runtime from the pinned wheel,
// runs one method and prints its outputs in the format kiln-verify reads:
//
//   output[0] shape=[64,64] dtype=Float
//   2 2 2 2 2 2 2 2
//
// Whatever registered itself in this process (ExecuTorch's CPU kernels, which this binary links;
// Kiln's backend and device pieces when linked or preloaded) is what runs the program.

#include <executorch/extension/data_loader/file_data_loader.h>
#include <executorch/extension/memory_allocator/malloc_memory_allocator.h>
#include <executorch/runtime/core/device_allocator.h>
#include <executorch/runtime/core/exec_aten/util/scalar_type_util.h>
#include <executorch/runtime/executor/method.h>
#include <executorch/runtime/executor/program.h>
#include <executorch/runtime/platform/platform.h>
#include <executorch/runtime/platform/runtime.h>

#include <cuda_runtime.h>
#include <dlfcn.h>

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "runner/options.h"
#include "runtime/cpu_kernels/cpu_kernels.h"

namespace et = executorch::runtime;
using executorch::aten::ScalarType;
using executorch::aten::Tensor;
using executorch::aten::TensorImpl;
using executorch::extension::FileDataLoader;
using executorch::extension::MallocMemoryAllocator;

namespace {

// What to do about each error, by the stage it happened in. The ExecuTorch log line printed just
// before (when logging is on) names the exact operator, backend or tensor.
const char* hint(et::Error e) {
  switch (e) {
    case et::Error::OperatorMissing:
      return "an operator the program calls has no registered kernel (the 'Missing operator' log "
             "line above names it); link ExecuTorch's CPU kernels (executorch::kernels_optimized) "
             "for portable operators, or kiln::device_copy_kernels for et_copy::_h2d_copy.out / "
             "et_copy::_d2h_copy.out";
    case et::Error::NotFound:
      return "something the program names is not registered here: a delegate (link its backend "
             "library, e.g. kiln::executorch_backend for KilnBackend or executorch::backend_xnnpack for "
             "XnnpackBackend, with --no-as-needed) or a "
             "method (see the list of methods)";
    case et::Error::InvalidProgram:
      return "the file is not a valid ExecuTorch program (truncated, corrupt or not a .pte); "
             "re-export it";
    case et::Error::InvalidArgument:
      return "an argument does not match what the program expects (dtype, shape or count); check "
             "the method's inputs";
    case et::Error::NotSupported:
      return "the program needs a feature this runtime build does not have";
    case et::Error::MemoryAllocationFailed:
    case et::Error::DelegateMemoryAllocationFailed:
      return "out of memory; free memory or use a smaller program";
    case et::Error::DelegateInvalidCompatibility:
      return "a delegate blob was built for another backend version or device; re-export with the "
             "installed Kiln";
    case et::Error::AccessFailed:
      return "the file could not be read; check the path and permissions";
    default:
      return "see the ExecuTorch log line above";
  }
}

// ExecuTorch's log, filtered by KILN_LOG (debug, info, error; default: errors and fatals only):
// the wheel's kernels log CPU probing at info level on every load, which buries the output.
et_pal_log_level_t g_min_log_level = kError;

// What a failed method load could not find, read off ExecuTorch's own log lines ("kernel 'NAME'
// not found", "Backend NAME is not registered." / "... is not available."), so the runner's final
// message can name it and say what to do.
std::string g_missing_operator;
std::string g_backend_problem;

void remember_missing_piece(const char* message, size_t length) {
  const std::string text(message, length);
  const std::string before = "kernel '", after = "' not found";
  const size_t a = text.find(before);
  const size_t b = text.find(after);
  if (a != std::string::npos && b != std::string::npos && b > a) {
    g_missing_operator = text.substr(a + before.size(), b - a - before.size());
  }
  if (text.rfind("Backend ", 0) == 0 &&
      (text.find("is not registered") != std::string::npos || text.find("is not available") != std::string::npos)) {
    g_backend_problem = text;
  }
}

void emit_log(et_timestamp_t, et_pal_log_level_t level, const char* filename, const char*,
              size_t line, const char* message, size_t length) {
  const auto rank = [](et_pal_log_level_t l) {
    switch (l) {
      case kDebug: return 0;
      case kInfo: return 1;
      case kError: return 2;
      case kFatal: return 3;
      default: return 2;
    }
  };
  remember_missing_piece(message, length);
  if (rank(level) < rank(g_min_log_level)) return;
  std::fprintf(stderr, "%c executorch:%s:%zu] %.*s\n", static_cast<char>(level), filename, line,
               static_cast<int>(length), message);
}

void install_log_filter() {
  const char* env = std::getenv("KILN_LOG");
  const std::string want = env ? env : "error";
  g_min_log_level = want == "debug" ? kDebug : want == "info" ? kInfo : kError;
  et::register_pal(et::PalImpl::create(emit_log, __FILE__));
}

// "OperatorMissing" rather than ExecuTorch's "Error::OperatorMissing".
const char* error_name(et::Error e) {
  const char* s = et::to_string(e);
  return std::strncmp(s, "Error::", 7) == 0 ? s + 7 : s;
}

[[noreturn]] void fail(const std::string& what, et::Error e) {
  std::string why = hint(e);
  if (e == et::Error::OperatorMissing && !g_missing_operator.empty()) {
    const bool device_copy = g_missing_operator.rfind("et_copy::", 0) == 0;
    why = "no kernel is registered for " + g_missing_operator + "; link " +
          (device_copy ? std::string("kiln::device_copy_kernels (libkiln_device_copy_kernels.so) or "
                                     "executorch::kernels_optimized, not both")
                       : std::string("a kernel library that provides it (executorch::kernels_optimized "
                                     "for ExecuTorch's portable ATen operators)"));
  }
  if (e == et::Error::NotFound && g_backend_problem.find("is not registered") != std::string::npos) {
    why = g_backend_problem + " Link its backend library (kiln::executorch_backend for KilnBackend, "
          "executorch::backend_xnnpack for XnnpackBackend) "
          "with --no-as-needed, or load it before the program";
  } else if (e == et::Error::NotFound && g_backend_problem.find("is not available") != std::string::npos) {
    why = g_backend_problem + " The backend is linked but cannot run on this machine; the line above "
          "says why (KilnBackend needs an NVIDIA GPU with compute capability 9.0 or newer)";
  }
  std::fprintf(stderr, "kiln_runner: %s failed: %s (0x%02x): %s\n", what.c_str(), error_name(e),
               static_cast<unsigned>(e), why.c_str());
  std::exit(1);
}

[[noreturn]] void fail(const std::string& message) {
  std::fprintf(stderr, "kiln_runner: %s\n", message.c_str());
  std::exit(1);
}

std::string shape_string(const std::vector<int64_t>& sizes) {
  std::string s = "[";
  for (size_t i = 0; i < sizes.size(); ++i) {
    s += (i ? "," : "") + std::to_string(sizes[i]);
  }
  return s + "]";
}

// Host memory for one input or arena; 64-byte aligned because kernels may vectorise.
struct HostBuffer {
  std::unique_ptr<uint8_t, decltype(&std::free)> data{nullptr, &std::free};
  size_t nbytes = 0;
  explicit HostBuffer(size_t n) : nbytes(n) {
    data.reset(static_cast<uint8_t*>(std::aligned_alloc(64, ((n + 63) / 64) * 64 + 64)));
    if (!data) fail("cannot allocate " + std::to_string(n) + " bytes of host memory");
    std::memset(data.get(), 0, n);
  }
};

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

using executorch::runtime::etensor::DeviceType;

// Device memory from the registered allocator of a device-resident program's input or output.
struct DeviceMemory {
  et::DeviceAllocator* alloc = nullptr;
  void* ptr = nullptr;
  int index = 0;
  DeviceMemory() = default;
  DeviceMemory(const DeviceMemory&) = delete;
  DeviceMemory& operator=(const DeviceMemory&) = delete;
  ~DeviceMemory() {
    if (ptr != nullptr) alloc->deallocate(ptr, index);
  }
};

// The device a method input or output tensor lives on (CPU unless the program was exported
// device-resident), as the loaded method describes it.
et::etensor::Device value_device(const et::EValue& v) {
  if (!v.isTensor()) return {DeviceType::CPU, 0};
  const TensorImpl* impl = v.toTensor().unsafeGetTensorImpl();
  return {impl->device_type(), impl->device_index()};
}

std::unique_ptr<DeviceMemory> device_memory(et::etensor::Device device, size_t nbytes,
                                            const std::string& what) {
  auto m = std::make_unique<DeviceMemory>();
  m->alloc = et::get_device_allocator(device.type());
  m->index = device.index();
  if (m->alloc == nullptr) {
    fail(what + " lives on a GPU but no device allocator is registered; link "
         "kiln::executorch_backend");
  }
  auto p = m->alloc->allocate(std::max<size_t>(nbytes, 1), device.index());
  if (!p.ok()) fail("allocating " + std::to_string(nbytes) + " bytes of device memory for " + what, p.error());
  m->ptr = p.get();
  return m;
}

// One input tensor the runner owns: metadata arrays and data outlive the method. A
// device-resident input's bytes are copied to device memory once, before the run's executes.
struct InputTensor {
  std::vector<TensorImpl::SizesType> sizes;
  std::vector<TensorImpl::DimOrderType> dim_order;
  std::unique_ptr<HostBuffer> data;
  std::unique_ptr<DeviceMemory> device;
  std::unique_ptr<TensorImpl> impl;
};

std::vector<char> read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) fail("cannot open input file '" + path + "'");
  return std::vector<char>((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
}

// Builds the run's input tensors: ones, or the bytes of the files given with --input.
void make_inputs(const et::MethodMeta& meta, const kiln::runner::Run& run,
                 const kiln::runner::Options& opts, const std::vector<et::etensor::Device>& devices,
                 std::vector<InputTensor>& keep) {
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

// Hands the inputs to the method. Called before every execute: a memory-planned input's bytes may
// share arena space with intermediates of the previous execution, so they are copied in again.
void bind_inputs(et::Method& method, std::vector<InputTensor>& inputs) {
  for (size_t i = 0; i < inputs.size(); ++i) {
    et::Error err = method.set_input(et::EValue(Tensor(inputs[i].impl.get())), i);
    if (err != et::Error::Ok) fail("set_input(" + std::to_string(i) + ")", err);
  }
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

void print_outputs(et::Method& method, const kiln::runner::Options& opts, size_t run_index) {
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

// Memory-planned arenas, each on the device the program asks for. Host arenas start zeroed, which
// is what stateful programs (mutable buffers) expect on a fresh load.
class PlannedMemory {
 public:
  PlannedMemory(const et::MethodMeta& meta) {
    const size_t n = meta.num_memory_planned_buffers();
    for (size_t i = 0; i < n; ++i) {
      auto size = meta.memory_planned_buffer_size(i);
      if (!size.ok()) fail("memory_planned_buffer_size(" + std::to_string(i) + ")", size.error());
      auto device = meta.memory_planned_buffer_device(i);
      if (!device.ok()) fail("memory_planned_buffer_device(" + std::to_string(i) + ")", device.error());
      const size_t nbytes = static_cast<size_t>(size.get());
      devices_.push_back(device.get());
      if (device->type() == executorch::runtime::etensor::DeviceType::CPU) {
        host_.push_back(std::make_unique<HostBuffer>(nbytes));
        spans_.emplace_back(host_.back()->data.get(), nbytes);
        continue;
      }
      et::DeviceAllocator* alloc = et::get_device_allocator(device->type());
      if (alloc == nullptr) {
        fail("the program plans buffer " + std::to_string(i) +
             " on a GPU but no device allocator is registered for it; link "
             "kiln::executorch_backend (or preload libkiln_executorch_backend.so)");
      }
      auto p = alloc->allocate(nbytes, device->index());
      if (!p.ok() && p.error() == et::Error::NotFound) {
        fail("allocating " + std::to_string(nbytes) + " bytes of device memory failed: NotFound "
             "(0x20): no usable CUDA device (the line above says why); this program keeps Kiln "
             "delegate tensors in GPU memory and needs an NVIDIA GPU");
      }
      if (!p.ok()) fail("allocating " + std::to_string(nbytes) + " bytes of device memory", p.error());
      device_.push_back({alloc, p.get(), device->index()});
      // Zero the arena as for host memory: mutable buffers read it before anything writes it.
      std::vector<uint8_t> zeros(nbytes, 0);
      et::Error err = alloc->copy_host_to_device(p.get(), zeros.data(), nbytes, device->index());
      if (err != et::Error::Ok) fail("zeroing a device arena", err);
      spans_.emplace_back(static_cast<uint8_t*>(p.get()), nbytes);
    }
  }
  ~PlannedMemory() {
    for (auto& d : device_) d.alloc->deallocate(d.ptr, d.index);
  }
  et::HierarchicalAllocator allocator() {
    return et::HierarchicalAllocator({spans_.data(), spans_.size()}, {devices_.data(), devices_.size()});
  }

 private:
  struct DeviceArena {
    et::DeviceAllocator* alloc;
    void* ptr;
    executorch::runtime::etensor::DeviceIndex index;
  };
  std::vector<std::unique_ptr<HostBuffer>> host_;
  std::vector<DeviceArena> device_;
  std::vector<et::Span<uint8_t>> spans_;
  std::vector<executorch::runtime::etensor::Device> devices_;
};

// Kiln's copy counters (runtime/backend/version.h), looked up at run time so the runner also runs
// with a backend library that lacks them. Returns false when there are none.
struct CopyCounts {
  uint64_t host_to_device = 0, device_to_host = 0, executes = 0;
};

bool read_copy_counters(CopyCounts& c) {
  using Fn = void (*)(uint64_t*, uint64_t*, uint64_t*);
  static const auto fn = reinterpret_cast<Fn>(dlsym(RTLD_DEFAULT, "kiln_executorch_copy_counters"));
  if (fn == nullptr) return false;
  fn(&c.host_to_device, &c.device_to_host, &c.executes);
  return true;
}

// Device memory Kiln holds after load_method, when Kiln's backend is in the process.
void print_kiln_device_memory() {
  using Fn = uint64_t (*)();
  static const auto weights = reinterpret_cast<Fn>(dlsym(RTLD_DEFAULT, "kiln_executorch_weight_bytes"));
  static const auto activations =
      reinterpret_cast<Fn>(dlsym(RTLD_DEFAULT, "kiln_executorch_activation_bytes"));
  if (weights != nullptr && activations != nullptr) {
    std::printf("kiln_device_bytes weights=%llu activations=%llu\n",
                static_cast<unsigned long long>(weights()),
                static_cast<unsigned long long>(activations()));
  }
}

// Kiln's per-op profiler (runtime/backend/version.h), looked up at run time like the copy
// counters. All four or nothing.
struct Profiler {
  void (*set)(int) = nullptr;
  void (*reset)() = nullptr;
  size_t (*report)(char*, size_t) = nullptr;
  double (*total_ms)() = nullptr;
  bool available() const { return set && reset && report && total_ms; }
};

const Profiler& profiler() {
  static const Profiler p = [] {
    Profiler f;
    f.set = reinterpret_cast<void (*)(int)>(dlsym(RTLD_DEFAULT, "kiln_executorch_set_profiling"));
    f.reset = reinterpret_cast<void (*)()>(dlsym(RTLD_DEFAULT, "kiln_executorch_reset_profile"));
    f.report = reinterpret_cast<size_t (*)(char*, size_t)>(
        dlsym(RTLD_DEFAULT, "kiln_executorch_profile_report"));
    f.total_ms = reinterpret_cast<double (*)()>(
        dlsym(RTLD_DEFAULT, "kiln_executorch_profile_total_ms"));
    return f;
  }();
  return p;
}

// The --profile section of one run: every Kiln engine's ops sorted by GPU time, then the sum of
// op time per method execute against the execute's wall time.
void print_profile(size_t run_index, const std::string& method, const std::vector<double>& ms) {
  const Profiler& p = profiler();
  std::printf("# profile of run %zu: %zu executes of '%s'; Kiln ops run eagerly (no CUDA graph "
              "replay), each timed with CUDA events\n",
              run_index, ms.size(), method.c_str());
  if (!p.available()) {
    std::printf("profile unavailable: no kiln_executorch_set_profiling in the process (load "
                "libkiln_executorch_backend.so)\n");
    return;
  }
  std::string text(p.report(nullptr, 0) + 1, '\0');
  text.resize(p.report(text.data(), text.size()));
  if (text.empty()) {
    std::printf("profile: no Kiln engine ran (the program has no Kiln delegates, or none "
                "executed); nothing to profile\n");
    return;
  }
  std::printf("%s", text.c_str());
  double wall = 0.0;
  for (double v : ms) wall += v;
  const double n = static_cast<double>(ms.size());
  const double op_ms = p.total_ms();
  std::printf("profile_total kiln_op_ms_per_execute=%.4f wall_ms_per_execute=%.4f "
              "kiln_op_share=%.1f%% (wall: the whole method execute, CPU ops, copies and "
              "profiling syncs included)\n",
              op_ms / n, wall / n, wall > 0 ? 100.0 * op_ms / wall : 0.0);
}

void cuda_ok(cudaError_t status, const char* what) {
  if (status != cudaSuccess) fail(std::string(what) + " failed: " + cudaGetErrorString(status));
}

// --device-timing: the program's executes on a stream the runner hands Kiln, so execute only
// enqueues (kiln/executorch/stream.h). Two figures: the GPU span of one execute between CUDA
// events recorded on that stream around it (how torch's CUDA-event timings are taken), and the
// wall time per execute of N executes enqueued back to back then waited for once.
void device_timing(et::Method& method, std::vector<InputTensor>& inputs,
                   const kiln::runner::Options& opts) {
  using SetStream = CUstream_st* (*)(CUstream_st*);
  const auto set_stream = reinterpret_cast<SetStream>(dlsym(RTLD_DEFAULT, "kiln_executorch_set_stream"));
  if (set_stream == nullptr) {
    fail("--device-timing: no kiln_executorch_set_stream in the process (load "
         "libkiln_executorch_backend.so)");
  }
  cudaStream_t stream = nullptr;
  cudaEvent_t start = nullptr, end = nullptr;
  cuda_ok(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
  cuda_ok(cudaEventCreate(&start), "cudaEventCreate");
  cuda_ok(cudaEventCreate(&end), "cudaEventCreate");
  CUstream_st* previous = set_stream(stream);
  auto execute = [&](const char* what) {
    bind_inputs(method, inputs);
    et::Error err = method.execute();
    if (err != et::Error::Ok) fail(std::string("execute('") + opts.method + "') " + what, err);
  };
  for (int w = 0; w < std::max(opts.warmup, 3); ++w) execute("(device-timing warm-up)");
  cuda_ok(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  const int n = opts.device_timing;
  std::vector<double> span_ms;
  for (int i = 0; i < n; ++i) {
    cuda_ok(cudaEventRecord(start, stream), "cudaEventRecord");
    execute("(device-timing)");
    cuda_ok(cudaEventRecord(end, stream), "cudaEventRecord");
    cuda_ok(cudaEventSynchronize(end), "cudaEventSynchronize");
    float ms = 0.0f;
    cuda_ok(cudaEventElapsedTime(&ms, start, end), "cudaEventElapsedTime");
    span_ms.push_back(ms);
  }
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < n; ++i) execute("(device-timing, back to back)");
  const auto t1 = std::chrono::steady_clock::now();
  cuda_ok(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  const auto t2 = std::chrono::steady_clock::now();
  set_stream(previous);
  cudaEventDestroy(start);
  cudaEventDestroy(end);
  cudaStreamDestroy(stream);
  std::sort(span_ms.begin(), span_ms.end());
  const double per = std::chrono::duration<double, std::milli>(t2 - t0).count() / n;
  const double enqueue = std::chrono::duration<double, std::milli>(t1 - t0).count() / n;
  std::printf("device_timing event_span_ms median=%.4f min=%.4f executes=%d\n", span_ms[span_ms.size() / 2],
              span_ms.front(), n);
  std::printf("device_timing back_to_back_ms_per_execute=%.4f enqueue_ms_per_execute=%.4f executes=%d\n",
              per, enqueue, n);
}

}  // namespace

int main(int argc, char** argv) {
  kiln::runner::Options opts;
  std::string error;
  if (!kiln::runner::parse_options(argc, argv, opts, error)) {
    std::fprintf(stderr, "kiln_runner: %s\n%s", error.c_str(), kiln::runner::kUsage);
    return 2;
  }
  install_log_filter();
  et::runtime_init();
  // KILN_RUNNER_WHEEL_KERNELS_ONLY=1: only the wheel's kernels, as an app that links just those.
  const char* wheel_only = std::getenv("KILN_RUNNER_WHEEL_KERNELS_ONLY");
  if (wheel_only == nullptr || std::strcmp(wheel_only, "1") != 0) kiln::register_missing_cpu_kernels();

  auto loader = FileDataLoader::from(opts.model.c_str());
  if (!loader.ok()) fail("opening '" + opts.model + "'", loader.error());
  auto program = et::Program::load(&loader.get(), et::Program::Verification::InternalConsistency);
  if (!program.ok()) fail("Program::load('" + opts.model + "')", program.error());

  auto meta = program->method_meta(opts.method.c_str());
  if (!meta.ok()) {
    std::string names;
    for (size_t i = 0; i < program->num_methods(); ++i) {
      auto name = program->get_method_name(i);
      if (name.ok()) names += std::string(i ? ", " : "") + "'" + name.get() + "'";
    }
    std::fprintf(stderr, "kiln_runner: method '%s' not found in '%s': %s (0x%02x); the program has: %s\n",
                 opts.method.c_str(), opts.model.c_str(), error_name(meta.error()),
                 static_cast<unsigned>(meta.error()), names.c_str());
    return 1;
  }

  MallocMemoryAllocator method_allocator;
  MallocMemoryAllocator temp_allocator;
  PlannedMemory planned(meta.get());
  et::HierarchicalAllocator planned_allocator = planned.allocator();
  et::MemoryManager memory_manager(&method_allocator, &planned_allocator, &temp_allocator);
  // load_method runs every delegate's init (for Kiln: blob validation, weight upload, plans).
  const auto load_start = std::chrono::steady_clock::now();
  auto method = program->load_method(opts.method.c_str(), &memory_manager);
  const double load_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - load_start).count();
  if (!method.ok()) fail("load_method('" + opts.method + "')", method.error());

  // A device-resident program (exported with device_resident=True) takes and returns device
  // tensors: its inputs are copied to device memory once per run, outside the timed executes, and
  // its outputs get device buffers of their own; the copies back happen only for printing.
  std::vector<et::etensor::Device> input_devices;
  for (size_t i = 0; i < method->inputs_size(); ++i) input_devices.push_back(value_device(method->get_input(i)));
  std::vector<std::unique_ptr<DeviceMemory>> output_memory;
  for (size_t i = 0; i < method->outputs_size(); ++i) {
    const et::EValue& v = method->get_output(i);
    const et::etensor::Device device = value_device(v);
    if (device.type() == DeviceType::CPU || v.toTensor().const_data_ptr() != nullptr) continue;
    const size_t nbytes = v.toTensor().nbytes();
    output_memory.push_back(device_memory(device, nbytes, "output " + std::to_string(i)));
    et::Error err = method->set_output_data_ptr(output_memory.back()->ptr, nbytes, i);
    if (err != et::Error::Ok) fail("set_output_data_ptr(" + std::to_string(i) + ") with device memory", err);
  }
  const bool device_io = !output_memory.empty() ||
                         std::any_of(input_devices.begin(), input_devices.end(),
                                     [](const auto& d) { return d.type() != DeviceType::CPU; });
  if (device_io && opts.iterations > 0) {
    std::printf("device_io inputs and outputs stay in device memory; each timed execute returns "
                "once Kiln's stream has finished\n");
  }

  std::vector<InputTensor> inputs;
  for (size_t r = 0; r < opts.runs.size(); ++r) {
    make_inputs(meta.get(), opts.runs[r], opts, input_devices, inputs);
    CopyCounts before;
    const bool counted = opts.copy_stats && read_copy_counters(before);
    // Profiled warm-up too (the first eager run loads kernels lazily), then only the timed runs count.
    if (opts.profile && profiler().available()) profiler().set(1);
    for (int w = 0; w < opts.warmup; ++w) {
      bind_inputs(method.get(), inputs);
      et::Error err = method->execute();
      if (err != et::Error::Ok) fail("execute('" + opts.method + "') (warm-up)", err);
    }
    if (opts.profile && profiler().available()) profiler().reset();
    std::vector<double> ms;
    for (int it = 0; it < std::max(1, opts.iterations); ++it) {
      bind_inputs(method.get(), inputs);
      const auto t0 = std::chrono::steady_clock::now();
      et::Error err = method->execute();
      const auto t1 = std::chrono::steady_clock::now();
      if (err != et::Error::Ok) fail("execute('" + opts.method + "')", err);
      ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
    }
    if (opts.runs.size() > 1) std::printf("# run %zu\n", r);
    print_outputs(method.get(), opts, r);
    if (opts.copy_stats) {
      CopyCounts after;
      if (counted && read_copy_counters(after)) {
        const uint64_t n = after.executes - before.executes;
        std::printf("copy_bytes host_to_device=%" PRIu64 " device_to_host=%" PRIu64
                    " kiln_executes=%" PRIu64 " method_executes=%d\n",
                    after.host_to_device - before.host_to_device,
                    after.device_to_host - before.device_to_host, n,
                    opts.warmup + std::max(1, opts.iterations));
      } else {
        std::printf("copy_bytes unavailable (no kiln_executorch_copy_counters in the process)\n");
      }
    }
    if (opts.iterations > 0) {
      std::sort(ms.begin(), ms.end());
      std::printf("latency_ms min=%.4f median=%.4f max=%.4f iterations=%zu warmup=%d\n", ms.front(),
                  ms[ms.size() / 2], ms.back(), ms.size(), opts.warmup);
      if (opts.profile) {
        std::printf("latency measured with --profile on: ops ran eagerly with CUDA events and a "
                    "sync per Kiln execute; run without --profile for real latency\n");
      }
      if (r == 0) {
        std::printf("load_method_ms=%.3f\n", load_ms);
        print_kiln_device_memory();
      }
    }
    if (opts.profile) {
      if (profiler().available()) profiler().set(0);
      print_profile(r, opts.method, ms);
    }
    if (opts.device_timing > 0) {
      if (!device_io) {
        fail("--device-timing needs a device-resident program (export it with "
             "device_resident=True); this one takes host tensors");
      }
      device_timing(method.get(), inputs, opts);
    }
  }
  if (opts.iterations > 0) {
    // A second load in this warm process (CUDA context, libraries and kernels already loaded):
    // what an application pays for each further method or program it loads.
    MallocMemoryAllocator again_method_allocator;
    MallocMemoryAllocator again_temp_allocator;
    PlannedMemory again_planned(meta.get());
    et::HierarchicalAllocator again_planned_allocator = again_planned.allocator();
    et::MemoryManager again_memory(&again_method_allocator, &again_planned_allocator,
                                   &again_temp_allocator);
    const auto t0 = std::chrono::steady_clock::now();
    auto again = program->load_method(opts.method.c_str(), &again_memory);
    const double warm_ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    if (!again.ok()) fail("load_method('" + opts.method + "') (second load)", again.error());
    std::printf("load_method_warm_ms=%.3f\n", warm_ms);
  }
  std::fflush(stdout);
  return 0;
}
