// kiln_llm's token sampling (sampler.h).
#include "runner/sampler.h"

#include <algorithm>
#include <cmath>

namespace kiln::runner {

std::string check_sampling(const SamplingOptions& o) {
  if (o.greedy) return "";
  if (!(o.temperature > 0) || !std::isfinite(o.temperature)) {
    return "--temperature must be a positive number, got " + std::to_string(o.temperature);
  }
  if (o.top_k < 0) return "--top-k must be >= 0 (0: no limit), got " + std::to_string(o.top_k);
  if (!(o.top_p > 0 && o.top_p <= 1)) {
    return "--top-p must be in (0, 1], got " + std::to_string(o.top_p);
  }
  return "";
}

namespace {

float value(float v) { return std::isnan(v) ? -INFINITY : v; }

}  // namespace

int64_t Sampler::next(const float* logits, size_t n) {
  if (opts_.greedy) {
    size_t best = 0;
    for (size_t i = 1; i < n; ++i) {
      if (value(logits[i]) > value(logits[best])) best = i;
    }
    return static_cast<int64_t>(best);
  }
  candidates_.resize(n);
  for (size_t i = 0; i < n; ++i) candidates_[i] = {value(logits[i]), static_cast<int64_t>(i)};
  // Highest logit first; equal logits by ascending id, so the order is deterministic.
  auto higher = [](const auto& a, const auto& b) {
    return a.first > b.first || (a.first == b.first && a.second < b.second);
  };
  size_t keep = n;
  if (opts_.top_k > 0 && static_cast<size_t>(opts_.top_k) < n) {
    keep = static_cast<size_t>(opts_.top_k);
    std::partial_sort(candidates_.begin(), candidates_.begin() + long(keep), candidates_.end(),
                      higher);
  } else {
    std::sort(candidates_.begin(), candidates_.end(), higher);
  }
  const double top = candidates_[0].first;
  weights_.resize(keep);
  double total = 0;
  for (size_t i = 0; i < keep; ++i) {
    weights_[i] = std::isinf(top) ? (i == 0 ? 1.0 : 0.0)
                                  : std::exp((candidates_[i].first - top) / opts_.temperature);
    total += weights_[i];
  }
  if (opts_.top_p < 1) {
    double mass = 0;
    size_t cut = 0;
    while (cut < keep) {
      mass += weights_[cut++] / total;
      if (mass >= opts_.top_p) break;
    }
    keep = cut;
    weights_.resize(keep);
  }
  std::discrete_distribution<size_t> pick(weights_.begin(), weights_.end());
  return candidates_[pick(rng_)].second;
}

}  // namespace kiln::runner
