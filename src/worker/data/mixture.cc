// The weighted apportionment of global positions to sources (mixture.h).
#include "worker/data/mixture.h"
#include "common/splitmix64.h"

#include <algorithm>
#include <cmath>
#include <string>

namespace forge {
namespace {

using Int128 = __int128;

constexpr int64_t kPhaseScale = int64_t{1} << MixtureSchedule::kPhaseBits;

}  // namespace

StatusOr<MixtureSchedule> MixtureSchedule::Make(const std::vector<double>& weights,
                                                uint64_t seed) {
  if (weights.empty()) return Status::Invalid("a data mixture needs at least one source");
  double sum = 0.0;
  for (size_t s = 0; s < weights.size(); ++s) {
    if (!(weights[s] > 0.0) || !std::isfinite(weights[s]))
      return Status::Invalid("data source " + std::to_string(s) + ": weight must be a finite "
                             "number > 0, got " + std::to_string(weights[s]));
    sum += weights[s];
  }
  MixtureSchedule m;
  const double scale = double(int64_t{1} << kWeightBits);
  for (size_t s = 0; s < weights.size(); ++s) {
    m.quanta_.push_back(std::max<int64_t>(1, std::llround(weights[s] / sum * scale)));
    m.phase_.push_back(static_cast<int64_t>(SplitMix64(seed ^ SplitMix64(0xDA7A0000ull + s)) &
                                            uint64_t(kPhaseScale - 1)));
  }
  return m;
}

double MixtureSchedule::share(int s) const {
  int64_t total = 0;
  for (int64_t q : quanta_) total += q;
  return double(quanta_[size_t(s)]) / double(total);
}

int64_t MixtureSchedule::EventsUpTo(int s, int t, int64_t j) const {
  // Source s's j'-th event is at (j' D + d_s) / q_s; count those before (t, j), ties for s <= t.
  const Int128 a = (Int128(j) * kPhaseScale + phase_[size_t(t)]) * quanta_[size_t(s)];
  const Int128 qt = quanta_[size_t(t)];
  Int128 xmax;  // the largest j' D + d_s that counts
  if (s <= t) {
    xmax = a / qt;
  } else {
    if (a == 0) return 0;
    xmax = (a - 1) / qt;
  }
  const int64_t d = phase_[size_t(s)];
  if (xmax < d) return 0;
  return static_cast<int64_t>((xmax - d) / kPhaseScale) + 1;
}

int64_t MixtureSchedule::RankOf(int t, int64_t j) const {
  int64_t rank = 0;
  for (int s = 0; s < sources(); ++s) rank += EventsUpTo(s, t, j);
  return rank;
}

std::vector<int64_t> MixtureSchedule::CountsBefore(int64_t p) const {
  std::vector<int64_t> counts(quanta_.size(), 0);
  if (p <= 0) return counts;
  if (sources() == 1) {
    counts[0] = p;
    return counts;
  }
  // The p-th event (1-based) is the one whose rank is p: for each source, the smallest j with
  // RankOf(t, j) >= p; exactly one source hits p exactly.
  for (int t = 0; t < sources(); ++t) {
    int64_t lo = 0, hi = p - 1;  // RankOf(t, j) >= j + 1, so j <= p - 1
    if (RankOf(t, hi) < p) continue;
    while (lo < hi) {
      const int64_t mid = lo + (hi - lo) / 2;
      if (RankOf(t, mid) >= p)
        hi = mid;
      else
        lo = mid + 1;
    }
    if (RankOf(t, lo) != p) continue;
    for (int s = 0; s < sources(); ++s) counts[size_t(s)] = EventsUpTo(s, t, lo);
    return counts;
  }
  return counts;  // unreachable: every position is some source's event
}

std::vector<MixtureSchedule::Draw> MixtureSchedule::DrawsFrom(int64_t p, int64_t n) const {
  std::vector<int64_t> next = CountsBefore(p);
  std::vector<Draw> out;
  out.reserve(static_cast<size_t>(std::max<int64_t>(0, n)));
  for (int64_t i = 0; i < n; ++i) {
    // The earliest next event: (next_s D + d_s) / q_s, smallest; ties to the lower index.
    int best = 0;
    for (int s = 1; s < sources(); ++s) {
      const Int128 xs = Int128(next[size_t(s)]) * kPhaseScale + phase_[size_t(s)];
      const Int128 xb = Int128(next[size_t(best)]) * kPhaseScale + phase_[size_t(best)];
      if (xs * quanta_[size_t(best)] < xb * quanta_[size_t(s)]) best = s;
    }
    out.push_back({best, next[size_t(best)]});
    ++next[size_t(best)];
  }
  return out;
}

}  // namespace forge
