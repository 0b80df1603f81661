// The smallest app that runs an ExecuTorch program with Kiln: it links kiln::executorch_backend
// (which registers KilnBackend when the app starts) and ExecuTorch's Module API, and calls no Kiln
// function at all.
//
//   consumer model.pte     runs `forward` with ones and prints output 0's first values
//   consumer --check       only reports whether KilnBackend is registered

#include <executorch/extension/module/module.h>
#include <executorch/extension/tensor/tensor.h>
#include <executorch/runtime/backend/interface.h>

#include <cstdio>
#include <cstring>
#include <vector>

using executorch::extension::Module;
using executorch::extension::make_tensor_ptr;
namespace et = executorch::runtime;

int main(int argc, char** argv) {
  const bool registered = et::get_backend_class("KilnBackend") != nullptr;
  std::printf("KilnBackend registered: %s\n", registered ? "yes" : "no");
  if (argc < 2 || std::strcmp(argv[1], "--check") == 0) return registered ? 0 : 1;

  Module module(argv[1]);
  auto meta = module.method_meta("forward");
  if (!meta.ok()) {
    std::fprintf(stderr, "consumer: cannot read 'forward' of %s: error 0x%x\n", argv[1],
                 static_cast<unsigned>(meta.error()));
    return 1;
  }
  std::vector<et::EValue> inputs;
  std::vector<executorch::extension::TensorPtr> keep;
  for (size_t i = 0; i < meta->num_inputs(); ++i) {
    auto info = meta->input_tensor_meta(i);
    if (!info.ok()) return 1;
    std::vector<executorch::aten::SizesType> sizes(info->sizes().begin(), info->sizes().end());
    size_t numel = 1;
    for (auto s : sizes) numel *= static_cast<size_t>(s);
    keep.push_back(make_tensor_ptr(sizes, std::vector<float>(numel, 1.0f)));
    inputs.emplace_back(*keep.back());
  }
  auto outputs = module.forward(inputs);
  if (!outputs.ok()) {
    std::fprintf(stderr, "consumer: forward failed: error 0x%x\n", static_cast<unsigned>(outputs.error()));
    return 1;
  }
  const auto& t = outputs->at(0).toTensor();
  std::printf("output[0] numel=%zd first=", t.numel());
  for (ssize_t i = 0; i < t.numel() && i < 8; ++i) std::printf("%s%.6g", i ? " " : "", t.const_data_ptr<float>()[i]);
  std::printf("\n");
  return 0;
}
