#include "coordinator/straggler_watch.h"

#include <algorithm>
#include <cstdio>

namespace forge::coord {
namespace {

constexpr double kMinExcessSeconds = 1e-3;

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

}  // namespace

std::vector<StragglerChange> StragglerWatch::Report(const std::string& run_id, int rank,
                                                    int64_t step, double step_seconds,
                                                    double comm_wait_seconds, double threshold,
                                                    int reports) {
  std::vector<StragglerChange> out;
  if (threshold <= 0.0) return out;
  std::map<int, Rank>& ranks = runs_[run_id];
  Rank& me = ranks[rank];
  if (step <= me.step) return out;  // the same record again (a repeated final report)
  me.step = step;
  me.busy = std::max(0.0, step_seconds - comm_wait_seconds);
  std::vector<double> others;
  for (const auto& [r, x] : ranks)
    if (r != rank && x.step >= 0) others.push_back(x.busy);
  if (others.empty()) return out;
  const double median = Median(others);
  const double ratio = median > 0 ? me.busy / median : 0.0;
  const bool slow = me.busy > threshold * median && me.busy - median > kMinExcessSeconds;
  if (slow) {
    ++me.slow_in_row;
    me.fine_in_row = 0;
  } else {
    ++me.fine_in_row;
    me.slow_in_row = 0;
  }
  char buf[400];
  if (!me.straggling && me.slow_in_row >= std::max(1, reports)) {
    me.straggling = true;
    std::snprintf(buf, sizeof buf,
                  "rank %d is straggling: busy %.4f s per step outside collectives at step %ld, "
                  "%.2fx the median of the other %zu rank(s) (%.4f s), %d step reports in a row "
                  "(train.straggler_threshold %g)",
                  rank, me.busy, long(step), ratio, others.size(), median, me.slow_in_row,
                  threshold);
    me.warning = buf;
    out.push_back({rank, true, "straggler: " + me.warning});
  } else if (me.straggling && me.fine_in_row >= std::max(1, reports)) {
    me.straggling = false;
    me.warning.clear();
    std::snprintf(buf, sizeof buf,
                  "straggler recovered: rank %d busy %.4f s per step at step %ld, %.2fx the "
                  "median of the other rank(s) (%.4f s), within train.straggler_threshold %g for "
                  "%d step reports in a row",
                  rank, me.busy, long(step), ratio, median, threshold, me.fine_in_row);
    out.push_back({rank, false, buf});
  }
  return out;
}

std::vector<int> StragglerWatch::Straggling(const std::string& run_id) const {
  std::vector<int> out;
  auto it = runs_.find(run_id);
  if (it == runs_.end()) return out;
  for (const auto& [r, x] : it->second)
    if (x.straggling) out.push_back(r);
  return out;
}

std::vector<std::string> StragglerWatch::Warnings(const std::string& run_id) const {
  std::vector<std::string> out;
  auto it = runs_.find(run_id);
  if (it == runs_.end()) return out;
  for (const auto& [r, x] : it->second)
    if (x.straggling) out.push_back(x.warning);
  return out;
}

void StragglerWatch::ForgetRun(const std::string& run_id) { runs_.erase(run_id); }

}  // namespace forge::coord
