// Which data source each global position of the sequence stream draws from, when a run mixes
// several datasets by weight (data.sources).
//
// Apportionment. Weights w_s are turned into integer quanta q_s = round(2^24 w_s / sum w), at
// least 1 (so a share is resolved to one part in 16.7 million). Source s's j-th sequence
// (j = 0, 1, ...) is an event at time (j + d_s / 2^16) / q_s, where the phase d_s in [0, 2^16)
// comes from (seed, s); the stream of global positions is every source's events merged in time
// order, ties to the lower source index. This is a divisor method of apportionment (like
// Sainte-Lague's with a seeded offset), so:
//   - it is deterministic from (seed, weights) and the global position alone: position p's
//     source, and how many sequences each source has given before p, are computed directly
//     (CountsBefore: a binary search over event times in exact 128-bit integer arithmetic,
//     O(sources^2 log p)), never by replaying the stream;
//   - it is house-monotone: each source's count never decreases as p grows, so every source
//     has a cursor that only moves forward;
//   - among the first p positions source s has within about one sequence of p q_s / Q
//     (Q = sum q), for every p: each global batch of G sequences takes G q_s / Q of source s,
//     rounded one way or the other, and the proportions hold at every scale, not only on
//     average as independent random draws would.
// With one source every position is source 0 and its count is p: the stream is the plain
// single-dataset one.
//
// The global positions do not depend on the world size (sampler.h lays ranks out over them),
// so neither does the mixture.
#pragma once

#include <cstdint>
#include <vector>

#include "common/status.h"

namespace forge {

class MixtureSchedule {
 public:
  static constexpr int kWeightBits = 24;
  static constexpr int kPhaseBits = 16;

  // Weights must be finite and > 0; at least one source.
  static StatusOr<MixtureSchedule> Make(const std::vector<double>& weights, uint64_t seed);

  int sources() const { return static_cast<int>(quanta_.size()); }
  // Each source's share of the stream, q_s / Q.
  double share(int s) const;

  // How many of global positions [0, p) draw from each source (sums to p). p >= 0.
  std::vector<int64_t> CountsBefore(int64_t p) const;

  struct Draw {
    int source;
    int64_t index;  // the source's own position: sequences it gave before this one
  };
  // The draws of positions p .. p+n-1.
  std::vector<Draw> DrawsFrom(int64_t p, int64_t n) const;

 private:
  MixtureSchedule() = default;
  // Events of source s at or before source t's j-th event (ties counted for s <= t).
  int64_t EventsUpTo(int s, int t, int64_t j) const;
  // Events of all sources at or before source t's j-th event: its 1-based global position.
  int64_t RankOf(int t, int64_t j) const;

  std::vector<int64_t> quanta_;
  std::vector<int64_t> phase_;
};

}  // namespace forge
