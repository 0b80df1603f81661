// Algorithm choices (cuDNN convolution algorithms found by timing) remembered between processes,
// so only the first load of a program on a kind of device pays for the search. One small text
// file per (device kind and library versions, blob graph hash) under the cache directory:
//
//   KILN_CACHE_DIR=<dir>   use <dir> (created if missing);  KILN_CACHE_DIR=off   no file at all
//   otherwise              $XDG_CACHE_HOME/kiln, else $HOME/.cache/kiln
//
// The file is advisory: a missing, unreadable or malformed one is ignored (and rewritten), an entry
// the library rejects is searched again, and a failed write only costs the next load its search.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "runtime/engine/content_hash.h"

namespace kiln::engine {

class AlgoCache {
 public:
  /// No file: every lookup misses and save() does nothing.
  AlgoCache() = default;

  /// The cache of one blob on one kind of device. `dir` empty: disabled. `device_key` names the
  /// device model and library versions; it may hold any characters (they are sanitised).
  AlgoCache(std::string dir, const std::string& device_key, Hash128 blob_hash);

  /// KILN_CACHE_DIR, $XDG_CACHE_HOME/kiln or $HOME/.cache/kiln; empty when disabled or unknown.
  static std::string default_dir();

  bool enabled() const { return !path_.empty(); }
  const std::string& path() const { return path_; }

  /// The values stored for op `op` under `kind` ("conv"), or null.
  const std::vector<int64_t>* find(size_t op, const std::string& kind) const;
  void put(size_t op, const std::string& kind, std::vector<int64_t> values);
  /// Forgets an entry the library no longer accepts (it will be searched and put again).
  void drop(size_t op);

  /// Writes the file when something changed since it was read (write to a temporary file, then
  /// rename, so concurrent loads never read half a file). False with `why` set on failure.
  bool save(std::string* why = nullptr);

  size_t hits = 0;    // lookups answered from the file
  size_t misses = 0;  // searches run

 private:
  struct Entry {
    std::string kind;
    std::vector<int64_t> values;
  };
  void load();

  std::string dir_;
  std::string path_;
  std::string header_;
  std::map<size_t, Entry> entries_;
  bool dirty_ = false;
};

}  // namespace kiln::engine
