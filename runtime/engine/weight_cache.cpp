#include "runtime/engine/weight_cache.h"

#include <cuda_runtime.h>
#include <executorch/runtime/platform/log.h>

#include <algorithm>
#include <atomic>
#include <mutex>
#include <unordered_map>
#include <utility>

#include "runtime/engine/content_hash.h"
#include "runtime/engine/cuda_check.h"
#include "runtime/engine/device.h"

namespace kiln::engine {

using executorch::runtime::Error;
using executorch::runtime::Result;

namespace {

// Weight tensors below this size that are not resident yet are packed into one allocation per
// engine instead of one cudaMalloc each. Models carry hundreds of biases and norm scales: one
// allocation each would cost a cudaMalloc call and an allocator rounding apiece, and one upload
// for the pack replaces hundreds of small copies. Sharing stays per tensor (each packed tensor
// has its own cache entry pointing into the pack); the price is that a pack stays resident while
// any engine uses any tensor in it, which bounds the waste by the pack, i.e. by small tensors only.
// Tensors at or above the threshold get their own allocation, so a large shared tensor never
// keeps unrelated memory alive.
constexpr uint64_t kPackBelow = 256 * 1024;
// Offsets inside a pack: cudaMalloc's own alignment, so a packed tensor is as aligned for the
// kernels' vector paths as one that has its own allocation.
constexpr uint64_t kPackAlignment = 256;

std::atomic<uint64_t> g_weight_bytes{0};
std::atomic<uint64_t> g_weight_allocated_bytes{0};
std::atomic<uint64_t> g_weight_tensors{0};
std::atomic<uint64_t> g_weight_requested_bytes{0};
std::atomic<uint64_t> g_activation_bytes{0};

// One device allocation holding one or more weight tensors. Engines own it through aliasing
// shared pointers (one per tensor); the last one out frees it.
struct Block {
  DeviceBuffer buffer;
  uint64_t tensor_bytes = 0;
  uint64_t tensors = 0;

  Block(DeviceBuffer b, uint64_t bytes, uint64_t count)
      : buffer(std::move(b)), tensor_bytes(bytes), tensors(count) {
    g_weight_bytes += tensor_bytes;
    g_weight_allocated_bytes += buffer.size();
    g_weight_tensors += tensors;
  }
  ~Block() {
    g_weight_bytes -= tensor_bytes;
    g_weight_allocated_bytes -= buffer.size();
    g_weight_tensors -= tensors;
  }
  Block(const Block&) = delete;
  Block& operator=(const Block&) = delete;
};

struct Key {
  int device;
  Hash128 hash;
  uint64_t nbytes;
  bool operator==(const Key& o) const {
    return device == o.device && hash == o.hash && nbytes == o.nbytes;
  }
};

struct KeyHash {
  size_t operator()(const Key& k) const {
    return static_cast<size_t>(k.hash.lo ^ (static_cast<uint64_t>(k.device) << 56));
  }
};

struct Cache {
  std::mutex mutex;
  // Weak: the cache never keeps memory alive by itself. Expired entries are dropped on the next
  // acquire.
  std::unordered_map<Key, std::weak_ptr<void>, KeyHash> entries;
};

// Never destroyed: engines destroyed during static destruction (a leaked Method, a global Module)
// must still find it.
Cache& cache() {
  static Cache* instance = new Cache;
  return *instance;
}

uint64_t round_up(uint64_t n, uint64_t a) { return (n + a - 1) / a * a; }

// The unit of caching: the bytes of one weight tensor or, when tensors of a blob overlap (views
// the builder stored at their base's offset), of the union of their extents, so views keep pointing
// into their base's memory.
struct Use {
  size_t tensor_id;
  uint64_t delta;  // the tensor's offset from the start of its region
};

struct Region {
  Key key;
  const char* host;  // the region's bytes in graph.weights
  std::vector<Use> uses;
};

// Groups the non-empty kWeight tensors of `graph` into regions of overlapping extents.
std::vector<Region> weight_regions(const Graph& graph, int device) {
  std::vector<size_t> ids;
  for (size_t i = 0; i < graph.tensors.size(); ++i) {
    const Tensor& t = graph.tensors[i];
    if (t.storage == blob::Storage::kWeight && t.nbytes > 0) ids.push_back(i);
  }
  std::sort(ids.begin(), ids.end(), [&](size_t a, size_t b) {
    return graph.tensors[a].offset < graph.tensors[b].offset;
  });
  const char* weights = reinterpret_cast<const char*>(graph.weights);
  std::vector<Region> regions;
  uint64_t start = 0, end = 0;
  for (size_t id : ids) {
    const Tensor& t = graph.tensors[id];  // read_blob checked offset + nbytes <= weights_size
    if (regions.empty() || t.offset >= end) {
      start = t.offset;
      end = t.offset + t.nbytes;
      regions.push_back({Key{device, {}, 0}, weights + start, {}});
    }
    end = std::max(end, t.offset + t.nbytes);
    regions.back().key.nbytes = end - start;
    regions.back().uses.push_back({id, t.offset - start});
  }
  // Hashing is the one step that scales with the weight bytes; callers run this before taking
  // the cache's lock, so engines created on several threads hash in parallel.
  for (Region& r : regions) r.key.hash = content_hash(r.host, r.key.nbytes);
  return regions;
}

Error upload(void* dst, const void* src, uint64_t nbytes, int device) {
  return cuda_status(cudaMemcpy(dst, src, nbytes, cudaMemcpyHostToDevice), Error::Internal,
                     "Kiln engine: uploading %llu bytes of weights to device %d",
                     static_cast<unsigned long long>(nbytes), device);
}

}  // namespace

EngineWeights::EngineWeights(EngineWeights&& other) noexcept { *this = std::move(other); }

EngineWeights& EngineWeights::operator=(EngineWeights&& other) noexcept {
  if (this != &other) {
    g_weight_requested_bytes -= requested_bytes_;
    pointers_ = std::move(other.pointers_);
    holds_ = std::move(other.holds_);
    requested_bytes_ = std::exchange(other.requested_bytes_, 0);
  }
  return *this;
}

EngineWeights::~EngineWeights() { g_weight_requested_bytes -= requested_bytes_; }

Result<EngineWeights> acquire_weights(const Graph& graph, int device) {
  EngineWeights out;
  out.pointers_.assign(graph.tensors.size(), nullptr);
  const std::vector<Region> needs = weight_regions(graph, device);
  uint64_t requested = 0;
  for (const Region& r : needs) requested += r.key.nbytes;

  Cache& c = cache();
  // Held through the uploads: two engines that need the same new tensor at once must not both
  // upload it, and the host-to-device link is the bottleneck anyway, so serialising uploads costs
  // little.
  std::lock_guard<std::mutex> lock(c.mutex);
  for (auto it = c.entries.begin(); it != c.entries.end();) {
    it = it->second.expired() ? c.entries.erase(it) : std::next(it);
  }

  // Resolve hits; collect one miss per distinct key (a blob may repeat a tensor's bytes).
  std::unordered_map<Key, std::vector<const Region*>, KeyHash> misses;
  std::vector<const Region*> miss_order;
  size_t hits = 0;
  auto point = [&out](const Region& r, void* base) {
    for (const Use& u : r.uses) out.pointers_[u.tensor_id] = static_cast<char*>(base) + u.delta;
  };
  for (const Region& n : needs) {
    auto found = c.entries.find(n.key);
    std::shared_ptr<void> resident = found == c.entries.end() ? nullptr : found->second.lock();
    if (resident != nullptr) {
      point(n, resident.get());
      out.holds_.push_back(std::move(resident));
      ++hits;
      continue;
    }
    auto& same = misses[n.key];
    if (same.empty()) miss_order.push_back(&n);
    same.push_back(&n);
  }

  // Place the misses: small ones at aligned offsets in one pack, large ones alone.
  std::vector<const Region*> packed;
  std::vector<uint64_t> pack_offsets;
  uint64_t pack_size = 0;
  uint64_t pack_tensor_bytes = 0;
  std::vector<std::pair<const Region*, std::shared_ptr<void>>> uploaded;
  for (const Region* n : miss_order) {
    if (n->key.nbytes < kPackBelow) {
      pack_size = round_up(pack_size, kPackAlignment);
      pack_offsets.push_back(pack_size);
      packed.push_back(n);
      pack_size += n->key.nbytes;
      pack_tensor_bytes += n->key.nbytes;
      continue;
    }
    DeviceBuffer buffer;
    KILN_ASSIGN_OR_RETURN(buffer, DeviceBuffer::allocate(n->key.nbytes, "a weight tensor"));
    KILN_TRY(upload(buffer.get(), n->host, n->key.nbytes, device));
    auto block = std::make_shared<Block>(std::move(buffer), n->key.nbytes, 1);
    void* p = block->buffer.get();
    uploaded.emplace_back(n, std::shared_ptr<void>(std::move(block), p));
  }
  if (!packed.empty()) {
    // One contiguous host image, one copy.
    std::vector<char> image(pack_size, 0);
    for (size_t k = 0; k < packed.size(); ++k) {
      std::copy_n(packed[k]->host, packed[k]->key.nbytes, image.data() + pack_offsets[k]);
    }
    DeviceBuffer buffer;
    KILN_ASSIGN_OR_RETURN(buffer, DeviceBuffer::allocate(pack_size, "the packed small weights"));
    KILN_TRY(upload(buffer.get(), image.data(), pack_size, device));
    auto block = std::make_shared<Block>(std::move(buffer), pack_tensor_bytes, packed.size());
    char* base = static_cast<char*>(block->buffer.get());
    for (size_t k = 0; k < packed.size(); ++k) {
      uploaded.emplace_back(packed[k], std::shared_ptr<void>(block, base + pack_offsets[k]));
    }
  }

  // Everything is on the device: publish and hand out.
  for (auto& [n, ptr] : uploaded) {
    c.entries[n->key] = ptr;
    for (const Region* r : misses[n->key]) point(*r, ptr.get());
    out.holds_.push_back(std::move(ptr));
  }
  // An empty tensor is never read; it gets an address inside the engine's weights, as before.
  for (size_t i = 0; i < graph.tensors.size(); ++i) {
    if (graph.tensors[i].storage == blob::Storage::kWeight && graph.tensors[i].nbytes == 0) {
      out.pointers_[i] = out.holds_.empty() ? nullptr : out.holds_.front().get();
    }
  }
  out.requested_bytes_ = requested;
  g_weight_requested_bytes += requested;
  ET_LOG(Debug, "Kiln engine: %zu weight regions on device %d: %zu uploaded, %zu already resident",
         needs.size(), device, needs.size() - hits, hits);
  return out;
}

void count_activation_bytes(int64_t delta) {
  g_activation_bytes += static_cast<uint64_t>(delta);  // wraps back for negative deltas
}

DeviceMemoryStats device_memory_stats() {
  DeviceMemoryStats s;
  s.weight_bytes = g_weight_bytes.load();
  s.weight_allocated_bytes = g_weight_allocated_bytes.load();
  s.weight_tensors = g_weight_tensors.load();
  s.weight_requested_bytes = g_weight_requested_bytes.load();
  s.activation_bytes = g_activation_bytes.load();
  return s;
}

}  // namespace kiln::engine
