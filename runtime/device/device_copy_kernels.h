// Names of the device-copy operators, spelled once. The kernels live in
// libkiln_device_copy_kernels.so (CMake target kiln::device_copy_kernels), registered when that
// library loads.
#pragma once

namespace kiln {

inline constexpr const char* kHostToDeviceCopy = "et_copy::_h2d_copy.out";
inline constexpr const char* kDeviceToHostCopy = "et_copy::_d2h_copy.out";

}  // namespace kiln
