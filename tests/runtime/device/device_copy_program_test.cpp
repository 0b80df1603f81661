// Loads and runs a program with et_copy::_h2d_copy.out / _d2h_copy.out around a delegate (the
// shared fixture experimental/v1_4_device_copy/add_xy_device.pte: x, y -> h2d -> delegate(x + y)
// -> d2h) in whichever kernel configuration this binary was linked with:
//   KILN_COPY_KERNELS=kiln       core runtime + libkiln_device_copy_kernels.so
//   KILN_COPY_KERNELS=wheel      core runtime + the wheel's libexecutorch_kernels_optimized.so
//   KILN_COPY_KERNELS=none       core runtime only: loading must fail with OperatorMissing
// A stub backend named like the fixture's delegate and a host-memory stand-in for the CUDA
// allocator let it run without a GPU (ExecuTorch's stub-backend test pattern).

#include <executorch/extension/data_loader/file_data_loader.h>
#include <executorch/extension/memory_allocator/malloc_memory_allocator.h>
#include <executorch/runtime/backend/interface.h>
#include <executorch/runtime/core/device_allocator.h>
#include <executorch/runtime/executor/method.h>
#include <executorch/runtime/executor/program.h>
#include <executorch/runtime/kernel/operator_registry.h>
#include <executorch/runtime/platform/runtime.h>

#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "runtime/device/device_copy_kernels.h"

namespace {

namespace et = executorch::runtime;
using executorch::aten::Tensor;
using executorch::aten::TensorImpl;
using et::etensor::DeviceType;

#define KILN_STR2(x) #x
#define KILN_STR(x) KILN_STR2(x)
const std::string kConfig = KILN_STR(KILN_COPY_KERNELS);

// "Device" memory that is host memory, counting what moves through it.
class HostBackedCudaAllocator final : public et::DeviceAllocator {
 public:
  et::Result<void*> allocate(size_t nbytes, et::etensor::DeviceIndex, size_t) override {
    return std::calloc(1, nbytes == 0 ? 1 : nbytes);
  }
  void deallocate(void* p, et::etensor::DeviceIndex) override { std::free(p); }
  et::Error copy_host_to_device(void* d, const void* s, size_t n, et::etensor::DeviceIndex) override {
    std::memcpy(d, s, n);
    h2d_bytes += n;
    return et::Error::Ok;
  }
  et::Error copy_device_to_host(void* d, const void* s, size_t n, et::etensor::DeviceIndex) override {
    std::memcpy(d, s, n);
    d2h_bytes += n;
    return et::Error::Ok;
  }
  DeviceType device_type() const override { return DeviceType::CUDA; }
  size_t h2d_bytes = 0, d2h_bytes = 0;
};

// The fixture's delegate: out = a + b over float tensors that live on the "device".
class AddStubBackend final : public et::BackendInterface {
 public:
  bool is_available() const override { return true; }
  et::Result<et::DelegateHandle*> init(et::BackendInitContext&, et::FreeableBuffer* processed,
                                       et::ArrayRef<et::CompileSpec>) const override {
    processed->Free();
    return static_cast<et::DelegateHandle*>(&calls_);
  }
  et::Error execute(et::BackendExecutionContext&, et::DelegateHandle*, et::Span<et::EValue*> args) const override {
    const Tensor& a = args[0]->toTensor();
    const Tensor& b = args[1]->toTensor();
    Tensor& out = args[2]->toTensor();
    for (ssize_t i = 0; i < out.numel(); ++i) {
      out.mutable_data_ptr<float>()[i] = a.const_data_ptr<float>()[i] + b.const_data_ptr<float>()[i];
    }
    ++calls_;
    return et::Error::Ok;
  }
  mutable int calls_ = 0;
};

HostBackedCudaAllocator g_allocator;
AddStubBackend g_backend;

std::string fixture() {
  const char* dir = std::getenv("KILN_FIXTURES");
  return std::string(dir ? dir : KILN_STR(KILN_DEFAULT_FIXTURES)) + "/experimental/v1_4_device_copy/add_xy_device.pte";
}

int registered_count(const char* name) {
  int n = 0;
  for (const et::Kernel& k : et::get_registered_kernels()) n += std::strcmp(k.name_, name) == 0;
  return n;
}

class DeviceCopyProgram : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    et::runtime_init();
    et::register_device_allocator(&g_allocator);
    ASSERT_EQ(et::register_backend({"BackendWithCompilerDemo", &g_backend}), et::Error::Ok);
  }
};

TEST_F(DeviceCopyProgram, EachCopyKernelIsRegisteredExactlyOnceOrNotAtAll) {
  const int want = kConfig == "none" ? 0 : 1;
  EXPECT_EQ(registered_count(kiln::kHostToDeviceCopy), want) << kConfig;
  EXPECT_EQ(registered_count(kiln::kDeviceToHostCopy), want) << kConfig;
}

#ifdef KILN_COPY_KERNELS_FROM_KILN
TEST_F(DeviceCopyProgram, KilnLibraryRegistersOnlyTheTwoCopyKernels) {
  // Everything else registered in this process comes from the core runtime (primitive ops).
  for (const et::Kernel& k : et::get_registered_kernels()) {
    const std::string name = k.name_;
    const bool ours = name == kiln::kHostToDeviceCopy || name == kiln::kDeviceToHostCopy;
    const bool core = name.rfind("executorch_prim::", 0) == 0 || name.rfind("aten::sym_", 0) == 0 ||
                      name == "aten::_local_scalar_dense";
    EXPECT_TRUE(ours || core) << "unexpected kernel " << name;
  }
}
#endif

TEST_F(DeviceCopyProgram, LoadsAndRunsWithTheLinkedCopyKernels) {
  auto loader = executorch::extension::FileDataLoader::from(fixture().c_str());
  ASSERT_TRUE(loader.ok()) << fixture();
  auto program = et::Program::load(&loader.get());
  ASSERT_TRUE(program.ok());
  auto meta = program->method_meta("forward");
  ASSERT_TRUE(meta.ok());

  std::vector<std::vector<uint8_t>> host;
  std::vector<void*> device;
  std::vector<et::Span<uint8_t>> spans;
  std::vector<et::etensor::Device> devices;
  for (size_t i = 0; i < meta->num_memory_planned_buffers(); ++i) {
    const size_t n = meta->memory_planned_buffer_size(i).get();
    const auto dev = meta->memory_planned_buffer_device(i).get();
    devices.push_back(dev);
    if (dev.type() == DeviceType::CPU) {
      host.emplace_back(n);
      spans.emplace_back(host.back().data(), n);
    } else {
      device.push_back(g_allocator.allocate(n, 0, 16).get());
      spans.emplace_back(static_cast<uint8_t*>(device.back()), n);
    }
  }
  ASSERT_FALSE(device.empty()) << "the fixture plans no device arena";
  et::HierarchicalAllocator planned({spans.data(), spans.size()}, {devices.data(), devices.size()});
  executorch::extension::MallocMemoryAllocator method_alloc, temp_alloc;
  et::MemoryManager mm(&method_alloc, &planned, &temp_alloc);
  auto method = program->load_method("forward", &mm);

  if (kConfig == "none") {
    ASSERT_FALSE(method.ok());
    EXPECT_EQ(method.error(), et::Error::OperatorMissing);
  } else {
    ASSERT_TRUE(method.ok()) << "load_method failed: 0x" << std::hex << static_cast<int>(method.error());
    std::vector<float> x(64 * 64, 1.0f), y(64 * 64, 2.0f);
    std::vector<TensorImpl::SizesType> sizes = {64, 64};
    std::vector<TensorImpl::DimOrderType> order = {0, 1};
    TensorImpl xi(executorch::aten::ScalarType::Float, 2, sizes.data(), x.data(), order.data());
    TensorImpl yi(executorch::aten::ScalarType::Float, 2, sizes.data(), y.data(), order.data());
    ASSERT_EQ(method->set_input(et::EValue(Tensor(&xi)), 0), et::Error::Ok);
    ASSERT_EQ(method->set_input(et::EValue(Tensor(&yi)), 1), et::Error::Ok);
    const size_t h2d_before = g_allocator.h2d_bytes, d2h_before = g_allocator.d2h_bytes;
    ASSERT_EQ(method->execute(), et::Error::Ok);
    const Tensor& out = method->get_output(0).toTensor();
    for (ssize_t i = 0; i < out.numel(); ++i) ASSERT_EQ(out.const_data_ptr<float>()[i], 3.0f) << i;
    // Two inputs in, one output back, through the registered allocator.
    EXPECT_EQ(g_allocator.h2d_bytes - h2d_before, 2 * 64 * 64 * sizeof(float));
    EXPECT_EQ(g_allocator.d2h_bytes - d2h_before, 64 * 64 * sizeof(float));
  }
  for (void* p : device) g_allocator.deallocate(p, 0);
}

}  // namespace
