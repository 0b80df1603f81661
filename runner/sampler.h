// Token sampling for kiln_llm: greedy (argmax), or a seeded draw from the softmax of the logits
// divided by a temperature, restricted to the top-k tokens and/or the smallest set whose
// probability reaches top-p. Plain C++ on the host, unit-tested without a GPU.
#pragma once

#include <cstddef>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

namespace kiln::runner {

struct SamplingOptions {
  bool greedy = true;        // argmax; the other fields are ignored
  double temperature = 1.0;  // > 0
  int64_t top_k = 0;         // 0: no limit
  double top_p = 1.0;        // in (0, 1]; 1: no limit
  uint64_t seed = 0;
};

/// Empty when the options are valid, else a sentence naming the bad one.
std::string check_sampling(const SamplingOptions& opts);

class Sampler {
 public:
  explicit Sampler(const SamplingOptions& opts) : opts_(opts), rng_(opts.seed) {}

  /// The next token from `n` logits (n >= 1). Ties of greedy go to the lowest id, as torch's
  /// argmax. A NaN logit counts as the smallest value.
  int64_t next(const float* logits, size_t n);

 private:
  SamplingOptions opts_;
  std::mt19937_64 rng_;
  std::vector<std::pair<float, int64_t>> candidates_;  // reused: no allocation per token
  std::vector<double> weights_;
};

}  // namespace kiln::runner
