// Program state on the GPU: a kState tensor written in place by kIndexPut keeps its contents
// across executes (eager first run, then CUDA-graph replays), only inputs and outputs cross the
// bus, a bad position is an execution error that leaves the state and the engine usable, and
// engines of one program share the states they name.
// Needs a GPU: the `gpu` CTest label keeps it out of CPU-only CI.
#include "runtime/engine/engine.h"
#include "runtime/engine/step.h"

#include <cuda_bf16.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "tests/format/blob_builder.h"
#include "tests/format/log_capture.h"

namespace kiln::engine {
namespace {

using blob::DType;
using executorch::runtime::Error;
using executorch::runtime::Span;
using testing::BlobBuilder;

std::string& g_log = testing::captured_log();
const auto* const kLog = ::testing::AddGlobalTestEnvironment(new testing::LogCaptureEnvironment);

constexpr int64_t kOuter = 2, kLen = 8, kInner = 4;  // cache [2, 8, 4]
constexpr int64_t kCache = kOuter * kLen * kInner;
constexpr size_t kErrorFlagBytes = sizeof(DeviceErrorFlag);  // read back after every run

// cache <- values at pos; out = cache (a copy through a view). Returns the blob.
std::vector<uint8_t> cache_blob(const std::vector<float>& initial) {
  BlobBuilder b;
  const int64_t cache = b.state(DType::kFloat32, {kOuter, kLen, kInner}, initial.data());
  const int64_t values = b.input(DType::kFloat32, {kOuter, 1, kInner});
  const int64_t pos = b.input(DType::kInt64, {1});
  const int64_t view = b.view(cache, {kCache});
  const int64_t out = b.output(DType::kFloat32, {kCache});
  b.index_put(values, pos, cache, kOuter, kLen, kInner, 1);
  b.copy(view, out, {kCache}, 0, {1}, 0, {1});
  return b.build();
}

// A state [outer, len, inner] of `dtype` (initial value `init`) written by index_put at n
// positions of `pos_dtype`, copied out whole: inputs values [outer, n, inner] and positions [n].
std::vector<uint8_t> rows_blob(DType dtype, DType pos_dtype, int64_t outer, int64_t len,
                               int64_t inner, int64_t n, const void* init) {
  BlobBuilder b;
  const int64_t cache = b.state(dtype, {outer, len, inner}, init);
  const int64_t values = b.input(dtype, {outer, n, inner});
  const int64_t pos = b.input(pos_dtype, {n});
  const int64_t out = b.output(dtype, {outer, len, inner});
  b.index_put(values, pos, cache, outer, len, inner, n);
  b.copy(cache, out, {outer * len * inner}, 0, {1}, 0, {1});
  return b.build();
}

class StateGpu : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(cuda_unavailable_reason().empty())
        << "state_gpu_test needs a CUDA device: " << cuda_unavailable_reason();
  }
};

struct Step {
  std::vector<float> values = std::vector<float>(kOuter * kInner);
  int64_t pos = 0;
  std::vector<float> out = std::vector<float>(kCache, -7.0f);
  Binding in[2];
  Binding o;

  Error run(Engine& e) {
    in[0] = {values.data(), values.size() * sizeof(float), false};
    in[1] = {&pos, sizeof(pos), false};
    o = {out.data(), out.size() * sizeof(float), false};
    return e.execute(Span<const Binding>(in, 2), Span<const Binding>(&o, 1));
  }
};

void write_rows(std::vector<float>& cache, const std::vector<float>& values, int64_t pos) {
  for (int64_t o = 0; o < kOuter; ++o)
    for (int64_t j = 0; j < kInner; ++j)
      cache[(o * kLen + pos) * kInner + j] = values[o * kInner + j];
}

TEST_F(StateGpu, StatePersistsAcrossExecutesAndReplays) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> model(kCache);
  for (float& v : model) v = dist(rng);  // a nonzero initial value, so it must be uploaded
  const std::vector<uint8_t> blob = cache_blob(model);
  auto engine = Engine::create(blob.data(), blob.size());
  ASSERT_TRUE(engine.ok()) << g_log;
  // Two passes over every position: the second overwrites rows the first wrote, and each step
  // sees every earlier step's rows.
  for (int round = 0; round < 2 * kLen; ++round) {
    Step s;
    for (float& v : s.values) v = dist(rng);
    s.pos = (round * 3) % kLen;
    const CopyCounters before = copy_counters();
    ASSERT_EQ(s.run(**engine), Error::Ok) << g_log;
    const CopyCounters after = copy_counters();
    write_rows(model, s.values, s.pos);
    EXPECT_EQ(s.out, model) << "step " << round;
    // Only the inputs, the output and the error flag cross the bus; the state never does.
    EXPECT_EQ(after.host_to_device_bytes - before.host_to_device_bytes,
              s.values.size() * sizeof(float) + sizeof(int64_t));
    EXPECT_EQ(after.device_to_host_bytes - before.device_to_host_bytes,
              kCache * sizeof(float) + kErrorFlagBytes);
    EXPECT_EQ(after.executes - before.executes, 1u);
  }
}

TEST_F(StateGpu, OutOfRangePositionIsAnErrorAndLeavesStateAndEngineUsable) {
  std::vector<float> model(kCache, 0.0f);
  const std::vector<uint8_t> blob = cache_blob(model);
  auto engine = Engine::create(blob.data(), blob.size());
  ASSERT_TRUE(engine.ok()) << g_log;
  float next = 1.0f;
  for (int round = 0; round < 3; ++round) {  // eager, then replays: the flag resets every run
    Step good;
    for (float& v : good.values) v = next++;
    good.pos = round;
    ASSERT_EQ(good.run(**engine), Error::Ok) << g_log;
    write_rows(model, good.values, good.pos);
    EXPECT_EQ(good.out, model);
    for (int64_t bad : {kLen, int64_t{-1}, int64_t{1} << 40}) {
      Step s;
      for (float& v : s.values) v = 99.0f;
      s.pos = bad;
      g_log.clear();
      EXPECT_EQ(s.run(**engine), Error::InvalidArgument);
      EXPECT_NE(g_log.find("index_put"), std::string::npos) << g_log;
      EXPECT_NE(g_log.find("position " + std::to_string(bad)), std::string::npos) << g_log;
      EXPECT_NE(g_log.find("outside [0, 8)"), std::string::npos) << g_log;
      EXPECT_EQ(s.out, model) << "a rejected write must leave the state as it was";
    }
  }
  Step after;
  for (float& v : after.values) v = -3.0f;
  after.pos = kLen - 1;
  ASSERT_EQ(after.run(**engine), Error::Ok) << g_log;
  write_rows(model, after.values, after.pos);
  EXPECT_EQ(after.out, model);
}

TEST_F(StateGpu, SeveralInt32PositionsIntoBFloat16StateWithWideRows) {
  // bf16 rows of 8 elements = 16 bytes: the 16-byte word path.
  constexpr int64_t outer = 3, len = 6, inner = 8, n = 2;
  std::vector<__nv_bfloat16> init(outer * len * inner, __float2bfloat16(0.5f));
  const std::vector<uint8_t> blob =
      rows_blob(DType::kBFloat16, DType::kInt32, outer, len, inner, n, init.data());
  auto engine = Engine::create(blob.data(), blob.size());
  ASSERT_TRUE(engine.ok()) << g_log;
  std::vector<float> model(outer * len * inner, 0.5f);
  for (int step = 0; step < 3; ++step) {
    std::vector<__nv_bfloat16> v(outer * n * inner);
    for (size_t k = 0; k < v.size(); ++k) v[k] = __float2bfloat16(static_cast<float>(step * 100 + k));
    int32_t p[n] = {step, static_cast<int32_t>(len - 1 - step)};
    std::vector<__nv_bfloat16> result(outer * len * inner);
    const Binding in[2] = {{v.data(), v.size() * 2, false}, {p, sizeof(p), false}};
    const Binding o{result.data(), result.size() * 2, false};
    ASSERT_EQ((*engine)->execute(Span<const Binding>(in, 2), Span<const Binding>(&o, 1)), Error::Ok)
        << g_log;
    for (int64_t a = 0; a < outer; ++a)
      for (int64_t i = 0; i < n; ++i)
        for (int64_t j = 0; j < inner; ++j)
          model[(a * len + p[i]) * inner + j] = __bfloat162float(v[(a * n + i) * inner + j]);
    for (size_t k = 0; k < model.size(); ++k) {
      ASSERT_EQ(__bfloat162float(result[k]), model[k]) << "step " << step << " element " << k;
    }
  }
}

// A call of many positions (a prefill chunk) with one outside the state writes no row at all,
// whether every block checks the positions itself (up to 1024 positions, several blocks) or a
// check kernel runs first (more); the same call with the position fixed writes them all.
TEST_F(StateGpu, ManyPositionsWithOneOutOfRangeWriteNothing) {
  for (const int64_t n : {int64_t{300}, int64_t{1100}}) {
    const int64_t outer = 3, len = n + 5, inner = 4;  // float rows of 16 bytes: one word each
    std::vector<float> init(outer * len * inner, 0.25f);
    const std::vector<uint8_t> blob =
        rows_blob(DType::kFloat32, DType::kInt64, outer, len, inner, n, init.data());
    auto engine = Engine::create(blob.data(), blob.size());
    ASSERT_TRUE(engine.ok()) << g_log;
    std::vector<float> v(outer * n * inner);
    for (size_t k = 0; k < v.size(); ++k) v[k] = static_cast<float>(k + 1);
    std::vector<int64_t> p(n);
    for (int64_t i = 0; i < n; ++i) p[i] = (i * 7) % len;  // distinct: 7 and len share no factor
    for (int round = 0; round < 3; ++round) {   // eager, capture, replay
      p[n / 2] = len;   // out of range
      std::vector<float> result(init.size(), -1.0f);
      Binding in[2] = {{v.data(), v.size() * sizeof(float), false},
                       {p.data(), p.size() * sizeof(int64_t), false}};
      Binding o{result.data(), result.size() * sizeof(float), false};
      g_log.clear();
      EXPECT_EQ((*engine)->execute(Span<const Binding>(in, 2), Span<const Binding>(&o, 1)),
                Error::InvalidArgument) << n;
      EXPECT_NE(g_log.find("position " + std::to_string(len)), std::string::npos) << g_log;
      EXPECT_EQ(result, init) << n << ": a rejected call must leave every row as it was";
    }
    p[n / 2] = (n / 2 * 7) % len;
    std::vector<float> result(init.size(), -1.0f);
    Binding in[2] = {{v.data(), v.size() * sizeof(float), false},
                     {p.data(), p.size() * sizeof(int64_t), false}};
    Binding o{result.data(), result.size() * sizeof(float), false};
    ASSERT_EQ((*engine)->execute(Span<const Binding>(in, 2), Span<const Binding>(&o, 1)),
              Error::Ok) << g_log;
    std::vector<float> model = init;
    for (int64_t a = 0; a < outer; ++a)
      for (int64_t i = 0; i < n; ++i)
        for (int64_t j = 0; j < inner; ++j)
          model[(a * len + p[i]) * inner + j] = v[(a * n + i) * inner + j];
    EXPECT_EQ(result, model) << n;
  }
}

// Named states (format/state_keys.h, StateSharing): two engines of one scope that name the same
// key use one device buffer, so a row engine A writes is what engine B reads (a prefill and a
// decode method sharing a KV cache); an engine of another scope (another loaded program) and an
// engine without keys keep their own. A second engine that declares the state with another shape
// is refused at create with a log line naming the key.
TEST_F(StateGpu, EnginesOfOneScopeShareANamedState) {
  std::vector<float> model(kCache, 0.5f);
  const std::vector<uint8_t> blob = cache_blob(model);
  const std::vector<std::string> keys = {"decoder.k_cache_0"};
  int program = 0, other_program = 0;
  StateSharing prefill_sharing{&program, &keys, "method 'prefill'"};
  StateSharing decode_sharing{&program, &keys, "method 'decode'"};
  StateSharing other_sharing{&other_program, &keys, "method 'decode'"};
  auto prefill = Engine::create(blob.data(), blob.size(), 0, nullptr, &prefill_sharing);
  ASSERT_TRUE(prefill.ok()) << g_log;
  Step first;
  for (size_t i = 0; i < first.values.size(); ++i) first.values[i] = float(i);
  first.pos = 2;
  ASSERT_EQ(first.run(**prefill), Error::Ok) << g_log;
  write_rows(model, first.values, first.pos);
  // Loaded after prefill ran: decode sees prefill's rows, not the initial value.
  auto decode = Engine::create(blob.data(), blob.size(), 0, nullptr, &decode_sharing);
  ASSERT_TRUE(decode.ok()) << g_log;
  auto other = Engine::create(blob.data(), blob.size(), 0, nullptr, &other_sharing);
  ASSERT_TRUE(other.ok()) << g_log;
  auto unshared = Engine::create(blob.data(), blob.size());
  ASSERT_TRUE(unshared.ok()) << g_log;
  Step second;
  for (float& v : second.values) v = -1.0f;
  second.pos = 5;
  ASSERT_EQ(second.run(**decode), Error::Ok) << g_log;
  write_rows(model, second.values, second.pos);
  EXPECT_EQ(second.out, model) << "decode must read the rows prefill wrote";
  Step third;  // prefill again: sees decode's row too
  third.values = second.values;
  third.pos = 5;
  ASSERT_EQ(third.run(**prefill), Error::Ok) << g_log;
  EXPECT_EQ(third.out, model);
  std::vector<float> fresh(kCache, 0.5f);
  write_rows(fresh, second.values, 5);
  for (auto* e : {&other, &unshared}) {
    Step s;
    s.values = second.values;
    s.pos = 5;
    ASSERT_EQ(s.run(***e), Error::Ok) << g_log;
    EXPECT_EQ(s.out, fresh) << "another program's engine must not see this program's cache";
  }
  // Another declaration of the same key in the same scope: refused, naming it.
  BlobBuilder b;
  std::vector<float> wide(2 * kCache, 0.0f);
  const int64_t cache = b.state(DType::kFloat32, {kOuter, 2 * kLen, kInner}, wide.data());
  const int64_t values = b.input(DType::kFloat32, {kOuter, 1, kInner});
  const int64_t pos = b.input(DType::kInt64, {1});
  const int64_t view = b.view(cache, {2 * kCache});
  const int64_t out = b.output(DType::kFloat32, {2 * kCache});
  b.index_put(values, pos, cache, kOuter, 2 * kLen, kInner, 1);
  b.copy(view, out, {2 * kCache}, 0, {1}, 0, {1});
  const std::vector<uint8_t> wide_blob = b.build();
  g_log.clear();
  auto mismatched = Engine::create(wide_blob.data(), wide_blob.size(), 0, nullptr, &decode_sharing);
  ASSERT_FALSE(mismatched.ok());
  EXPECT_EQ(mismatched.error(), Error::InvalidProgram);
  EXPECT_NE(g_log.find("'decoder.k_cache_0'"), std::string::npos) << g_log;
  EXPECT_NE(g_log.find("[2,16,4]"), std::string::npos) << g_log;
  // A key count that differs from the blob's states.
  const std::vector<std::string> two = {"a", "b"};
  StateSharing wrong{&program, &two, "method 'decode'"};
  g_log.clear();
  auto miscounted = Engine::create(blob.data(), blob.size(), 0, nullptr, &wrong);
  ASSERT_FALSE(miscounted.ok());
  EXPECT_NE(g_log.find("names 2 states but its blob declares 1"), std::string::npos) << g_log;
}

}  // namespace
}  // namespace kiln::engine
