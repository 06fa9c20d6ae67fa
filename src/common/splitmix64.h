// SplitMix64 (Steele, Lea and Flood; the constants of Vigna's reference): the mixer and seeding
// generator behind Forge's seeded streams (weight init, sampling, data order, mixtures, the
// held-out split). Their outputs are part of what a seed means: trained weights, sampled text
// and data order depend on these exact values.
#pragma once

#include <cstdint>

namespace forge {

inline constexpr uint64_t kSplitMix64Gamma = 0x9E3779B97F4A7C15ull;

// The output function: every input bit affects every output bit.
constexpr uint64_t SplitMix64Finish(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// A hash of x: the generator's output from state x.
constexpr uint64_t SplitMix64(uint64_t x) { return SplitMix64Finish(x + kSplitMix64Gamma); }

// The generator: advances *state and returns its next output.
inline uint64_t SplitMix64Next(uint64_t* state) {
  *state += kSplitMix64Gamma;
  return SplitMix64Finish(*state);
}

}  // namespace forge
