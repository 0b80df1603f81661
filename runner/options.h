// Command-line options of kiln_runner, parsed without touching the runtime so they can be tested
// on their own.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace kiln::runner {

inline constexpr const char* kUsage =
    "usage: kiln_runner <model.pte> [--method NAME] [--input I=path.bin ...] [--shape I=d0,d1,...]\n"
    "                   [--next --input I=path.bin ...] [--iterations N] [--warmup M]\n"
    "                   [--output-dir DIR] [--values K] [--copy-stats] [--profile]\n"
    "                   [--device-timing N] [--profiler-range]\n"
    "  --input I=FILE   raw little-endian bytes for input I (default: ones of the input's dtype)\n"
    "  --shape I=DIMS   actual shape of a dynamic input I (default: the shape in the program)\n"
    "  --next           execute the same loaded method again with the inputs that follow\n"
    "  --iterations N   time N executions of each run (load excluded) and print min/median/max\n"
    "  --warmup M       untimed executions before timing\n"
    "  --output-dir DIR write each output's raw bytes to DIR/output_<i>.bin\n"
    "  --values K       print the first K values of each output (default 8)\n"
    "  --copy-stats     after each run print the host<->device bytes Kiln engines copied in it\n"
    "  --profile        time every op of every Kiln engine with CUDA events (ops run eagerly, no\n"
    "                   CUDA graph replay) and print per engine its ops sorted by GPU time; the\n"
    "                   latency line is then measured with profiling on\n"
    "  --device-timing N  device-resident programs only: run N more executes on a CUDA stream\n"
    "                   handed to Kiln (kiln/executorch/stream.h, so execute only enqueues) and\n"
    "                   print the median GPU span of one execute between CUDA events, and the\n"
    "                   time per execute of N executes enqueued back to back\n"
    "  --profiler-range only the timed executes run between cudaProfilerStart and\n"
    "                   cudaProfilerStop (for `ncu --profile-from-start off`: per-kernel GPU\n"
    "                   times of the CUDA graph replay, warm-up and load left out)\n";

/// One execution of the method: which inputs come from files (the rest are ones).
struct Run {
  std::map<size_t, std::string> input_files;
};

struct Options {
  std::string model;
  std::string method = "forward";
  std::vector<Run> runs{Run{}};
  std::map<size_t, std::vector<int64_t>> shapes;
  int iterations = 0;
  int warmup = 0;
  std::string output_dir;
  size_t values = 8;
  bool copy_stats = false;
  bool profile = false;
  int device_timing = 0;  // executes timed on a caller stream (device-resident programs)
  bool profiler_range = false;  // cudaProfilerStart/Stop around the timed executes
};

/// Fills `out` from argv. Returns false and sets `error` on any malformed or unknown argument.
bool parse_options(int argc, const char* const* argv, Options& out, std::string& error);

}  // namespace kiln::runner
