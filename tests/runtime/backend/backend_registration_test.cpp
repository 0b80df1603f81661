// Loading libkiln_executorch_backend.so into a process registers KilnBackend with the process's
// ExecuTorch runtime and a CUDA device allocator, unless one is already registered
// (KILN_PREREGISTER_ALLOCATOR: the registry would abort on a second one). Works without a GPU.

#include <executorch/runtime/backend/interface.h>
#include <executorch/runtime/core/device_allocator.h>
#include <executorch/runtime/platform/runtime.h>

#include <dlfcn.h>
#include <gtest/gtest.h>

namespace {

namespace et = executorch::runtime;
using et::etensor::DeviceType;

#define KILN_STR2(x) #x
#define KILN_STR(x) KILN_STR2(x)

class OtherCudaAllocator final : public et::DeviceAllocator {
 public:
  et::Result<void*> allocate(size_t, et::etensor::DeviceIndex, size_t) override { return et::Error::NotSupported; }
  void deallocate(void*, et::etensor::DeviceIndex) override {}
  et::Error copy_host_to_device(void*, const void*, size_t, et::etensor::DeviceIndex) override { return et::Error::NotSupported; }
  et::Error copy_device_to_host(void*, const void*, size_t, et::etensor::DeviceIndex) override { return et::Error::NotSupported; }
  DeviceType device_type() const override { return DeviceType::CUDA; }
};

TEST(BackendRegistration, LoadingTheLibraryRegistersBackendAndAllocator) {
  et::runtime_init();
  OtherCudaAllocator other;
#ifdef KILN_PREREGISTER_ALLOCATOR
  et::register_device_allocator(&other);
#endif
  ASSERT_EQ(et::get_backend_class("KilnBackend"), nullptr);
  void* lib = dlopen(KILN_STR(KILN_BACKEND_LIBRARY), RTLD_NOW | RTLD_GLOBAL);
  ASSERT_NE(lib, nullptr) << dlerror();

  et::BackendInterface* backend = et::get_backend_class("KilnBackend");
  ASSERT_NE(backend, nullptr);
  auto registered = reinterpret_cast<int (*)()>(dlsym(lib, "kiln_executorch_backend_registered"));
  ASSERT_NE(registered, nullptr);
  EXPECT_EQ(registered(), 1);

  et::DeviceAllocator* cuda = et::get_device_allocator(DeviceType::CUDA);
  ASSERT_NE(cuda, nullptr);
#ifdef KILN_PREREGISTER_ALLOCATOR
  EXPECT_EQ(cuda, &other) << "Kiln replaced an allocator that was registered first";
#else
  EXPECT_NE(cuda, &other);
  EXPECT_EQ(cuda->device_type(), DeviceType::CUDA);
#endif
  // Answers without crashing whether or not this machine has a GPU.
  (void)backend->is_available();
}

}  // namespace
