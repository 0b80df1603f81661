// The C boundary: every entry point catches everything, so no exception leaves the library.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>
#include <string>

#include "builder/src/blob_writer.h"
#include "builder/src/ir_reader.h"
#include "builder/src/passes.h"
#include "kiln/builder.h"
#include "format/blob_reader.h"
#include "format/format_description.h"
#include "format/variant_set_reader.h"

namespace kiln::builder {
namespace {

void set_error(char* error, size_t error_size, const std::string& message) {
  if (error == nullptr || error_size == 0) return;
  std::snprintf(error, error_size, "%s", message.c_str());
}

Graph build(const void* ir, size_t ir_size, uint32_t passes) {
  Graph g = read_ir(ir, ir_size);
  if (passes & KILN_BUILDER_PASS_DEAD_OPS) eliminate_dead_ops(g);
  if (passes & KILN_BUILDER_PASS_FUSE_NORMS) fuse_rms_norms(g);
  if (passes & KILN_BUILDER_PASS_MATMUL_EPILOGUES) fuse_silu(g);
  if (passes & KILN_BUILDER_PASS_MATMUL_EPILOGUES) fuse_matmul_epilogues(g);
  if (passes & KILN_BUILDER_PASS_MATMUL_EPILOGUES) fuse_conv_epilogues(g);
  if (passes & KILN_BUILDER_PASS_MATMUL_EPILOGUES) fold_attention_transposes(g);
  if (passes & KILN_BUILDER_PASS_PRECISION) convert_precision(g);
  if (passes & KILN_BUILDER_PASS_CHANNELS_LAST) convert_to_channels_last(g);
  if (passes & KILN_BUILDER_PASS_REDUNDANT_COPIES) compose_copies(g);
  if (passes & KILN_BUILDER_PASS_REDUNDANT_COPIES) drop_identity_ops(g);
  if (passes & KILN_BUILDER_PASS_FUSE_NORMS) fold_norm_weights(g);
  if (passes & KILN_BUILDER_PASS_FUSE_ELEMENTWISE) fuse_elementwise(g);
  if (passes & KILN_BUILDER_PASS_BIND_OUTPUTS) bind_outputs(g);
  if (passes & KILN_BUILDER_PASS_REDUNDANT_COPIES) view_contiguous_copies(g);
  if (passes & KILN_BUILDER_PASS_COMPACT) compact(g);
  if (passes & KILN_BUILDER_PASS_PLAN_MEMORY) plan_memory(g);
  return g;
}

// The delegate input shapes a variant serves, in argument order (an input's offset is its index).
std::vector<std::vector<int64_t>> input_shapes(const Graph& g, size_t variant) {
  std::vector<std::vector<int64_t>> shapes(g.inputs.size());
  for (int64_t tid : g.inputs) {
    const Tensor& t = g.tensors[size_t(tid)];
    if (t.offset >= shapes.size()) {
      fail(KILN_BUILDER_BUILD_FAILED, "variant %zu: input tensor %lld has argument index %llu of %zu",
           variant, (long long)tid, (unsigned long long)t.offset, shapes.size());
    }
    shapes[t.offset] = t.shape;
  }
  return shapes;
}

void* to_malloc(const std::vector<uint8_t>& bytes) {
  void* p = std::malloc(bytes.empty() ? 1 : bytes.size());
  if (p == nullptr) throw std::bad_alloc();
  if (!bytes.empty()) std::memcpy(p, bytes.data(), bytes.size());
  return p;
}

template <typename Fn>
int guarded(void** out, size_t* out_size, char* error, size_t error_size, Fn fn) {
  if (out == nullptr || out_size == nullptr) {
    set_error(error, error_size, "kiln_builder: the output pointers must not be NULL");
    return KILN_BUILDER_INTERNAL;
  }
  *out = nullptr;
  *out_size = 0;
  try {
    std::vector<uint8_t> bytes = fn();
    *out = to_malloc(bytes);
    *out_size = bytes.size();
    if (error != nullptr && error_size > 0) error[0] = '\0';
    return KILN_BUILDER_OK;
  } catch (const BuildError& e) {
    set_error(error, error_size, e.what());
    return e.code;
  } catch (const std::bad_alloc&) {
    set_error(error, error_size, "kiln_builder: out of memory");
  } catch (const std::exception& e) {
    set_error(error, error_size, std::string("kiln_builder: internal error: ") + e.what());
  } catch (...) {
    set_error(error, error_size, "kiln_builder: internal error");
  }
  return KILN_BUILDER_INTERNAL;
}

}  // namespace
}  // namespace kiln::builder

using namespace kiln::builder;

extern "C" {

__attribute__((visibility("default"))) uint32_t kiln_builder_api_version(void) {
  return KILN_BUILDER_API_VERSION;
}

__attribute__((visibility("default"))) int kiln_builder_build_blob(
    const void* ir, size_t ir_size, uint32_t passes, void** blob, size_t* blob_size, char* error,
    size_t error_size) {
  return guarded(blob, blob_size, error, error_size, [&] {
    std::vector<uint8_t> bytes = write_blob(build(ir, ir_size, passes));
    if (!(passes & KILN_BUILDER_UNCHECKED)) {
      std::string why;
      if (!kiln::engine::read_blob(bytes.data(), bytes.size(), &why).ok()) {
        fail(KILN_BUILDER_INVALID_BLOB, "the runtime's blob reader rejects the built blob: %s",
             why.c_str());
      }
    }
    return bytes;
  });
}

__attribute__((visibility("default"))) int kiln_builder_build_variant_set(
    const void* const* irs, const size_t* ir_sizes, size_t count, uint32_t passes, void** out,
    size_t* out_size, char* error, size_t error_size) {
  return guarded(out, out_size, error, error_size, [&] {
    if (count > 0 && (irs == nullptr || ir_sizes == nullptr)) {
      fail(KILN_BUILDER_INTERNAL, "kiln_builder_build_variant_set: irs and ir_sizes must not be NULL");
    }
    std::vector<VariantBlob> variants;
    for (size_t v = 0; v < count; ++v) {
      try {
        Graph g = build(irs[v], ir_sizes[v], passes);
        variants.push_back({write_blob(g), input_shapes(g, v)});
      } catch (const BuildError& e) {
        throw BuildError(e.code, "variant " + std::to_string(v) + ": " + e.what());
      }
    }
    std::vector<uint8_t> bytes = write_variant_set(variants);
    if (!(passes & KILN_BUILDER_UNCHECKED)) {
      std::string why;
      if (!kiln::engine::read_variant_set(bytes.data(), bytes.size(), &why).ok()) {
        fail(KILN_BUILDER_INVALID_BLOB, "the runtime's reader rejects the built variant set: %s",
             why.c_str());
      }
    }
    return bytes;
  });
}

__attribute__((visibility("default"))) const char* kiln_builder_format_description(void) {
  try {
    return kiln::engine::blob::format_description_json();
  } catch (...) {
    return nullptr;  // out of memory building it: no exception leaves the library
  }
}

__attribute__((visibility("default"))) void kiln_builder_free(void* buffer) { std::free(buffer); }

}  // extern "C"
