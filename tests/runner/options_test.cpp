#include "runner/options.h"

#include <gtest/gtest.h>

#include <vector>

namespace {

using kiln::runner::Options;
using kiln::runner::parse_options;

bool parse(std::vector<const char*> args, Options& out, std::string& error) {
  args.insert(args.begin(), "kiln_runner");
  return parse_options(static_cast<int>(args.size()), args.data(), out, error);
}

TEST(RunnerOptions, DefaultsToForwardOneRunEightValues) {
  Options o;
  std::string e;
  ASSERT_TRUE(parse({"m.pte"}, o, e)) << e;
  EXPECT_EQ(o.model, "m.pte");
  EXPECT_EQ(o.method, "forward");
  EXPECT_EQ(o.runs.size(), 1u);
  EXPECT_EQ(o.values, 8u);
  EXPECT_EQ(o.iterations, 0);
  EXPECT_FALSE(o.copy_stats);
  EXPECT_FALSE(o.profile);
}

TEST(RunnerOptions, ParsesEveryOption) {
  Options o;
  std::string e;
  ASSERT_TRUE(parse({"m.pte", "--method", "encode", "--input", "0=a.bin", "--input", "1=b.bin",
                     "--shape", "0=3,256", "--next", "--input", "0=c.bin", "--iterations", "10",
                     "--warmup", "2", "--output-dir", "out", "--values", "3", "--copy-stats",
                     "--profile"},
                    o, e))
      << e;
  EXPECT_EQ(o.method, "encode");
  ASSERT_EQ(o.runs.size(), 2u);
  EXPECT_EQ(o.runs[0].input_files.at(0), "a.bin");
  EXPECT_EQ(o.runs[0].input_files.at(1), "b.bin");
  EXPECT_EQ(o.runs[1].input_files.at(0), "c.bin");
  EXPECT_EQ(o.shapes.at(0), (std::vector<int64_t>{3, 256}));
  EXPECT_EQ(o.iterations, 10);
  EXPECT_EQ(o.warmup, 2);
  EXPECT_EQ(o.output_dir, "out");
  EXPECT_EQ(o.values, 3u);
  EXPECT_TRUE(o.copy_stats);
  EXPECT_TRUE(o.profile);
}

TEST(RunnerOptions, ProfileIsAFlagWithoutAValue) {
  Options o;
  std::string e;
  ASSERT_TRUE(parse({"--profile", "m.pte", "--iterations", "5"}, o, e)) << e;
  EXPECT_TRUE(o.profile);
  EXPECT_EQ(o.model, "m.pte");
  EXPECT_EQ(o.iterations, 5);
  EXPECT_TRUE(std::string(kiln::runner::kUsage).find("--profile") != std::string::npos);
}

TEST(RunnerOptions, ProfilerRangeIsAFlagOffByDefault) {
  Options o;
  std::string e;
  ASSERT_TRUE(parse({"m.pte"}, o, e)) << e;
  EXPECT_FALSE(o.profiler_range);
  ASSERT_TRUE(parse({"m.pte", "--profiler-range", "--iterations", "2"}, o, e)) << e;
  EXPECT_TRUE(o.profiler_range);
  EXPECT_EQ(o.iterations, 2);
  EXPECT_TRUE(std::string(kiln::runner::kUsage).find("--profiler-range") != std::string::npos);
}

TEST(RunnerOptions, DeviceTimingTakesACount) {
  Options o;
  std::string e;
  EXPECT_EQ(o.device_timing, 0);
  ASSERT_TRUE(parse({"m.pte", "--device-timing", "500"}, o, e)) << e;
  EXPECT_EQ(o.device_timing, 500);
  EXPECT_TRUE(std::string(kiln::runner::kUsage).find("--device-timing") != std::string::npos);
}

TEST(RunnerOptions, RejectsMalformedArguments) {
  const std::vector<std::vector<const char*>> bad = {
      {},                                   // no model
      {"m.pte", "--input", "a.bin"},        // no index
      {"m.pte", "--input", "x=a.bin"},      // index not a number
      {"m.pte", "--input", "0="},           // no path
      {"m.pte", "--shape", "0=3,,4"},       // empty dimension
      {"m.pte", "--shape", "0=-1"},         // negative dimension
      {"m.pte", "--iterations", "0"},       // at least one
      {"m.pte", "--device-timing", "0"},    // at least one
      {"m.pte", "--values", "many"},        // not a number
      {"m.pte", "--method"},                // missing value
      {"m.pte", "--frobnicate"},            // unknown option
      {"m.pte", "other.pte"},               // two models
  };
  for (const auto& args : bad) {
    Options o;
    std::string e;
    EXPECT_FALSE(parse(args, o, e)) << "accepted: " << (args.empty() ? "<none>" : args.back());
    EXPECT_FALSE(e.empty());
  }
}

}  // namespace
