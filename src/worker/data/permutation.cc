// Epoch orders: the Fisher-Yates table for small sources, the Feistel network for large ones
// (why two: permutation.h).
#include "worker/data/permutation.h"
#include "common/splitmix64.h"

#include <cstddef>
#include <utility>

namespace forge {
namespace {

inline uint64_t Rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

// xoshiro256** (Blackman & Vigna): small, fast, good statistical quality.
struct Xoshiro256 {
  uint64_t s[4];
  Xoshiro256(uint64_t seed, uint64_t stream) {
    uint64_t sm = seed ^ (0xD1B54A32D192ED03ull * (stream + 1));
    for (uint64_t& w : s) w = SplitMix64Next(&sm);
  }
  uint64_t Next() {
    const uint64_t result = Rotl(s[1] * 5, 7) * 9;
    const uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = Rotl(s[3], 45);
    return result;
  }
  // Uniform in [0, bound) by Lemire's multiply-shift with rejection (no modulo bias).
  uint64_t Below(uint64_t bound) {
    unsigned __int128 m = static_cast<unsigned __int128>(Next()) * bound;
    uint64_t low = static_cast<uint64_t>(m);
    if (low < bound) {
      const uint64_t threshold = (0 - bound) % bound;
      while (low < threshold) {
        m = static_cast<unsigned __int128>(Next()) * bound;
        low = static_cast<uint64_t>(m);
      }
    }
    return static_cast<uint64_t>(m >> 64);
  }
};

}  // namespace

std::vector<uint32_t> EpochPermutation(int64_t n, uint64_t seed, int64_t epoch) {
  std::vector<uint32_t> perm(static_cast<std::size_t>(n));
  for (int64_t i = 0; i < n; ++i) perm[static_cast<std::size_t>(i)] = static_cast<uint32_t>(i);
  Xoshiro256 rng(seed, static_cast<uint64_t>(epoch));
  for (int64_t i = n - 1; i > 0; --i) {
    const uint64_t j = rng.Below(static_cast<uint64_t>(i) + 1);
    std::swap(perm[static_cast<std::size_t>(i)], perm[j]);
  }
  return perm;
}

uint64_t StreamSeed(uint64_t seed, int64_t stream) {
  if (stream == 0) return seed;
  uint64_t state =
      seed ^ SplitMix64Finish(0x5EED5EED00000000ull + static_cast<uint64_t>(stream));
  return SplitMix64Next(&state);
}

FeistelPermutation::FeistelPermutation(int64_t n, uint64_t seed, int64_t epoch) : n_(n) {
  int bits = 1;  // 2^bits >= n, at least 2 (a network needs two halves of >= 1 bit)
  while (bits < 62 && (int64_t{1} << bits) < n) ++bits;
  half_bits_ = (bits + 1) / 2;
  half_mask_ = (uint64_t{1} << half_bits_) - 1;
  uint64_t state =
      seed ^ SplitMix64Finish(0xFE157E1Dull ^ (static_cast<uint64_t>(epoch) * kSplitMix64Gamma));
  for (uint64_t& k : keys_) k = SplitMix64Next(&state);
}

uint64_t FeistelPermutation::Network(uint64_t x) const {
  uint64_t left = x >> half_bits_, right = x & half_mask_;
  for (const uint64_t k : keys_) {
    const uint64_t f = SplitMix64Finish(right ^ k) & half_mask_;
    const uint64_t next = left ^ f;
    left = right;
    right = next;
  }
  return (left << half_bits_) | right;
}

int64_t FeistelPermutation::operator()(int64_t i) const {
  uint64_t x = Network(static_cast<uint64_t>(i));
  while (x >= static_cast<uint64_t>(n_)) x = Network(x);
  return static_cast<int64_t>(x);
}

}  // namespace forge
