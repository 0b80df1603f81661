// Per-op GPU time of Kiln engines, for `kiln_runner --profile` and kiln_executorch_profile_report.
// While profiling is on, an engine runs its ops eagerly (no CUDA graph replay) with a CUDA event
// between consecutive ops, waits for the run, and adds each op's time here. Plain C++: the engine
// measures, this file only keeps and formats the numbers.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace kiln::engine::profile {

/// The process-wide switch; read once per execute, so off costs one relaxed load and a branch.
inline std::atomic<bool> g_enabled{false};
inline bool enabled() { return g_enabled.load(std::memory_order_relaxed); }
/// Turns profiling on or off for every engine; runs already in flight are not affected.
void set_enabled(bool on);
/// Forgets every time recorded so far (e.g. the warm-up's); engines stay registered.
void reset();

/// What the report says about one op: its opcode name and a short description of its output.
struct OpLabel {
  std::string opcode;
  std::string output;  // e.g. "Float32[1,64]": one word, no spaces
};

/// One engine's accumulated times, shared between the engine (which adds runs) and the report.
class EngineRecord;

/// Registers an engine (on its first profiled run) and returns the record its runs go to. Engines
/// are numbered 1, 2, ... in the order they first ran with profiling on.
std::shared_ptr<EngineRecord> add_engine(std::string description, std::vector<OpLabel> ops);
/// Drops an engine's record when the engine is destroyed: the report shows live engines only.
void remove_engine(const EngineRecord* record);
/// Adds one profiled run: `op_ms[i]` is op i's GPU time, `wall_ms` the host time of the run.
void add_run(EngineRecord& record, const std::vector<float>& op_ms, double wall_ms);

struct OpStats {
  size_t index;
  std::string opcode;
  std::string output;
  uint64_t calls;
  double total_ms;
};

struct EngineStats {
  uint64_t id;
  std::string description;
  uint64_t runs;     // profiled runs since the last reset
  double wall_ms;    // host time of those runs, from the start of staging to the end of the sync
  std::vector<OpStats> ops;  // by op index
};

/// A copy of every live engine's numbers, by engine id.
std::vector<EngineStats> snapshot();
/// Sum of all ops' GPU time over every live engine, in ms.
double total_ms();
/// The text report: per engine with at least one profiled run, its ops sorted by total time
/// (rank, op index, opcode, output, total ms, mean ms per call, share of the engine's op time),
/// a total line and op time vs wall time per run. Empty when no engine ran with profiling on.
std::string report();

}  // namespace kiln::engine::profile
