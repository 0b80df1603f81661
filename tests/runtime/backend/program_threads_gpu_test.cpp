// Kiln-delegated programs loaded with ExecuTorch's Module (the wheel's libexecutorch.so, its CPU
// kernels and Kiln's backend library, as an application links them) and executed from several
// threads at once, hundreds of times each, every output compared with eager PyTorch; plus one
// program whose method holds several Kiln delegates with a CPU operator between them.
//
// The programs come from tests/gpu_e2e/export_concurrency.py: the folder named by the environment
// variable KILN_TEST_PROGRAMS holds NAME.pte, NAME_case<c>_input_<i>.bin and
// NAME_case<c>_expected_<o>.bin (raw little-endian tensors). A missing variable or file is a test
// failure. tests/gpu_e2e/check_concurrency.py sets the variable and runs this binary. Needs a GPU.
#include <executorch/extension/module/module.h>
#include <executorch/extension/tensor/tensor_ptr.h>
#include <executorch/runtime/backend/interface.h>
#include <executorch/runtime/core/exec_aten/util/scalar_type_util.h>
#include <executorch/runtime/platform/runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <thread>
#include <vector>

namespace {

namespace et = executorch::runtime;
using executorch::aten::ScalarType;
using executorch::extension::Module;

constexpr double kAtol = 2e-4;
constexpr double kRtol = 2e-4;

bool read_file(const std::string& path, std::vector<uint8_t>* out) {
  std::ifstream f(path, std::ios::binary);
  if (!f) return false;
  out->assign(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
  return true;
}

bool exists(const std::string& path) { return std::ifstream(path).good(); }

// One exported program with its cases.
struct Program {
  std::string name;
  std::unique_ptr<Module> module;
  std::vector<std::vector<executorch::aten::SizesType>> input_sizes;
  std::vector<ScalarType> input_dtypes;
  std::vector<std::vector<std::vector<uint8_t>>> inputs;  // [case][input]
  std::vector<std::vector<std::vector<float>>> expected;  // [case][output]
};

// Loads NAME.pte and its cases from KILN_TEST_PROGRAMS; any problem is a test failure.
::testing::AssertionResult load(const std::string& name, Program* p) {
  const char* dir = std::getenv("KILN_TEST_PROGRAMS");
  if (dir == nullptr || *dir == '\0') {
    return ::testing::AssertionFailure()
           << "KILN_TEST_PROGRAMS is not set: point it at the folder "
              "tests/gpu_e2e/export_concurrency.py --out wrote (check_concurrency.py does)";
  }
  const std::string base = std::string(dir) + "/" + name;
  if (!exists(base + ".pte")) {
    return ::testing::AssertionFailure() << base << ".pte is missing; run export_concurrency.py";
  }
  p->name = name;
  p->module = std::make_unique<Module>(base + ".pte");
  const et::Error loaded = p->module->load_method("forward");
  if (loaded != et::Error::Ok) {
    return ::testing::AssertionFailure()
           << name << ": load_method(forward) failed: " << et::to_string(loaded)
           << " (is KilnBackend registered and a GPU visible?)";
  }
  auto meta = p->module->method_meta("forward");
  if (!meta.ok()) return ::testing::AssertionFailure() << name << ": no method_meta";
  if (!meta->uses_backend("KilnBackend")) {
    return ::testing::AssertionFailure() << name << ": forward has no KilnBackend delegate";
  }
  for (size_t i = 0; i < meta->num_inputs(); ++i) {
    auto info = meta->input_tensor_meta(i);
    if (!info.ok()) return ::testing::AssertionFailure() << name << ": input " << i << " is no tensor";
    p->input_sizes.emplace_back(info->sizes().begin(), info->sizes().end());
    p->input_dtypes.push_back(info->scalar_type());
  }
  for (int c = 0; exists(base + "_case" + std::to_string(c) + "_input_0.bin"); ++c) {
    const std::string prefix = base + "_case" + std::to_string(c);
    std::vector<std::vector<uint8_t>> ins(meta->num_inputs());
    for (size_t i = 0; i < ins.size(); ++i) {
      const std::string path = prefix + "_input_" + std::to_string(i) + ".bin";
      const size_t want = meta->input_tensor_meta(i)->nbytes();
      if (!read_file(path, &ins[i]) || ins[i].size() != want) {
        return ::testing::AssertionFailure()
               << path << " is missing or not " << want << " bytes";
      }
    }
    std::vector<std::vector<float>> outs;
    for (size_t o = 0; o < meta->num_outputs(); ++o) {
      std::vector<uint8_t> bytes;
      const std::string path = prefix + "_expected_" + std::to_string(o) + ".bin";
      if (!read_file(path, &bytes) || bytes.size() % sizeof(float) != 0) {
        return ::testing::AssertionFailure() << path << " is missing or not float32";
      }
      outs.emplace_back(bytes.size() / sizeof(float));
      std::memcpy(outs.back().data(), bytes.data(), bytes.size());
    }
    p->inputs.push_back(std::move(ins));
    p->expected.push_back(std::move(outs));
  }
  if (p->inputs.size() < 2) {
    return ::testing::AssertionFailure()
           << name << ": found " << p->inputs.size() << " cases (" << base
           << "_case<c>_input_0.bin), want at least 2";
  }
  return ::testing::AssertionSuccess();
}

struct Report {
  int correct = 0;
  int failures = 0;
  double max_error = 0;
  std::string first_failure;
};

// Executes `p` once with case `c` and compares every output; returns false on any difference.
bool run_case(Program& p, size_t c, Report& r) {
  auto fail = [&](const std::string& what) {
    if (r.failures++ == 0) r.first_failure = p.name + " case " + std::to_string(c) + ": " + what;
    return false;
  };
  std::vector<executorch::extension::TensorPtr> tensors;
  std::vector<et::EValue> args;
  for (size_t i = 0; i < p.inputs[c].size(); ++i) {
    std::vector<executorch::aten::DimOrderType> order(p.input_sizes[i].size());
    for (size_t d = 0; d < order.size(); ++d) order[d] = static_cast<executorch::aten::DimOrderType>(d);
    tensors.push_back(executorch::extension::make_tensor_ptr(
        p.input_sizes[i], std::vector<uint8_t>(p.inputs[c][i]), std::move(order), {},
        p.input_dtypes[i]));
    args.emplace_back(*tensors.back());
  }
  auto result = p.module->execute("forward", args);
  if (!result.ok()) return fail(std::string("execute failed: ") + et::to_string(result.error()));
  if (result->size() != p.expected[c].size()) {
    return fail("got " + std::to_string(result->size()) + " outputs, want " +
                std::to_string(p.expected[c].size()));
  }
  for (size_t o = 0; o < result->size(); ++o) {
    const et::EValue& v = (*result)[o];
    if (!v.isTensor() || v.toTensor().scalar_type() != ScalarType::Float) {
      return fail("output " + std::to_string(o) + " is not a float tensor");
    }
    const executorch::aten::Tensor t = v.toTensor();
    const std::vector<float>& want = p.expected[c][o];
    if (static_cast<size_t>(t.numel()) != want.size()) {
      return fail("output " + std::to_string(o) + " has " + std::to_string(t.numel()) +
                  " elements, want " + std::to_string(want.size()));
    }
    const float* got = t.const_data_ptr<float>();
    for (size_t k = 0; k < want.size(); ++k) {
      const double e = std::fabs(double(got[k]) - want[k]);
      r.max_error = std::max(r.max_error, std::isnan(e) ? INFINITY : e);
      if (!(e <= kAtol + kRtol * std::fabs(want[k]))) {
        return fail("output " + std::to_string(o) + " element " + std::to_string(k) + ": got " +
                    std::to_string(got[k]) + ", want " + std::to_string(want[k]));
      }
    }
  }
  ++r.correct;
  return true;
}

// Runs `iterations` executes of `p` from the calling thread, cycling through its cases from
// `offset`, so two threads on one program do not feed the same inputs in lockstep.
void drive(Program& p, int iterations, size_t offset, Report& r) {
  for (int i = 0; i < iterations && r.failures < 5; ++i) {
    run_case(p, (offset + static_cast<size_t>(i)) % p.inputs.size(), r);
  }
}

class ProgramThreads : public ::testing::Test {
 protected:
  void SetUp() override {
    et::runtime_init();
    et::BackendInterface* kiln = et::get_backend_class("KilnBackend");
    ASSERT_NE(kiln, nullptr) << "KilnBackend is not registered: link libkiln_executorch_backend.so";
    ASSERT_TRUE(kiln->is_available()) << "KilnBackend is not available (no usable GPU)";
  }

  // Every program on its own thread, all at once; each thread checks every result.
  void run_together(std::vector<Program>& programs, int iterations) {
    std::vector<Report> reports(programs.size());
    std::vector<std::thread> threads;
    for (size_t t = 0; t < programs.size(); ++t) {
      threads.emplace_back(drive, std::ref(programs[t]), iterations, t, std::ref(reports[t]));
    }
    for (std::thread& t : threads) t.join();
    for (size_t t = 0; t < programs.size(); ++t) {
      const Report& r = reports[t];
      std::printf("thread %zu %s: %d/%d runs correct, max abs error %.3g\n", t,
                  programs[t].name.c_str(), r.correct, iterations, r.max_error);
      EXPECT_EQ(r.failures, 0) << "thread " << t << ": " << r.first_failure;
      EXPECT_EQ(r.correct, iterations) << "thread " << t << " (" << programs[t].name << ")";
    }
  }
};

TEST_F(ProgramThreads, TwoProgramsOnTwoThreads) {
  std::vector<Program> programs(2);
  ASSERT_TRUE(load("mlp", &programs[0]));
  ASSERT_TRUE(load("norm", &programs[1]));
  run_together(programs, 300);
}

TEST_F(ProgramThreads, SeveralKilnDelegatesInOneMethod) {
  Program p;
  ASSERT_TRUE(load("several_delegates", &p));
  Report r;
  drive(p, 200, 0, r);
  std::printf("several_delegates: %d/200 runs correct, max abs error %.3g\n", r.correct,
              r.max_error);
  EXPECT_EQ(r.failures, 0) << r.first_failure;
  EXPECT_EQ(r.correct, 200);
}

// Four methods at once: three programs, one of them loaded twice (two Modules of one file).
TEST_F(ProgramThreads, FourLoadedMethodsOnFourThreads) {
  std::vector<Program> programs(4);
  ASSERT_TRUE(load("mlp", &programs[0]));
  ASSERT_TRUE(load("norm", &programs[1]));
  ASSERT_TRUE(load("several_delegates", &programs[2]));
  ASSERT_TRUE(load("mlp", &programs[3]));
  run_together(programs, 200);
}

}  // namespace
