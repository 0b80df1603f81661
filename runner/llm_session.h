// kiln_llm's steps: a program export_llm wrote, its prefill and decode methods loaded once (one KV
// cache on the device), and how a step's inputs reach them and their outputs come back.
//
// Each method returns the logits at the chunk's last token and their argmax, the greedy next
// token, computed on the GPU. A host-I/O program (the default export) takes host tensors:
// ExecuTorch copies the inputs in and both outputs out on every step. A device-resident program
// (export_llm(..., device_resident=True)) takes device tensors the session owns: a greedy step
// feeds the previous step's token output to the decode input with a device copy, so the logits
// stay on the GPU and nothing returns to the host until the tokens are read at the end; the
// session copies logits to the host only when asked (sampling, --logits).
#pragma once

#include <executorch/runtime/core/portable_type/tensor_impl.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "runner/program_loader.h"

namespace kiln::runner {

class LlmSession {
 public:
  /// Loads both methods of `program` and checks their inputs and outputs are those export_llm
  /// writes (chunk: the prefill length, vocab: the vocabulary); exits with a message otherwise.
  LlmSession(et::Program& program, const std::string& model, int64_t chunk, int64_t vocab,
             int64_t max_context);
  ~LlmSession();
  LlmSession(const LlmSession&) = delete;
  LlmSession& operator=(const LlmSession&) = delete;

  bool device_resident() const { return device_; }
  double load_ms(bool prefill) const;

  /// One prefill chunk: `chunk` token ids, their cache rows, and the index of the chunk's last
  /// real token (the logits and token returned are that row's).
  void prefill(const std::vector<int64_t>& tokens, const std::vector<int64_t>& positions,
               int64_t last, const std::string& what);
  /// One decode step of `token` at cache row `position`.
  void decode(int64_t token, int64_t position, const std::string& what);
  /// One decode step at `position` whose token is the previous step's greedy token, without the
  /// host reading it (device-resident programs: a device copy; host I/O: the host copy).
  void decode_greedy(int64_t position, const std::string& what);

  /// The last step's greedy token (waits for the step).
  int64_t token();
  /// The last step's logits in host memory (vocab floats, valid until the next step).
  const float* logits();
  /// Greedy tokens of the decode_greedy steps so far, in order (waits for them).
  std::vector<int64_t> greedy_tokens();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  bool device_ = false;
};

}  // namespace kiln::runner
