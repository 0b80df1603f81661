// The format as data: every constant, enum, opcode with its operand fields, and record layout of
// blob_format.h / op_table.def / variant_set.h as one JSON document. The builder's C API returns
// it (kiln_builder_format_description), and the Python mirror (aot/blob_format.py) is built from
// it, so Python repeats nothing by hand.
#pragma once

namespace kiln::engine::blob {

/// The JSON document, built once; NUL-terminated, valid for the life of the process.
const char* format_description_json();

}  // namespace kiln::engine::blob
