#include "runtime/engine/profile.h"

#include <algorithm>
#include <cstdio>
#include <mutex>
#include <numeric>
#include <utility>

namespace kiln::engine::profile {

class EngineRecord {
 public:
  EngineRecord(uint64_t id, std::string description, std::vector<OpLabel> ops)
      : id_(id), description_(std::move(description)), labels_(std::move(ops)),
        calls_(labels_.size(), 0), total_ms_(labels_.size(), 0.0) {}

  void add_run(const std::vector<float>& op_ms, double wall_ms) {
    std::lock_guard<std::mutex> lock(mutex_);
    for (size_t i = 0; i < op_ms.size() && i < total_ms_.size(); ++i) {
      total_ms_[i] += op_ms[i];
      ++calls_[i];
    }
    ++runs_;
    wall_ms_ += wall_ms;
  }

  void reset() {
    std::lock_guard<std::mutex> lock(mutex_);
    std::fill(calls_.begin(), calls_.end(), 0);
    std::fill(total_ms_.begin(), total_ms_.end(), 0.0);
    runs_ = 0;
    wall_ms_ = 0.0;
  }

  EngineStats stats() const {
    std::lock_guard<std::mutex> lock(mutex_);
    EngineStats s{id_, description_, runs_, wall_ms_, {}};
    s.ops.reserve(labels_.size());
    for (size_t i = 0; i < labels_.size(); ++i) {
      s.ops.push_back({i, labels_[i].opcode, labels_[i].output, calls_[i], total_ms_[i]});
    }
    return s;
  }

 private:
  const uint64_t id_;
  const std::string description_;
  const std::vector<OpLabel> labels_;
  mutable std::mutex mutex_;  // the engine's thread adds runs while another may report
  std::vector<uint64_t> calls_;
  std::vector<double> total_ms_;
  uint64_t runs_ = 0;
  double wall_ms_ = 0.0;
};

namespace {

struct Registry {
  std::mutex mutex;
  uint64_t next_id = 1;
  std::vector<std::shared_ptr<EngineRecord>> engines;  // by id
};

Registry& registry() {
  static Registry* r = new Registry;  // never destroyed: engines may outlive static destructors
  return *r;
}

std::vector<std::shared_ptr<EngineRecord>> live_records() {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  return r.engines;
}

}  // namespace

void set_enabled(bool on) { g_enabled.store(on, std::memory_order_relaxed); }

void reset() {
  for (const auto& record : live_records()) record->reset();
}

std::shared_ptr<EngineRecord> add_engine(std::string description, std::vector<OpLabel> ops) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  auto record = std::make_shared<EngineRecord>(r.next_id++, std::move(description), std::move(ops));
  r.engines.push_back(record);
  return record;
}

void remove_engine(const EngineRecord* record) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  r.engines.erase(std::remove_if(r.engines.begin(), r.engines.end(),
                                 [&](const auto& e) { return e.get() == record; }),
                  r.engines.end());
}

void add_run(EngineRecord& record, const std::vector<float>& op_ms, double wall_ms) {
  record.add_run(op_ms, wall_ms);
}

std::vector<EngineStats> snapshot() {
  std::vector<EngineStats> out;
  for (const auto& record : live_records()) out.push_back(record->stats());
  return out;
}

double total_ms() {
  double total = 0.0;
  for (const EngineStats& e : snapshot()) {
    for (const OpStats& op : e.ops) total += op.total_ms;
  }
  return total;
}

std::string report() {
  std::string out;
  char line[512];
  for (EngineStats& e : snapshot()) {
    if (e.runs == 0) continue;
    const double engine_ms =
        std::accumulate(e.ops.begin(), e.ops.end(), 0.0,
                        [](double a, const OpStats& op) { return a + op.total_ms; });
    std::snprintf(line, sizeof(line), "Kiln engine %llu (%s; %zu ops): %llu profiled runs\n",
                  static_cast<unsigned long long>(e.id), e.description.c_str(), e.ops.size(),
                  static_cast<unsigned long long>(e.runs));
    out += line;
    std::snprintf(line, sizeof(line), "  %4s %5s  %-12s %-24s %11s %11s %7s\n", "rank", "op",
                  "opcode", "output", "total_ms", "mean_ms", "share");
    out += line;
    std::stable_sort(e.ops.begin(), e.ops.end(),
                     [](const OpStats& a, const OpStats& b) { return a.total_ms > b.total_ms; });
    for (size_t rank = 0; rank < e.ops.size(); ++rank) {
      const OpStats& op = e.ops[rank];
      const double mean = op.calls > 0 ? op.total_ms / static_cast<double>(op.calls) : 0.0;
      const double share = engine_ms > 0 ? 100.0 * op.total_ms / engine_ms : 0.0;
      std::snprintf(line, sizeof(line), "  %4zu %5zu  %-12s %-24s %11.4f %11.4f %6.1f%%\n",
                    rank + 1, op.index, op.opcode.c_str(), op.output.c_str(), op.total_ms, mean,
                    share);
      out += line;
    }
    const double runs = static_cast<double>(e.runs);
    std::snprintf(line, sizeof(line), "  %-44s %11.4f %11.4f %6.1f%%\n", "total", engine_ms,
                  engine_ms / runs, engine_ms > 0 ? 100.0 : 0.0);
    out += line;
    std::snprintf(line, sizeof(line),
                  "  per run: op time %.4f ms (GPU, CUDA events) vs execute wall %.4f ms (host: "
                  "staging, launches, sync) = %.1f%%\n",
                  engine_ms / runs, e.wall_ms / runs,
                  e.wall_ms > 0 ? 100.0 * engine_ms / e.wall_ms : 0.0);
    out += line;
  }
  return out;
}

}  // namespace kiln::engine::profile
