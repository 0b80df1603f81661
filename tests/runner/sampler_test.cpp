// kiln_llm's sampling (runner/sampler.h): greedy is the first maximum, seeded draws repeat, top-k
// and top-p keep only the tokens they should, and bad options are named.
#include "runner/sampler.h"

#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <set>
#include <vector>

namespace kiln::runner {
namespace {

SamplingOptions sampled(double temperature, int64_t top_k, double top_p, uint64_t seed = 1) {
  SamplingOptions o;
  o.greedy = false;
  o.temperature = temperature;
  o.top_k = top_k;
  o.top_p = top_p;
  o.seed = seed;
  return o;
}

TEST(Sampler, GreedyIsTheFirstMaximumAndIgnoresNaN) {
  Sampler s{SamplingOptions{}};
  const std::vector<float> logits = {0.5f, 3.0f, -1.0f, 3.0f, NAN};
  EXPECT_EQ(s.next(logits.data(), logits.size()), 1);
  const std::vector<float> nan_first = {NAN, -2.0f, -1.0f};
  EXPECT_EQ(s.next(nan_first.data(), nan_first.size()), 2);
}

TEST(Sampler, SeededDrawsRepeatAndDifferAcrossSeeds) {
  std::vector<float> logits(64);
  for (size_t i = 0; i < logits.size(); ++i) logits[i] = float(std::sin(double(i)));
  auto draw = [&](uint64_t seed) {
    Sampler s(sampled(1.0, 0, 1.0, seed));
    std::vector<int64_t> out;
    for (int i = 0; i < 32; ++i) out.push_back(s.next(logits.data(), logits.size()));
    return out;
  };
  EXPECT_EQ(draw(7), draw(7));
  EXPECT_NE(draw(7), draw(8));
}

TEST(Sampler, TopKKeepsOnlyTheKLargest) {
  const std::vector<float> logits = {1.0f, 5.0f, 4.0f, 0.0f, 4.5f, -3.0f};
  Sampler s(sampled(10.0, 3, 1.0));  // a high temperature: every kept token gets drawn
  std::set<int64_t> seen;
  for (int i = 0; i < 400; ++i) seen.insert(s.next(logits.data(), logits.size()));
  EXPECT_EQ(seen, (std::set<int64_t>{1, 2, 4}));
}

TEST(Sampler, TopPKeepsTheSmallestSetReachingP) {
  // Probabilities at temperature 1: token 0 ~0.665, token 1 ~0.245, token 2 ~0.090.
  const std::vector<float> logits = {2.0f, 1.0f, 0.0f};
  Sampler s(sampled(1.0, 0, 0.8));
  std::map<int64_t, int> counts;
  for (int i = 0; i < 2000; ++i) ++counts[s.next(logits.data(), logits.size())];
  EXPECT_EQ(counts.count(2), 0u);
  EXPECT_GT(counts[0], counts[1]);
  EXPECT_GT(counts[1], 0);
  Sampler tight(sampled(1.0, 0, 0.5));
  for (int i = 0; i < 100; ++i) EXPECT_EQ(tight.next(logits.data(), logits.size()), 0);
}

TEST(Sampler, LowTemperatureIsGreedy) {
  const std::vector<float> logits = {0.1f, 0.3f, 0.2f};
  Sampler s(sampled(1e-4, 0, 1.0));
  for (int i = 0; i < 50; ++i) EXPECT_EQ(s.next(logits.data(), logits.size()), 1);
}

TEST(Sampler, BadOptionsAreNamed) {
  EXPECT_EQ(check_sampling(SamplingOptions{}), "");
  EXPECT_NE(check_sampling(sampled(0.0, 0, 1.0)).find("--temperature"), std::string::npos);
  EXPECT_NE(check_sampling(sampled(1.0, -1, 1.0)).find("--top-k"), std::string::npos);
  EXPECT_NE(check_sampling(sampled(1.0, 0, 0.0)).find("--top-p"), std::string::npos);
  EXPECT_NE(check_sampling(sampled(1.0, 0, 1.5)).find("--top-p"), std::string::npos);
}

}  // namespace
}  // namespace kiln::runner
