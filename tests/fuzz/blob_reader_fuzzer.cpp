// libFuzzer target for the CPU side of KilnBackend::init: everything Engine::create does before
// its first CUDA call (read_blob: header, sections, tensor records, io table, every op's operands;
// for a variant set, read_variant_set and every variant blob in it)
// plus the host-side step planning the executor does on the decoded graph (strided.h: collapse and
// widen of copy / binary / where loops), which is plain C++ even though it runs after the device
// buffers exist.
//
// A finding is any of: a sanitizer report (ASan, UBSan; built with -fno-sanitize-recover), an
// error other than InvalidProgram / DelegateInvalidCompatibility, an error without a message, or
// an accepted blob whose Graph breaks graph.h's promise (graph_contract.h) — the last one is what
// would turn into an out-of-bounds access on the GPU, where no sanitizer sees it.
//
// Build and run: scripts/fuzz.sh [seconds]. Each crash becomes a file under tests/fuzz/regressions/
// that tests/fuzz/corpus_replay_test.cpp replays in CI.
#include <executorch/runtime/platform/platform.h>
#include <executorch/runtime/platform/runtime.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "tests/fuzz/read_any.h"

namespace {

using executorch::runtime::Error;

// Every rejected input logs one line at Error level; at millions of inputs a second that is all
// the fuzzer would do. Messages still reach `why`, which is what the checks below look at.
void drop_log(et_timestamp_t, et_pal_log_level_t, const char*, const char*, size_t, const char*,
              size_t) {}

[[noreturn]] void finding(const char* what, const std::string& detail) {
  std::fprintf(stderr, "blob_reader_fuzzer: %s: %s\n", what, detail.c_str());
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  executorch::runtime::runtime_init();
  executorch::runtime::register_pal(executorch::runtime::PalImpl::create(drop_log, __FILE__));
  return 0;
}

extern "C" size_t LLVMFuzzerMutate(uint8_t* data, size_t size, size_t max_size);

// libFuzzer's own mutations, then, seven times in eight, blob_size set to the new length: the
// reader rejects a blob whose blob_size is not its length before it looks at anything else, so
// without this every mutation that inserts or erases bytes would stop at the header. The eighth
// keeps the mismatch itself fuzzed.
extern "C" size_t LLVMFuzzerCustomMutator(uint8_t* data, size_t size, size_t max_size,
                                          unsigned int seed) {
  size = LLVMFuzzerMutate(data, size, max_size);
  constexpr size_t kAt = offsetof(kiln::engine::blob::Header, blob_size);
  if (size >= kAt + sizeof(uint64_t) && seed % 8 != 0) {
    const uint64_t length = size;
    std::memcpy(data + kAt, &length, sizeof(length));
  }
  return size;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // libFuzzer hands over an exact-size heap copy of the input, so ASan reports any read past
  // [data, data + size).
  const kiln::engine::fuzz::ReadResult r = kiln::engine::fuzz::read_any(data, size);
  if (r.error != Error::Ok) {
    if (r.error != Error::InvalidProgram && r.error != Error::DelegateInvalidCompatibility) {
      finding("unexpected error code", std::to_string(static_cast<int>(r.error)) + " " + r.why);
    }
    if (r.why.empty()) {
      finding("an error without a message", std::to_string(static_cast<int>(r.error)));
    }
    return 0;
  }
  if (!r.broken.empty()) {
    finding("the reader accepted an input whose graph breaks its contract", r.broken);
  }
  return 0;
}
