// The dtype and storage helpers every consumer of the format shares (the reader, the engine, the
// builder), generated from the DType and Storage lists of op_table.def.
#pragma once

#include <cstddef>
#include <cstdint>

#include "format/blob_format.h"

namespace kiln::engine {

#define KILN_DTYPE_CASE_SIZE(Name, value, display, size, floating) \
  case blob::DType::k##Name: return size;
#define KILN_DTYPE_CASE_FLOATING(Name, value, display, size, floating) \
  case blob::DType::k##Name: return floating;
#define KILN_DTYPE_CASE_NAME(Name, value, display, size, floating) \
  case blob::DType::k##Name: return display;
#define KILN_STORAGE_CASE_NAME(Name, value, snake) \
  case blob::Storage::k##Name: return #Name;

/// Bytes per element of a known dtype (Bool is one byte); 0 for a value no dtype has.
constexpr size_t element_size(blob::DType dtype) {
  switch (dtype) { KILN_DTYPES(KILN_DTYPE_CASE_SIZE) }
  return 0;
}

/// Float32, Float16 or BFloat16.
constexpr bool is_floating(blob::DType dtype) {
  switch (dtype) { KILN_DTYPES(KILN_DTYPE_CASE_FLOATING) }
  return false;
}

/// Whether `code` is one of the format's dtypes.
constexpr bool is_known_dtype(uint32_t code) {
  return element_size(static_cast<blob::DType>(code)) != 0;
}

/// "Float32"; "unknown dtype" for a value no dtype has.
constexpr const char* dtype_name(blob::DType dtype) {
  switch (dtype) { KILN_DTYPES(KILN_DTYPE_CASE_NAME) }
  return "unknown dtype";
}

/// "Arena"; "unknown" for a value no storage has.
constexpr const char* storage_name(blob::Storage storage) {
  switch (storage) { KILN_ENUM_Storage(KILN_STORAGE_CASE_NAME) }
  return "unknown";
}

#undef KILN_DTYPE_CASE_SIZE
#undef KILN_DTYPE_CASE_FLOATING
#undef KILN_DTYPE_CASE_NAME
#undef KILN_STORAGE_CASE_NAME

}  // namespace kiln::engine
