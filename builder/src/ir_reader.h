// Parses the IR interchange format (kiln/builder.h) into a Graph, checking every count, offset,
// id and enum before using it.
#pragma once

#include <cstddef>

#include "builder/src/ir.h"

namespace kiln::builder {

/// Throws BuildError(KILN_BUILDER_INVALID_IR) naming the field, tensor id or op index at fault.
Graph read_ir(const void* data, size_t size);

}  // namespace kiln::builder
