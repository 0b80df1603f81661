// A two-method program whose methods share one nn.Linear (exported by export_shared_weights.py),
// loaded through ExecuTorch's Module with Kiln's backend: loading both methods puts the shared
// Linear on the GPU once, both methods match eager PyTorch, and unloading frees Kiln's memory.
// The program comes from $KILN_SHARED_WEIGHTS_DIR (check_shared_weights.py sets it); a missing
// variable or file is a failure. Needs a GPU.
#include <cuda_runtime.h>
#include <executorch/extension/module/module.h>
#include <executorch/extension/tensor/tensor.h>
#include <gtest/gtest.h>
#include <kiln/executorch/stats.h>
#include <kiln/executorch/version.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace {

using executorch::extension::Module;
using executorch::runtime::Error;

std::string program_dir() {
  const char* dir = std::getenv("KILN_SHARED_WEIGHTS_DIR");
  return dir == nullptr ? "" : dir;
}

std::vector<float> read_floats(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  EXPECT_TRUE(f.good()) << "cannot read " << path;
  std::vector<char> bytes((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  std::vector<float> v(bytes.size() / sizeof(float));
  std::memcpy(v.data(), bytes.data(), v.size() * sizeof(float));
  return v;
}

std::map<std::string, uint64_t> read_weights(const std::string& path) {
  std::ifstream f(path);
  EXPECT_TRUE(f.good()) << "cannot read " << path;
  std::map<std::string, uint64_t> m;
  std::string name;
  uint64_t n = 0;
  while (f >> name >> n) m[name] = n;
  return m;
}

size_t free_bytes() {
  size_t free = 0, total = 0;
  EXPECT_EQ(cudaMemGetInfo(&free, &total), cudaSuccess);
  return free;
}

double mib(double b) { return b / (1 << 20); }

TEST(SharedWeightsGpu, TwoMethodsHoldTheSharedLinearOnce) {
  const std::string dir = program_dir();
  ASSERT_FALSE(dir.empty()) << "set KILN_SHARED_WEIGHTS_DIR to the folder export_shared_weights.py "
                               "wrote (check_shared_weights.py does)";
  const std::string pte = dir + "/shared_weights.pte";
  ASSERT_TRUE(std::ifstream(pte).good()) << "missing " << pte;
  auto weights = read_weights(dir + "/weights.txt");
  for (const char* key : {"expected", "forward_only", "unshared", "shared_linear", "proj"}) {
    ASSERT_TRUE(weights.count(key)) << "weights.txt has no '" << key << "' line";
  }
  std::vector<float> x = read_floats(dir + "/x.bin");
  ASSERT_EQ(x.size(), 4u * 512u) << "x.bin";
  ASSERT_EQ(kiln_executorch_backend_registered(), 1);
  ASSERT_EQ(kiln_executorch_weight_bytes(), 0u) << "nothing is loaded yet";

  const size_t free0 = free_bytes();
  auto module = std::make_unique<Module>(pte, Module::LoadMode::File);
  ASSERT_EQ(module->load_method("forward"), Error::Ok);
  const uint64_t after_forward = kiln_executorch_weight_bytes();
  const size_t free1 = free_bytes();
  ASSERT_EQ(module->load_method("encode"), Error::Ok);
  const uint64_t after_both = kiln_executorch_weight_bytes();
  const size_t free2 = free_bytes();

  std::printf("[shared weights] forward loaded: Kiln weights %.3f MiB (%llu bytes), activations "
              "%llu bytes, device memory used %.2f MiB\n",
              mib(after_forward), static_cast<unsigned long long>(after_forward),
              static_cast<unsigned long long>(kiln_executorch_activation_bytes()),
              mib(double(free0) - double(free1)));
  std::printf("[shared weights] encode loaded too: Kiln weights %.3f MiB (%llu bytes; one shared "
              "Linear %llu + proj %llu), requested by the two delegates %.3f MiB, allocated "
              "%llu bytes, activations %llu bytes, device memory used by encode %.2f MiB\n",
              mib(after_both), static_cast<unsigned long long>(after_both),
              static_cast<unsigned long long>(weights["shared_linear"]),
              static_cast<unsigned long long>(weights["proj"]),
              mib(kiln_executorch_weight_requested_bytes()),
              static_cast<unsigned long long>(kiln_executorch_weight_allocated_bytes()),
              static_cast<unsigned long long>(kiln_executorch_activation_bytes()),
              mib(double(free1) - double(free2)));

  EXPECT_EQ(after_forward, weights["forward_only"]);
  EXPECT_EQ(after_forward, weights["shared_linear"]);
  // One copy of the shared Linear plus encode's own projection, not two copies.
  EXPECT_EQ(after_both, weights["expected"]);
  EXPECT_EQ(after_both, weights["shared_linear"] + weights["proj"]);
  EXPECT_EQ(kiln_executorch_weight_requested_bytes(), weights["unshared"]);
  EXPECT_GT(kiln_executorch_activation_bytes(), 0u);

  for (const char* method : {"forward", "encode"}) {
    const std::vector<float> want = read_floats(dir + "/" + method + ".expected.bin");
    auto input = executorch::extension::from_blob(x.data(), {4, 512});
    for (int run = 0; run < 3; ++run) {  // eager, then the captured CUDA graph
      auto out = module->execute(method, {executorch::runtime::EValue(input)});
      ASSERT_TRUE(out.ok()) << method << " failed: 0x" << std::hex << int(out.error());
      ASSERT_EQ(out->size(), 1u);
      const auto& t = (*out)[0].toTensor();
      ASSERT_EQ(t.unsafeGetTensorImpl()->device_type(),
                executorch::runtime::etensor::DeviceType::CPU);
      ASSERT_EQ(size_t(t.numel()), want.size()) << method;
      const float* got = t.const_data_ptr<float>();
      double worst = 0;
      for (size_t i = 0; i < want.size(); ++i) {
        worst = std::max(worst, std::abs(double(got[i]) - want[i]) / (1e-4 + 1e-4 * std::abs(want[i])));
      }
      std::printf("[shared weights] %s run %d: worst |error| / tolerance = %.3f\n", method, run,
                  worst);
      EXPECT_LE(worst, 1.0) << method << " run " << run;
    }
  }

  module.reset();
  EXPECT_EQ(kiln_executorch_weight_bytes(), 0u);
  EXPECT_EQ(kiln_executorch_weight_requested_bytes(), 0u);
  EXPECT_EQ(kiln_executorch_activation_bytes(), 0u);
  std::printf("[shared weights] after unloading: device memory still used %.2f MiB\n",
              mib(double(free0) - double(free_bytes())));
}

}  // namespace
