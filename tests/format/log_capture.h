// ExecuTorch's log captured in memory, so a test can assert on the message an error produced.
// Include from one test binary's files and register the environment once:
//   const auto* const kLog = ::testing::AddGlobalTestEnvironment(new LogCaptureEnvironment);
#pragma once

#include <executorch/runtime/platform/platform.h>
#include <executorch/runtime/platform/runtime.h>
#include <gtest/gtest.h>

#include <mutex>
#include <string>

namespace kiln::engine::testing {

/// Every message logged since the process started (or since the test cleared it), one per line.
inline std::string& captured_log() {
  static std::string log;
  return log;
}

inline void capture_log(et_timestamp_t, et_pal_log_level_t, const char*, const char*, size_t,
                        const char* message, size_t length) {
  // Engines on several threads may log at once; readers look only after the threads joined.
  static std::mutex mutex;
  std::lock_guard<std::mutex> lock(mutex);
  captured_log().append(message, length);
  captured_log() += '\n';
}

class LogCaptureEnvironment : public ::testing::Environment {
 public:
  void SetUp() override {
    executorch::runtime::runtime_init();
    executorch::runtime::register_pal(executorch::runtime::PalImpl::create(capture_log, __FILE__));
  }
};

}  // namespace kiln::engine::testing
