// The step registry: each opcode's Step comes from its kernel family's factory,
// kernels::make_<snake>_step(const <Name>Args&, const InitContext&). The declarations and the
// switch are generated from the op table (format/op_table.def), so a new opcode adds nothing here:
// its kernel file defines the factory, and a missing one fails the link naming it.
#include <variant>

#include "format/fail.h"
#include "format/op_table.h"
#include "runtime/engine/cuda_engine.h"
#include "runtime/engine/step.h"

namespace kiln::engine {
namespace kernels {
#define KILN_DECLARE_STEP_FACTORY(Name, code, snake, struct_kind) \
  StepResult make_##snake##_step(const Name##Args&, const InitContext&);
KILN_OPCODES(KILN_DECLARE_STEP_FACTORY)
#undef KILN_DECLARE_STEP_FACTORY
}  // namespace kernels

using executorch::runtime::Error;

StepResult make_step(const Op& op, const InitContext& ctx) {
  switch (op.opcode) {
#define KILN_STEP_CASE(Name, code, snake, struct_kind) \
  case blob::Opcode::k##Name:                   \
    return kernels::make_##snake##_step(std::get<Name##Args>(op.args), ctx);
    KILN_OPCODES(KILN_STEP_CASE)
#undef KILN_STEP_CASE
  }
  return fail(nullptr, Error::InvalidProgram, "Kiln engine: op %zu has unknown opcode %u",
              ctx.op_index, static_cast<unsigned>(op.opcode));
}

}  // namespace kiln::engine
