#include "kiln/executorch/stream.h"

namespace {
thread_local CUstream_st* t_stream = nullptr;  // per thread: threads may each use their own
}  // namespace

extern "C" CUstream_st* kiln_executorch_set_stream(CUstream_st* stream) {
  CUstream_st* previous = t_stream;
  t_stream = stream;
  return previous;
}

extern "C" CUstream_st* kiln_executorch_current_stream(void) { return t_stream; }
