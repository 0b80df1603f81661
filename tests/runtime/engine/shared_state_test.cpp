// The shared program-state registry (runtime/engine/shared_state.h) without a GPU: memory comes
// from a host allocation standing in for the device buffer. One scope shares by key, other scopes
// and devices do not, a mismatched declaration is refused with a log line and changes nothing,
// and a state is freed when its last holder goes (a later acquire starts from the initial value).

#include "runtime/engine/shared_state.h"

#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "tests/format/log_capture.h"

namespace kiln::engine {
namespace {

using executorch::runtime::Error;
using executorch::runtime::Result;

const auto* const kLog = ::testing::AddGlobalTestEnvironment(new testing::LogCaptureEnvironment);

StateSpec cache_spec(int64_t rows, blob::DType dtype = blob::DType::kFloat32) {
  StateSpec s;
  s.dtype = dtype;
  s.rank = 4;
  const int64_t sizes[4] = {1, 2, rows, 8};
  std::memcpy(s.sizes, sizes, sizeof(sizes));
  s.nbytes = uint64_t(2 * rows * 8) * (dtype == blob::DType::kFloat32 ? 4 : 2);
  return s;
}

// Host memory holding `fill`, counting how many were made.
StateRegistry::Allocate host(int* made, float fill = 0.0f) {
  return [made, fill]() -> Result<std::shared_ptr<void>> {
    ++*made;
    auto* data = new std::vector<float>(256, fill);
    return std::shared_ptr<void>(data->data(), [data](void*) { delete data; });
  };
}

TEST(SharedState, MethodsOfOneProgramShareByKey) {
  StateRegistry registry;
  int made = 0;
  int program = 0;  // stands for the loaded program's NamedDataMap
  bool created = false;
  auto prefill = registry.acquire(&program, "decoder.k_cache_0", 0, cache_spec(64), "prefill",
                                  host(&made), &created);
  ASSERT_TRUE(prefill.ok());
  EXPECT_TRUE(created);
  auto decode = registry.acquire(&program, "decoder.k_cache_0", 0, cache_spec(64), "decode",
                                 host(&made), &created);
  ASSERT_TRUE(decode.ok());
  EXPECT_FALSE(created);
  EXPECT_EQ(prefill->get(), decode->get());
  EXPECT_EQ(made, 1);
  auto other_key = registry.acquire(&program, "decoder.v_cache_0", 0, cache_spec(64), "decode",
                                    host(&made));
  ASSERT_TRUE(other_key.ok());
  EXPECT_NE(other_key->get(), prefill->get());
  EXPECT_EQ(registry.live(), 2u);
}

TEST(SharedState, TwoLoadsAndTwoDevicesDoNotShare) {
  StateRegistry registry;
  int made = 0;
  int load_a = 0, load_b = 0;
  auto a = registry.acquire(&load_a, "k", 0, cache_spec(64), "decode", host(&made));
  auto b = registry.acquire(&load_b, "k", 0, cache_spec(64), "decode", host(&made));
  auto c = registry.acquire(&load_a, "k", 1, cache_spec(64), "decode", host(&made));
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  EXPECT_NE(a->get(), b->get());
  EXPECT_NE(a->get(), c->get());
  EXPECT_EQ(made, 3);
}

TEST(SharedState, MismatchedDeclarationIsRefusedWithBothNamed) {
  StateRegistry registry;
  int made = 0;
  int program = 0;
  auto prefill = registry.acquire(&program, "decoder.k_cache_0", 0, cache_spec(64), "method 'prefill'",
                                  host(&made));
  ASSERT_TRUE(prefill.ok());
  testing::captured_log().clear();
  auto rows = registry.acquire(&program, "decoder.k_cache_0", 0, cache_spec(128),
                               "method 'decode'", host(&made));
  EXPECT_EQ(rows.error(), Error::InvalidProgram);
  const std::string& log = testing::captured_log();
  EXPECT_NE(log.find("'decoder.k_cache_0'"), std::string::npos) << log;
  EXPECT_NE(log.find("Float32 [1,2,128,8]"), std::string::npos) << log;
  EXPECT_NE(log.find("Float32 [1,2,64,8]"), std::string::npos) << log;
  EXPECT_NE(log.find("method 'prefill'"), std::string::npos) << log;
  EXPECT_NE(log.find("method 'decode'"), std::string::npos) << log;
  auto dtype = registry.acquire(&program, "decoder.k_cache_0", 0,
                                cache_spec(64, blob::DType::kBFloat16), "method 'decode'",
                                host(&made));
  EXPECT_EQ(dtype.error(), Error::InvalidProgram);
  EXPECT_EQ(made, 1);  // nothing was made for the refused declarations
  auto again = registry.acquire(&program, "decoder.k_cache_0", 0, cache_spec(64), "decode",
                                host(&made));
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->get(), prefill->get());
}

TEST(SharedState, FreedWithItsLastHolderAndMadeAfreshLater) {
  StateRegistry registry;
  int made = 0;
  int program = 0;
  {
    auto first = registry.acquire(&program, "k", 0, cache_spec(64), "prefill", host(&made, 1.0f));
    ASSERT_TRUE(first.ok());
    auto second = registry.acquire(&program, "k", 0, cache_spec(64), "decode", host(&made));
    ASSERT_TRUE(second.ok());
    static_cast<float*>(first->get())[0] = 42.0f;  // a run wrote the cache
    EXPECT_EQ(static_cast<float*>(second->get())[0], 42.0f);
    EXPECT_EQ(registry.live(), 1u);
  }
  EXPECT_EQ(registry.live(), 0u);
  auto later = registry.acquire(&program, "k", 0, cache_spec(128), "prefill", host(&made, 1.0f));
  ASSERT_TRUE(later.ok());  // a new declaration is fine once nobody holds the old one
  EXPECT_EQ(static_cast<float*>(later->get())[0], 1.0f);
  EXPECT_EQ(made, 2);
}

TEST(SharedState, AllocationFailureIsReturnedAndNothingIsKept) {
  StateRegistry registry;
  int program = 0;
  auto failed = registry.acquire(&program, "k", 0, cache_spec(64), "prefill",
                                 []() -> Result<std::shared_ptr<void>> {
                                   return Error::MemoryAllocationFailed;
                                 });
  EXPECT_EQ(failed.error(), Error::MemoryAllocationFailed);
  EXPECT_EQ(registry.live(), 0u);
  int made = 0;
  auto next = registry.acquire(&program, "k", 0, cache_spec(64), "prefill", host(&made));
  EXPECT_TRUE(next.ok());
  EXPECT_EQ(made, 1);
}

TEST(SharedState, SpecDescribesItself) {
  EXPECT_EQ(cache_spec(64).describe(), "Float32 [1,2,64,8] (4096 bytes)");
  EXPECT_TRUE(cache_spec(64) == cache_spec(64));
  EXPECT_FALSE(cache_spec(64) == cache_spec(64, blob::DType::kBFloat16));
}

}  // namespace
}  // namespace kiln::engine
