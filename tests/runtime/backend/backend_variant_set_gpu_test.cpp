// A variant set through KilnBackend: each batch size a variant serves runs on its own plan and
// gives the right answer with the output resized to the variant's shape; a size no variant serves
// is InvalidArgument naming the shapes, and the next valid call still works. Needs a CUDA device
// (ctest label gpu).

#include <executorch/extension/memory_allocator/malloc_memory_allocator.h>
#include <executorch/runtime/backend/interface.h>
#include <executorch/runtime/core/freeable_buffer.h>
#include <executorch/runtime/platform/runtime.h>

#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "tests/format/log_capture.h"
#include "tests/format/variant_set_builder.h"

namespace kiln::engine {
namespace {

namespace et = executorch::runtime;
using executorch::aten::ScalarType;
using executorch::aten::Tensor;
using executorch::aten::TensorImpl;

const auto* const kLog = ::testing::AddGlobalTestEnvironment(new testing::LogCaptureEnvironment);

constexpr int64_t kMaxBatch = 8;

// A float [rows, cols] argument; the output is bounded-dynamic like ExecuTorch's planned
// delegate outputs (memory for the upper bound, resized by the delegate).
struct Arg {
  std::vector<float> data;
  TensorImpl::SizesType sizes[2];
  TensorImpl::DimOrderType order[2] = {0, 1};
  TensorImpl::StridesType strides[2];
  std::unique_ptr<TensorImpl> impl;
  et::EValue value;
  Arg(int64_t rows, int64_t cols, int64_t capacity_rows, bool dynamic)
      : data(static_cast<size_t>(capacity_rows * cols), -7.0f) {
    sizes[0] = static_cast<TensorImpl::SizesType>(rows);
    sizes[1] = static_cast<TensorImpl::SizesType>(cols);
    strides[0] = static_cast<TensorImpl::StridesType>(cols);
    strides[1] = 1;
    impl = std::make_unique<TensorImpl>(
        ScalarType::Float, 2, sizes, data.data(), order, strides,
        dynamic ? executorch::aten::TensorShapeDynamism::DYNAMIC_BOUND
                : executorch::aten::TensorShapeDynamism::STATIC);
    value = et::EValue(Tensor(impl.get()));
  }
};

class BackendVariantSet : public ::testing::Test {
 public:
  void SetUp() override {
    backend_ = et::get_backend_class("KilnBackend");
    ASSERT_NE(backend_, nullptr) << "libkiln_executorch_backend.so is not linked";
    ASSERT_TRUE(backend_->is_available()) << "needs a CUDA device: " << testing::captured_log();
    container_ = testing::linear_relu_set({1, 3, kMaxBatch});
    et::Error error;
    handle_ = init(container_, &error);
    ASSERT_NE(handle_, nullptr) << et::to_string(error) << ": " << testing::captured_log();
  }
  void TearDown() override {
    if (handle_ != nullptr) backend_->destroy(handle_);
  }
  et::DelegateHandle* init(const std::vector<uint8_t>& bytes, et::Error* error) {
    et::FreeableBuffer buffer(bytes.data(), bytes.size(), nullptr);
    et::BackendInitContext context(&allocator_);
    auto h = backend_->init(context, &buffer, {});
    *error = h.ok() ? et::Error::Ok : h.error();
    return h.ok() ? h.get() : nullptr;
  }
  // Runs batch `rows`; returns the error, and checks values and the resized output when Ok.
  et::Error run(int64_t rows) {
    Arg x(rows, 4, rows, false), y(kMaxBatch, 3, kMaxBatch, true);
    for (size_t i = 0; i < x.data.size(); ++i) x.data[i] = std::sin(0.37f * i + rows) * 2.0f;
    std::vector<et::EValue*> args = {&x.value, &y.value};
    et::BackendExecutionContext context;
    const et::Error e = backend_->execute(context, handle_, {args.data(), args.size()});
    if (e != et::Error::Ok) return e;
    const Tensor& out = y.value.toTensor();
    EXPECT_EQ(out.dim(), 2);
    EXPECT_EQ(out.size(0), rows);
    EXPECT_EQ(out.size(1), 3);
    const std::vector<float> want = testing::linear_relu_reference(x.data, rows);
    for (size_t i = 0; i < want.size(); ++i) EXPECT_NEAR(y.data[i], want[i], 1e-5) << rows << " " << i;
    return e;
  }

  et::BackendInterface* backend_ = nullptr;
  executorch::extension::MallocMemoryAllocator allocator_;
  std::vector<uint8_t> container_;
  et::DelegateHandle* handle_ = nullptr;
};

TEST_F(BackendVariantSet, EverySizeAVariantServesRunsOnItsPlan) {
  for (int64_t rows : {1, 3, 8, 1, 8, 3}) {
    EXPECT_EQ(run(rows), et::Error::Ok) << rows << ": " << testing::captured_log();
  }
}

TEST_F(BackendVariantSet, UnservedSizeIsInvalidArgumentAndTheDelegateKeepsWorking) {
  ASSERT_EQ(run(3), et::Error::Ok) << testing::captured_log();
  for (int64_t rows : {5, 9, 2}) {
    testing::captured_log().clear();
    EXPECT_EQ(run(rows), et::Error::InvalidArgument) << rows;
    const std::string& log = testing::captured_log();
    EXPECT_NE(log.find("input shapes [" + std::to_string(rows) + ",4] are served by no"),
              std::string::npos) << log;
    EXPECT_NE(log.find("input 0 [1..8,4] (3 variants)"), std::string::npos) << log;
    EXPECT_EQ(run(8), et::Error::Ok) << testing::captured_log();
    EXPECT_EQ(run(1), et::Error::Ok) << testing::captured_log();
  }
}

TEST_F(BackendVariantSet, MalformedContainerFailsInit) {
  std::vector<uint8_t> bad = container_;
  bad.resize(bad.size() - 1);
  et::Error error;
  EXPECT_EQ(init(bad, &error), nullptr);
  EXPECT_EQ(error, et::Error::InvalidProgram);
  EXPECT_NE(testing::captured_log().find("container_size"), std::string::npos);
}

}  // namespace
}  // namespace kiln::engine
