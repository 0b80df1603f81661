// kiln_runner's inputs and outputs: the input tensors it builds (ones, or the bytes of --input
// files, copied to the device for a device-resident program) and the output lines it prints in
// the format kiln-verify reads, with the raw bytes written to --output-dir.
#pragma once

#include <executorch/runtime/core/evalue.h>
#include <executorch/runtime/core/portable_type/tensor_impl.h>
#include <executorch/runtime/executor/method.h>
#include <executorch/runtime/executor/method_meta.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "runner/memory.h"
#include "runner/options.h"

namespace kiln::runner {

/// "[2,3]".
std::string shape_string(const std::vector<int64_t>& sizes);

// The device a method input or output tensor lives on (CPU unless the program was exported
// device-resident), as the loaded method describes it.
et::etensor::Device value_device(const et::EValue& v);

// The device of each input of `method`, in input order.
std::vector<et::etensor::Device> input_devices(et::Method& method);

// One input tensor the runner owns: metadata arrays and data outlive the method. A
// device-resident input's bytes are copied to device memory once, before the run's executes.
struct InputTensor {
  std::vector<executorch::aten::TensorImpl::SizesType> sizes;
  std::vector<executorch::aten::TensorImpl::DimOrderType> dim_order;
  std::unique_ptr<HostBuffer> data;
  std::unique_ptr<DeviceMemory> device;
  std::unique_ptr<executorch::aten::TensorImpl> impl;
};

// Builds the run's input tensors: ones, or the bytes of the files given with --input.
void make_inputs(const et::MethodMeta& meta, const Run& run, const Options& opts,
                 const std::vector<et::etensor::Device>& devices, std::vector<InputTensor>& keep);

// Hands the inputs to the method. Called before every execute: a memory-planned input's bytes may
// share arena space with intermediates of the previous execution, so they are copied in again.
void bind_inputs(et::Method& method, std::vector<InputTensor>& inputs);

/// Prints every output ("output[i] shape=[..] dtype=..", then its first opts.values values) and,
/// with --output-dir, writes its bytes to output_<i>.bin (run<r>_output_<i>.bin for several runs).
void print_outputs(et::Method& method, const Options& opts, size_t run_index);

}  // namespace kiln::runner
