// Bad input to KilnBackend, table-driven: each row is one bad call with the exact ExecuTorch error
// and a fragment of the message it must log; after every row the same delegate still runs a valid
// call and gives the right answer. Needs a CUDA device (ctest label gpu).
//
// Built twice: against the shipped backend library, and (backend_bad_input_fault_gpu_test) from the
// backend's sources over the fault-injection engine (runtime/engine/fault_injection.h), which adds
// the rows where an op's kernel launch fails.

#include <executorch/extension/memory_allocator/malloc_memory_allocator.h>
#include <executorch/runtime/backend/interface.h>
#include <executorch/runtime/core/freeable_buffer.h>
#include <executorch/runtime/platform/runtime.h>

#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "tests/format/blob_builder.h"
#include "tests/format/log_capture.h"
#ifdef KILN_ENGINE_FAULT_INJECTION
#include "runtime/engine/fault_injection.h"
#endif

namespace kiln::engine {
namespace {

namespace et = executorch::runtime;
using executorch::aten::ScalarType;
using executorch::aten::Tensor;
using executorch::aten::TensorImpl;
using testing::BlobBuilder;

const auto* const kLog = ::testing::AddGlobalTestEnvironment(new testing::LogCaptureEnvironment);

// out = a + b over float [4, 8].
std::vector<uint8_t> add_blob() {
  BlobBuilder b;
  const int64_t x = b.input(blob::DType::kFloat32, {4, 8});
  const int64_t y = b.input(blob::DType::kFloat32, {4, 8});
  const int64_t out = b.output(blob::DType::kFloat32, {4, 8});
  b.binary(blob::BinaryKind::kAdd, x, y, out, 1.0, 0.0, {32}, {1}, {1});
  return b.build();
}

// One tensor argument the test owns.
struct Arg {
  std::vector<float> data;
  std::vector<TensorImpl::SizesType> sizes;
  std::vector<TensorImpl::DimOrderType> order;
  std::unique_ptr<TensorImpl> impl;
  et::EValue value;
  Arg(std::vector<TensorImpl::SizesType> s, float fill, ScalarType dtype = ScalarType::Float,
      std::vector<TensorImpl::DimOrderType> o = {0, 1})
      : data(64, fill), sizes(std::move(s)), order(std::move(o)) {
    impl = std::make_unique<TensorImpl>(dtype, static_cast<ssize_t>(sizes.size()), sizes.data(),
                                        data.data(), order.data());
    value = et::EValue(Tensor(impl.get()));
  }
};

class BackendBadInput : public ::testing::Test {
 public:
  void SetUp() override {
    backend_ = et::get_backend_class("KilnBackend");
    ASSERT_NE(backend_, nullptr) << "libkiln_executorch_backend.so is not linked";
    ASSERT_TRUE(backend_->is_available()) << "needs a CUDA device: " << testing::captured_log();
    blob_ = add_blob();
    handle_ = init(blob_);
    ASSERT_NE(handle_, nullptr);
  }
  void TearDown() override {
    if (handle_ != nullptr) backend_->destroy(handle_);
  }
  et::DelegateHandle* init(const std::vector<uint8_t>& bytes, et::Error* error = nullptr) {
    et::FreeableBuffer buffer(bytes.data(), bytes.size(), nullptr);
    et::BackendInitContext context(&allocator_);
    auto h = backend_->init(context, &buffer, {});
    if (error != nullptr) *error = h.ok() ? et::Error::Ok : h.error();
    return h.ok() ? h.get() : nullptr;
  }
  et::Error execute(std::vector<et::EValue*> args) {
    et::BackendExecutionContext context;
    return backend_->execute(context, handle_, {args.data(), args.size()});
  }
  void expect_valid_call_still_works() {
    Arg a({4, 8}, 1.5f), b({4, 8}, 2.0f), out({4, 8}, -1.0f);
    ASSERT_EQ(execute({&a.value, &b.value, &out.value}), et::Error::Ok) << testing::captured_log();
    for (int i = 0; i < 32; ++i) ASSERT_EQ(out.data[i], 3.5f) << i;
  }

  et::BackendInterface* backend_ = nullptr;
  executorch::extension::MallocMemoryAllocator allocator_;
  std::vector<uint8_t> blob_;
  et::DelegateHandle* handle_ = nullptr;
};

struct Row {
  const char* what;
  std::function<et::Error(BackendBadInput&)> call;
  et::Error error;
  const char* message;
  const char* also = nullptr;  // a second fragment the log must hold, when set
};

TEST_F(BackendBadInput, EveryBadCallIsAnErrorAndTheDelegateKeepsWorking) {
  expect_valid_call_still_works();
  const std::vector<Row> rows = {
      {"too few arguments",
       [](BackendBadInput& t) {
         Arg a({4, 8}, 1), out({4, 8}, 0);
         return t.execute({&a.value, &out.value});
       },
       et::Error::InvalidArgument, "got 2 arguments, the engine takes 2 inputs and 1 outputs"},
      {"a scalar where a tensor belongs",
       [](BackendBadInput& t) {
         Arg a({4, 8}, 1), out({4, 8}, 0);
         et::EValue scalar(int64_t{3});
         return t.execute({&a.value, &scalar, &out.value});
       },
       et::Error::InvalidArgument, "input 1 is Int"},
      {"wrong dtype",
       [](BackendBadInput& t) {
         Arg a({4, 8}, 1), b({4, 8}, 1, ScalarType::Int), out({4, 8}, 0);
         return t.execute({&a.value, &b.value, &out.value});
       },
       et::Error::InvalidArgument, "input 1 has dtype Int"},
      {"wrong shape",
       [](BackendBadInput& t) {
         Arg a({8, 4}, 1), b({4, 8}, 1), out({4, 8}, 0);
         return t.execute({&a.value, &b.value, &out.value});
       },
       et::Error::InvalidArgument, "input 0 has shape [8,4], the engine was built for [4,8]"},
      {"wrong rank",
       [](BackendBadInput& t) {
         Arg a({32}, 1, ScalarType::Float, {0}), b({4, 8}, 1), out({4, 8}, 0);
         return t.execute({&a.value, &b.value, &out.value});
       },
       et::Error::InvalidArgument, "input 0 has shape [32]"},
      {"non-contiguous dim order",
       [](BackendBadInput& t) {
         Arg a({4, 8}, 1, ScalarType::Float, {1, 0}), b({4, 8}, 1), out({4, 8}, 0);
         return t.execute({&a.value, &b.value, &out.value});
       },
       et::Error::NotSupported, "not in contiguous dim order"},
      {"null data pointer",
       [](BackendBadInput& t) {
         Arg a({4, 8}, 1), b({4, 8}, 1), out({4, 8}, 0);
         a.impl->set_data(nullptr);
         return t.execute({&a.value, &b.value, &out.value});
       },
       et::Error::InvalidArgument, "input 0 has no data pointer"},
#ifdef KILN_ENGINE_FAULT_INJECTION
      // A kernel launch CUDA rejects (cudaGetLastError, not a sticky fault), on a new delegate's
      // first run, which is eager: the delegate keeps working (the check after the row).
      {"a kernel launch fails on the eager first run",
       [](BackendBadInput& t) {
         t.backend_->destroy(t.handle_);
         t.handle_ = t.init(t.blob_);
         kiln_fault_fail_launch(0, 1);
         Arg a({4, 8}, 1), b({4, 8}, 1), out({4, 8}, 0);
         const et::Error e = t.execute({&a.value, &b.value, &out.value});
         kiln_fault_fail_launch(0, 0);
         return e;
       },
       et::Error::Internal, "op 0 (binary): kernel launch failed", "cudaErrorInvalid"},
      // The delegate's second run captures its CUDA graph: the failure hits the capture, and the
      // next call captures again and replays.
      {"a kernel launch fails while the CUDA graph is captured",
       [](BackendBadInput& t) {
         kiln_fault_fail_launch(0, 1);
         Arg a({4, 8}, 1), b({4, 8}, 1), out({4, 8}, 0);
         const et::Error e = t.execute({&a.value, &b.value, &out.value});
         kiln_fault_fail_launch(0, 0);
         return e;
       },
       et::Error::Internal, "op 0 (binary): kernel launch failed", "cudaErrorInvalid"},
#endif
  };
  for (const Row& row : rows) {
    testing::captured_log().clear();
    EXPECT_EQ(row.call(*this), row.error) << row.what;
    EXPECT_NE(testing::captured_log().find(row.message), std::string::npos)
        << row.what << ": log was\n" << testing::captured_log();
    if (row.also != nullptr) {
      EXPECT_NE(testing::captured_log().find(row.also), std::string::npos)
          << row.what << ": log was\n" << testing::captured_log();
    }
    expect_valid_call_still_works();
  }
#ifdef KILN_ENGINE_FAULT_INJECTION
  // After both failures the delegate is back on CUDA graphs: each call is one graph launch.
  const unsigned long long launches = kiln_fault_graph_launches();
  expect_valid_call_still_works();
  expect_valid_call_still_works();
  EXPECT_EQ(kiln_fault_graph_launches() - launches, 2u);
#endif
}

TEST_F(BackendBadInput, BadBlobsFailInitWithTheirOwnError) {
  struct BlobRow {
    const char* what;
    std::function<void(std::vector<uint8_t>&)> damage;
    et::Error error;
    const char* message;
  };
  const std::vector<BlobRow> rows = {
      {"wrong magic", [](std::vector<uint8_t>& b) { b[0] = 'X'; }, et::Error::InvalidProgram,
       "not a Kiln engine blob"},
      {"newer format version",
       [](std::vector<uint8_t>& b) { b[8] = kiln::engine::blob::kFormatVersion + 1; },
       et::Error::DelegateInvalidCompatibility, "version"},
      {"truncated", [](std::vector<uint8_t>& b) { b.resize(b.size() / 2); }, et::Error::InvalidProgram,
       "Kiln blob"},
  };
  for (const BlobRow& row : rows) {
    std::vector<uint8_t> bytes = blob_;
    row.damage(bytes);
    testing::captured_log().clear();
    et::Error error = et::Error::Ok;
    EXPECT_EQ(init(bytes, &error), nullptr) << row.what;
    EXPECT_EQ(error, row.error) << row.what;
    EXPECT_NE(testing::captured_log().find(row.message), std::string::npos)
        << row.what << ": log was\n" << testing::captured_log();
  }
  expect_valid_call_still_works();
}

}  // namespace
}  // namespace kiln::engine
