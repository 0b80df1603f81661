// Engine behaviour that needs no GPU: a bad blob is rejected before any device is touched, and
// on a machine without a usable device create() says why. Runs in CI (no `gpu` label); the
// binary links the CUDA runtime statically, which opens libcuda.so only when first used, so it
// loads on machines without a driver.
#include "runtime/engine/engine.h"

#include <executorch/runtime/platform/platform.h>
#include <executorch/runtime/platform/runtime.h>
#include <gtest/gtest.h>

#include <cstddef>
#include <cstring>
#include <string>
#include <vector>

#include "tests/format/blob_builder.h"
#include "tests/format/log_capture.h"

namespace kiln::engine {
namespace {

using executorch::runtime::Error;
using testing::BlobBuilder;

std::string& g_log = testing::captured_log();
const auto* const kLog = ::testing::AddGlobalTestEnvironment(new testing::LogCaptureEnvironment);

std::vector<uint8_t> small_blob() {
  BlobBuilder b;
  const int64_t x = b.input(blob::DType::kFloat32, {4});
  const int64_t y = b.output(blob::DType::kFloat32, {4});
  b.unary(blob::UnaryKind::kRelu, x, y);
  return b.build();
}

TEST(EngineWithoutGpu, NoDeviceGivesNotFound) {
  const std::string& reason = cuda_unavailable_reason();
  const std::vector<uint8_t> bytes = small_blob();
  if (reason.empty()) {
    // A usable device exists: the reason must stay empty and create() must succeed.
    auto engine = Engine::create(bytes.data(), bytes.size());
    ASSERT_TRUE(engine.ok()) << g_log;
    return;
  }
  g_log.clear();
  auto engine = Engine::create(bytes.data(), bytes.size());
  ASSERT_FALSE(engine.ok());
  if (reason.find("compute capability") != std::string::npos) {
    // A device exists but is older than the build's sm_90.
    EXPECT_EQ(engine.error(), Error::NotSupported) << g_log;
    EXPECT_NE(g_log.find("built for sm_90"), std::string::npos) << g_log;
  } else {
    EXPECT_EQ(engine.error(), Error::NotFound) << g_log;
    EXPECT_NE(g_log.find("no usable CUDA device"), std::string::npos) << g_log;
  }
}

TEST(EngineWithoutGpu, UnavailableReasonIsCachedAndExplains) {
  const std::string& first = cuda_unavailable_reason();
  const std::string& second = cuda_unavailable_reason();
  EXPECT_EQ(&first, &second);
  if (!first.empty()) {
    const bool explains = first.find("cudaGetDeviceCount") != std::string::npos ||
                          first.find("no CUDA device") != std::string::npos;
    EXPECT_TRUE(explains) << first;
  }
}

TEST(EngineWithoutGpu, MalformedBlobIsRejectedBeforeTheDevice) {
  std::vector<uint8_t> bytes = small_blob();
  bytes[0] = 'X';
  g_log.clear();
  auto engine = Engine::create(bytes.data(), bytes.size());
  ASSERT_FALSE(engine.ok());
  EXPECT_EQ(engine.error(), Error::InvalidProgram);
  EXPECT_NE(g_log.find("not a Kiln engine blob"), std::string::npos) << g_log;
}

TEST(EngineWithoutGpu, OtherFormatVersionIsIncompatible) {
  std::vector<uint8_t> bytes = small_blob();
  const uint32_t version = blob::kFormatVersion + 1;
  std::memcpy(bytes.data() + offsetof(blob::Header, format_version), &version, sizeof(version));
  g_log.clear();
  auto engine = Engine::create(bytes.data(), bytes.size());
  ASSERT_FALSE(engine.ok());
  EXPECT_EQ(engine.error(), Error::DelegateInvalidCompatibility);
  EXPECT_NE(g_log.find("re-export"), std::string::npos) << g_log;
}

}  // namespace
}  // namespace kiln::engine
