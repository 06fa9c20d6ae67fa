// The order in which one source's S sequences are visited within an epoch: a bijection of
// [0, S) chosen by (seed, stream, epoch), where `stream` tells the sources of a mixture apart.
//
// Two schemes, chosen by S:
//   S <= kShuffleTableMaxSequences (2^22): a Fisher-Yates shuffle of [0, S) driven by
//     xoshiro256** seeded through SplitMix64 (EpochPermutation), materialised as a table (at
//     most 16 MiB, built in tens of milliseconds). Every dataset that `forge data prepare` could
//     produce before mixtures existed is in this range (the bundled corpus is ~25M tokens), and
//     this order is pinned by a test as part of the resume contract: keeping it means every
//     existing checkpoint continues its exact stream.
//   S > 2^22: a keyed Feistel network over the smallest even number of bits 2h with 2^(2h) >= S
//     (six rounds, round keys from (seed, stream, epoch) through SplitMix64, round function a
//     64-bit mixer of the right half and the key), restricted to [0, S) by cycle walking:
//     apply the network again while the value is >= S. The walk stays on the cycle of its start,
//     so it returns to [0, S) and the result is a bijection of [0, S); since 2^(2h) < 4 S it
//     takes under four applications on average. O(1) memory and ~100 ns a lookup whatever S,
//     so a corpus of 10^9 or more sequences starts without any per-sequence work.
// One scheme for all sizes would be simpler, but it would change the order of every existing
// small run (and fail the pinned-order test that guards exact resumption); above the threshold
// no earlier run existed, so nothing is lost there.
#pragma once

#include <cstdint>
#include <vector>

namespace forge {

inline constexpr int64_t kShuffleTableMaxSequences = int64_t{1} << 22;

// Fisher-Yates permutation of [0, n) for (seed, epoch); n must be < 2^32.
std::vector<uint32_t> EpochPermutation(int64_t n, uint64_t seed, int64_t epoch);

// The seed a mixture's source `stream` shuffles with: `seed` itself for stream 0 (so a
// one-source run keeps the order it always had), a SplitMix64 mix of (seed, stream) otherwise.
uint64_t StreamSeed(uint64_t seed, int64_t stream);

// Keyed Feistel permutation of [0, n) with cycle walking (see above). n >= 1.
class FeistelPermutation {
 public:
  static constexpr int kRounds = 6;
  FeistelPermutation(int64_t n, uint64_t seed, int64_t epoch);
  int64_t size() const { return n_; }
  // The image of i, for 0 <= i < size().
  int64_t operator()(int64_t i) const;

 private:
  uint64_t Network(uint64_t x) const;  // the permutation of [0, 2^(2h))

  int64_t n_;
  int half_bits_;
  uint64_t half_mask_;
  uint64_t keys_[kRounds];
};

}  // namespace forge
