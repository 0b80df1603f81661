// libkiln_device_copy_kernels.so: registers et_copy::_h2d_copy.out and et_copy::_d2h_copy.out and
// nothing else, for apps that link only ExecuTorch's core runtime (a fully delegated program calls
// no other kernel). It is its own library, never part of the backend library: ExecuTorch's kernel
// registry aborts when a name is registered twice, and the wheel's CPU kernel library
// (executorch::kernels_optimized) already registers both names, so an app links exactly one of
// the two. Bytes move through the device allocator registered for the tensor's device type
// (Kiln's CUDA allocator, registered by libkiln_executorch_backend.so).

#include <executorch/runtime/core/device_allocator.h>
#include <executorch/runtime/core/evalue.h>
#include <executorch/runtime/core/exec_aten/util/tensor_util.h>
#include <executorch/runtime/kernel/kernel_runtime_context.h>
#include <executorch/runtime/kernel/operator_registry.h>
#include <executorch/runtime/platform/log.h>

#include "runtime/device/device_copy_kernels.h"
#include "runtime/register_missing_kernels.h"


namespace kiln {
namespace {

namespace et = executorch::runtime;
using executorch::aten::Tensor;
using et::etensor::DeviceType;

enum class Direction { kHostToDevice, kDeviceToHost };

// Both schemas are (Tensor self, *, Tensor(a!) out) -> Tensor(a!): args [self, out, return].
template <Direction kDir>
void device_copy(et::KernelRuntimeContext& ctx, et::Span<et::EValue*> args) {
  const char* name = kDir == Direction::kHostToDevice ? kHostToDeviceCopy : kDeviceToHostCopy;
  if (args.size() != 3 || !args[0]->isTensor() || !args[1]->isTensor()) {
    ET_LOG(Error, "%s: expected (Tensor self, Tensor out), got %zu arguments", name, args.size());
    ctx.fail(et::Error::InvalidArgument);
    return;
  }
  const Tensor& self = args[0]->toTensor();
  Tensor& out = args[1]->toTensor();
  const auto self_dev = self.unsafeGetTensorImpl()->device_type();
  const auto out_dev = out.unsafeGetTensorImpl()->device_type();
  const bool h2d = kDir == Direction::kHostToDevice;
  if ((h2d && (self_dev != DeviceType::CPU || out_dev == DeviceType::CPU)) ||
      (!h2d && (self_dev == DeviceType::CPU || out_dev != DeviceType::CPU))) {
    ET_LOG(Error, "%s: self is on device type %d and out on %d; expected %s", name,
           static_cast<int>(self_dev), static_cast<int>(out_dev),
           h2d ? "self on CPU, out on a device" : "self on a device, out on CPU");
    ctx.fail(et::Error::InvalidArgument);
    return;
  }
  if (self.scalar_type() != out.scalar_type()) {
    ET_LOG(Error, "%s: dtypes differ (self %d, out %d); the copy does not convert", name,
           static_cast<int>(self.scalar_type()), static_cast<int>(out.scalar_type()));
    ctx.fail(et::Error::InvalidArgument);
    return;
  }
  if (et::resize_tensor(out, self.sizes()) != et::Error::Ok) {
    ET_LOG(Error, "%s: cannot resize out to self's shape", name);
    ctx.fail(et::Error::InvalidArgument);
    return;
  }
  const DeviceType device = h2d ? out_dev : self_dev;
  const auto index = h2d ? out.unsafeGetTensorImpl()->device_index() : self.unsafeGetTensorImpl()->device_index();
  et::DeviceAllocator* alloc = et::get_device_allocator(device);
  if (alloc == nullptr) {
    ET_LOG(Error, "%s: no device allocator registered for device type %d; link "
           "kiln::executorch_backend (libkiln_executorch_backend.so), which registers the CUDA one",
           name, static_cast<int>(device));
    ctx.fail(et::Error::NotFound);
    return;
  }
  const et::Error err = h2d ? alloc->copy_host_to_device(out.mutable_data_ptr(), self.const_data_ptr(),
                                                         self.nbytes(), index)
                            : alloc->copy_device_to_host(out.mutable_data_ptr(), self.const_data_ptr(),
                                                         self.nbytes(), index);
  if (err != et::Error::Ok) {
    ctx.fail(et::Error::Internal);
    return;
  }
  *args[2] = *args[1];
}

const et::Kernel kKernels[] = {
    et::Kernel(kHostToDeviceCopy, device_copy<Direction::kHostToDevice>),
    et::Kernel(kDeviceToHostCopy, device_copy<Direction::kDeviceToHost>),
};

bool register_missing() {
  register_missing_kernels({kKernels, 2}, "libkiln_device_copy_kernels.so");
  return true;
}

const bool g_registered = register_missing();

}  // namespace
}  // namespace kiln
