// content_hash: eight 64-bit lanes take one 64-byte stripe per step. Each lane adds the product of
// the two 32-bit halves of (input word ^ key) and the neighbouring lane's raw word: the product
// mixes, the raw word keeps every input bit alive when a product is 0. Keys slide with the stripe
// index, so swapping two stripes changes the result; after every 16 stripes the lanes are
// scrambled so that order across blocks matters too. Everything in the loop is 32x32->64
// multiplies and adds: the compiler turns the generic loop into SSE2 (this file is built with
// -O3), and on CPUs with AVX2 whole blocks go through a hand-written path that computes the same
// numbers twice as wide.
#include "runtime/engine/content_hash.h"

#include <cstring>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace kiln::engine {
namespace {

constexpr size_t kLanes = 8;
constexpr size_t kStripe = kLanes * sizeof(uint64_t);  // 64 bytes
constexpr size_t kStripesPerBlock = 16;
constexpr size_t kBlock = kStripe * kStripesPerBlock;  // 1 KiB

// splitmix64: only to fill the key table below with well-spread constants at compile time.
constexpr uint64_t splitmix(uint64_t& state) {
  uint64_t z = (state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

struct Keys {
  uint64_t stripe[kStripesPerBlock + kLanes];  // stripe s, lane j uses stripe[s + j]
  uint64_t tail[kLanes];                       // the zero-padded last partial stripe
  uint64_t scramble[kLanes];
  uint64_t init[kLanes];
  uint64_t fold[2 * kLanes];
};

constexpr Keys make_keys() {
  Keys k{};
  uint64_t state = 0x4B494C4E2D776774ull;  // "KILN-wgt"
  for (auto& v : k.stripe) v = splitmix(state);
  for (auto& v : k.tail) v = splitmix(state);
  for (auto& v : k.scramble) v = splitmix(state);
  for (auto& v : k.init) v = splitmix(state);
  for (auto& v : k.fold) v = splitmix(state);
  return k;
}

constexpr Keys kKeys = make_keys();

inline uint64_t load64(const unsigned char* p) {
  uint64_t v;
  std::memcpy(&v, p, sizeof(v));  // little-endian hosts only (x86-64, aarch64)
  return v;
}

inline void accumulate(uint64_t* __restrict acc, const unsigned char* __restrict p,
                       const uint64_t* __restrict key) {
  uint64_t word[kLanes];
  uint64_t prod[kLanes];
  for (size_t j = 0; j < kLanes; ++j) {
    word[j] = load64(p + j * sizeof(uint64_t));
    const uint64_t k = word[j] ^ key[j];
    prod[j] = (k & 0xFFFFFFFFull) * (k >> 32);
  }
  for (size_t j = 0; j < kLanes; ++j) {
    acc[j] += prod[j] + word[j ^ 1];
  }
}

inline void scramble(uint64_t* acc) {
  for (size_t j = 0; j < kLanes; ++j) {
    uint64_t a = acc[j];
    a ^= a >> 47;
    a ^= kKeys.scramble[j];
    acc[j] = a * 0x9E3779B1ull;  // a 32-bit odd multiplier keeps this SIMD-friendly
  }
}

__extension__ typedef unsigned __int128 U128;  // GCC/Clang; x86-64 has a 64x64->128 multiply

inline uint64_t mul_fold(uint64_t a, uint64_t b) {
  const U128 p = static_cast<U128>(a) * b;
  return static_cast<uint64_t>(p) ^ static_cast<uint64_t>(p >> 64);
}

inline uint64_t avalanche(uint64_t h) {
  h ^= h >> 33;
  h *= 0xFF51AFD7ED558CCDull;
  h ^= h >> 29;
  h *= 0xC4CEB9FE1A85EC53ull;
  return h ^ (h >> 32);
}

uint64_t finish(const uint64_t* acc, const uint64_t* fold, uint64_t seed) {
  uint64_t h = seed;
  for (size_t j = 0; j < kLanes; j += 2) {
    h += mul_fold(acc[j] ^ fold[j], acc[j + 1] ^ fold[j + 1]);
  }
  return avalanche(h);
}

// Full blocks, generic code. Returns the bytes consumed.
size_t blocks_generic(uint64_t* acc, const unsigned char* p, size_t nbytes) {
  size_t done = 0;
  for (; nbytes - done >= kBlock; done += kBlock, p += kBlock) {
    for (size_t s = 0; s < kStripesPerBlock; ++s) {
      accumulate(acc, p + s * kStripe, kKeys.stripe + s);
    }
    scramble(acc);
  }
  return done;
}

#if defined(__x86_64__)
#define KILN_AVX2 __attribute__((target("avx2"), always_inline)) inline

KILN_AVX2 __m256i ld(const void* q) { return _mm256_loadu_si256(static_cast<const __m256i*>(q)); }

KILN_AVX2 __m256i scramble_avx2(__m256i a, __m256i key, __m256i mul) {
  a = _mm256_xor_si256(a, _mm256_srli_epi64(a, 47));
  a = _mm256_xor_si256(a, key);
  // a * mul for a 32-bit mul: lo32(a) * mul + (hi32(a) * mul << 32), modulo 2^64.
  const __m256i lo = _mm256_mul_epu32(a, mul);
  const __m256i hi = _mm256_mul_epu32(_mm256_srli_epi64(a, 32), mul);
  return _mm256_add_epi64(lo, _mm256_slli_epi64(hi, 32));
}

// The same arithmetic as accumulate() and scramble(), lanes 0-3 and 4-7 in two AVX2 registers.
__attribute__((target("avx2"))) size_t blocks_avx2(uint64_t* acc, const unsigned char* p,
                                                   size_t nbytes) {
  __m256i a0 = ld(acc), a1 = ld(acc + 4);
  const __m256i mul = _mm256_set1_epi64x(0x9E3779B1ll);
  const __m256i sk0 = ld(kKeys.scramble), sk1 = ld(kKeys.scramble + 4);
  size_t done = 0;
  for (; nbytes - done >= kBlock; done += kBlock, p += kBlock) {
    for (size_t s = 0; s < kStripesPerBlock; ++s) {
      const __m256i w0 = ld(p + s * kStripe), w1 = ld(p + s * kStripe + 32);
      const __m256i k0 = _mm256_xor_si256(w0, ld(kKeys.stripe + s));
      const __m256i k1 = _mm256_xor_si256(w1, ld(kKeys.stripe + s + 4));
      const __m256i p0 = _mm256_mul_epu32(k0, _mm256_srli_epi64(k0, 32));
      const __m256i p1 = _mm256_mul_epu32(k1, _mm256_srli_epi64(k1, 32));
      // word[j ^ 1]: swap the 64-bit halves of each 128-bit lane.
      a0 = _mm256_add_epi64(a0, _mm256_add_epi64(p0, _mm256_shuffle_epi32(w0, 0x4E)));
      a1 = _mm256_add_epi64(a1, _mm256_add_epi64(p1, _mm256_shuffle_epi32(w1, 0x4E)));
    }
    a0 = scramble_avx2(a0, sk0, mul);
    a1 = scramble_avx2(a1, sk1, mul);
  }
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(acc), a0);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(acc + 4), a1);
  return done;
}
#undef KILN_AVX2
#endif

Hash128 hash(const void* data, size_t nbytes, bool use_avx2) {
  const auto* p = static_cast<const unsigned char*>(data);
  uint64_t acc[kLanes];
  for (size_t j = 0; j < kLanes; ++j) acc[j] = kKeys.init[j];

#if defined(__x86_64__)
  const size_t done = use_avx2 ? blocks_avx2(acc, p, nbytes) : blocks_generic(acc, p, nbytes);
#else
  const size_t done = blocks_generic(acc, p, nbytes);
#endif
  p += done;
  size_t left = nbytes - done;
  size_t s = 0;
  for (; left >= kStripe; left -= kStripe, p += kStripe, ++s) {
    accumulate(acc, p, kKeys.stripe + s);
  }
  if (left > 0) {
    unsigned char last[kStripe] = {};
    std::memcpy(last, p, left);
    accumulate(acc, last, kKeys.tail);
  }
  const uint64_t len = static_cast<uint64_t>(nbytes);
  Hash128 h;
  h.lo = finish(acc, kKeys.fold, len * 0x9E3779B97F4A7C15ull);
  h.hi = finish(acc, kKeys.fold + kLanes, ~len * 0xC2B2AE3D27D4EB4Full);
  return h;
}

}  // namespace

Hash128 content_hash(const void* data, size_t nbytes) {
#if defined(__x86_64__)
  static const bool avx2 = __builtin_cpu_supports("avx2");
#else
  constexpr bool avx2 = false;
#endif
  return hash(data, nbytes, avx2);
}

Hash128 content_hash_portable(const void* data, size_t nbytes) {
  return hash(data, nbytes, false);
}

}  // namespace kiln::engine
