#include "runtime/engine/algo_cache.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

namespace kiln::engine {
namespace {

constexpr const char* kMagic = "kiln-algo-cache";
constexpr int kVersion = 1;

std::string sanitise(const std::string& s) {
  std::string out;
  for (char c : s) {
    const bool keep = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                      c == '.' || c == '-' || c == '_';
    out += keep ? c : '_';
  }
  return out.empty() ? "device" : out;
}

// mkdir -p; true when the directory exists afterwards.
bool make_dirs(const std::string& dir) {
  std::string path;
  std::stringstream parts(dir);
  std::string part;
  if (!dir.empty() && dir[0] == '/') path = "/";
  while (std::getline(parts, part, '/')) {
    if (part.empty()) continue;
    path += part;
    if (mkdir(path.c_str(), 0755) != 0 && errno != EEXIST) return false;
    path += '/';
  }
  struct stat st {};
  return stat(dir.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

}  // namespace

std::string AlgoCache::default_dir() {
  if (const char* dir = std::getenv("KILN_CACHE_DIR")) {
    return std::strcmp(dir, "off") == 0 ? std::string() : std::string(dir);
  }
  if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg != nullptr && xdg[0] == '/') {
    return std::string(xdg) + "/kiln";
  }
  if (const char* home = std::getenv("HOME"); home != nullptr && home[0] == '/') {
    return std::string(home) + "/.cache/kiln";
  }
  return {};
}

AlgoCache::AlgoCache(std::string dir, const std::string& device_key, Hash128 blob_hash)
    : dir_(std::move(dir)) {
  if (dir_.empty()) return;
  char hash[33];
  std::snprintf(hash, sizeof(hash), "%016" PRIx64 "%016" PRIx64, blob_hash.hi, blob_hash.lo);
  const std::string device = sanitise(device_key);
  path_ = dir_ + "/" + device + "-" + hash + ".algos";
  header_ = std::string(kMagic) + " " + std::to_string(kVersion) + " " + device + " " + hash;
  load();
}

void AlgoCache::load() {
  std::ifstream f(path_);
  if (!f) return;
  std::string line;
  if (!std::getline(f, line) || line != header_) return;  // another version or a damaged file
  std::map<size_t, Entry> read;
  while (std::getline(f, line)) {
    std::istringstream in(line);
    long long op = -1;
    Entry e;
    if (!(in >> op >> e.kind) || op < 0) return;
    long long v = 0;
    while (in >> v) e.values.push_back(v);
    if (!in.eof() || e.values.empty()) return;  // a stray token: distrust the whole file
    read[static_cast<size_t>(op)] = std::move(e);
  }
  entries_ = std::move(read);
}

const std::vector<int64_t>* AlgoCache::find(size_t op, const std::string& kind) const {
  auto it = entries_.find(op);
  return it == entries_.end() || it->second.kind != kind ? nullptr : &it->second.values;
}

void AlgoCache::put(size_t op, const std::string& kind, std::vector<int64_t> values) {
  if (!enabled()) return;
  entries_[op] = Entry{kind, std::move(values)};
  dirty_ = true;
}

void AlgoCache::drop(size_t op) {
  if (entries_.erase(op) > 0) dirty_ = true;
}

bool AlgoCache::save(std::string* why) {
  if (!enabled() || !dirty_) return true;
  if (!make_dirs(dir_)) {
    if (why) *why = "cannot create the directory " + dir_ + ": " + std::strerror(errno);
    return false;
  }
  const std::string tmp = path_ + ".tmp." + std::to_string(getpid());
  {
    std::ofstream f(tmp, std::ios::trunc);
    f << header_ << "\n";
    for (const auto& [op, e] : entries_) {
      f << op << " " << e.kind;
      for (int64_t v : e.values) f << " " << v;
      f << "\n";
    }
    if (!f.flush()) {
      if (why) *why = "cannot write " + tmp;
      std::remove(tmp.c_str());
      return false;
    }
  }
  if (std::rename(tmp.c_str(), path_.c_str()) != 0) {
    if (why) *why = "cannot rename " + tmp + " to " + path_ + ": " + std::strerror(errno);
    std::remove(tmp.c_str());
    return false;
  }
  dirty_ = false;
  return true;
}

}  // namespace kiln::engine
