#include "runtime/engine/shared_state.h"

#include <executorch/runtime/platform/log.h>

#include <map>
#include <mutex>
#include <tuple>
#include <utility>

#include "format/dtype.h"

namespace kiln::engine {

using executorch::runtime::Error;
using executorch::runtime::Result;

bool StateSpec::operator==(const StateSpec& other) const {
  if (dtype != other.dtype || rank != other.rank || nbytes != other.nbytes) return false;
  for (uint32_t d = 0; d < rank && d < blob::kMaxRank; ++d) {
    if (sizes[d] != other.sizes[d]) return false;
  }
  return true;
}

std::string StateSpec::describe() const {
  std::string out = std::string(dtype_name(dtype)) + " [";
  for (uint32_t d = 0; d < rank && d < blob::kMaxRank; ++d) {
    out += (d ? "," : "") + std::to_string(sizes[d]);
  }
  return out + "] (" + std::to_string(nbytes) + " bytes)";
}

struct StateRegistry::Impl {
  struct Entry {
    StateSpec spec;
    std::string who;  // the first declarer, for messages
    std::weak_ptr<void> memory;
  };
  using Key = std::tuple<const void*, std::string, int>;
  mutable std::mutex mutex;
  std::map<Key, Entry> entries;

  void sweep() {
    for (auto it = entries.begin(); it != entries.end();) {
      it = it->second.memory.expired() ? entries.erase(it) : std::next(it);
    }
  }
};

StateRegistry::StateRegistry() : impl_(std::make_unique<Impl>()) {}
StateRegistry::~StateRegistry() = default;

Result<std::shared_ptr<void>> StateRegistry::acquire(const void* scope, const std::string& key,
                                                     int device, const StateSpec& spec,
                                                     const std::string& who,
                                                     const Allocate& allocate, bool* created) {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  impl_->sweep();  // states whose last engine is gone: their memory is freed, a new one starts fresh
  const Impl::Key k{scope, key, device};
  auto it = impl_->entries.find(k);
  if (it != impl_->entries.end()) {
    std::shared_ptr<void> memory = it->second.memory.lock();
    if (memory != nullptr) {
      if (!(it->second.spec == spec)) {
        ET_LOG(Error,
               "KilnBackend: program state '%s' is declared %s by %s but %s by %s, loaded "
               "earlier from the same program; the methods that share a state must declare it "
               "alike (export them from one module with the same cache sizes and precision)",
               key.c_str(), spec.describe().c_str(), who.c_str(),
               it->second.spec.describe().c_str(), it->second.who.c_str());
        return Error::InvalidProgram;
      }
      if (created != nullptr) *created = false;
      return memory;
    }
  }
  Result<std::shared_ptr<void>> made = allocate();
  if (!made.ok()) return made.error();
  std::shared_ptr<void> memory = std::move(made.get());
  impl_->entries[k] = Impl::Entry{spec, who, memory};
  if (created != nullptr) *created = true;
  return memory;
}

size_t StateRegistry::live() const {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  size_t n = 0;
  for (const auto& [key, entry] : impl_->entries) n += entry.memory.expired() ? 0 : 1;
  return n;
}

StateRegistry& StateRegistry::process() {
  static StateRegistry* registry = new StateRegistry();  // never destroyed: engines may outlive
  return *registry;                                       // static destructors at exit
}

}  // namespace kiln::engine
