// The coordinator's run-level metrics: what it learns from every rank's heartbeats, folded
// into one series per run (total tokens/s, mean MFU, slowest rank's step time, lowest step),
// plus forge_worker_up{run_id,rank} and forge_run_state{run_id,state}. Names are in
// metric_catalog.h (MetricSource::kCoordinator).
//
// How the coordinator uses it (one object for the process, registered in the registry its
// MetricsServer serves):
//   RunAggregates agg(registry);
//   // On a worker's heartbeat carrying a step record (world = the run's world size; peak from
//   // DenseBf16PeakTflops(device name the worker reported) or metrics.peak_tflops):
//   agg.ReportRank(run_id, rank, RankSampleFromRecord(rec, world, TrainFlopsPerToken(cfg.model), peak));
//   agg.SetWorkerUp(run_id, rank, true);      // on Join / heartbeat
//   agg.SetWorkerUp(run_id, rank, false);     // heartbeat timeout: the WorkerDown alert fires
//   agg.SetRunState(run_id, "restarting");    // on every state change (RunStateNames())
//   agg.CountHang(run_id);                    // a rank made no step progress (hang timeout)
//   agg.SetStraggler(run_id, rank, true);     // forge_straggler (straggler_watch.h); every
//                                             // reporting rank has the series, 0 by default
//   agg.ForgetRank(run_id, rank);             // the run was re-placed without that rank
//   agg.ForgetRun(run_id);                    // the run is deleted: its series disappear
// A rank's latest sample replaces its previous one; the aggregates cover the ranks that have
// reported since their last ForgetRank. Summary() returns the same numbers for WatchRun /
// forgectl. All calls are thread-safe.
#pragma once

#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <string_view>

#include "common/status.h"
#include "metrics/rank_sample.h"

namespace forge {

struct RunSummary {
  int ranks = 0;                  // ranks reporting
  int64_t step = 0;               // lowest step among them
  double tokens_per_s = 0.0;      // sum
  double mfu = -1.0;              // mean over ranks with a known MFU; < 0: none known
  double slowest_step_seconds = 0.0;
  int slowest_rank = -1;
};

class RunAggregates {
 public:
  explicit RunAggregates(prometheus::Registry& registry);  // registry must outlive this

  void ReportRank(const std::string& run_id, int rank, const RankStepSample& sample);
  void SetWorkerUp(const std::string& run_id, int rank, bool up);
  // One of RunStateNames(); anything else is InvalidArgument and changes nothing.
  Status SetRunState(const std::string& run_id, std::string_view state);
  // forge_hangs_total{run_id} + 1.
  void CountHang(const std::string& run_id);
  // forge_straggler{run_id,rank}: 1 while the rank straggles, else 0.
  void SetStraggler(const std::string& run_id, int rank, bool straggling);
  void ForgetRank(const std::string& run_id, int rank);
  void ForgetRun(const std::string& run_id);

  // NotFound when no rank of the run has reported.
  StatusOr<RunSummary> Summary(const std::string& run_id) const;

 private:
  void PublishLocked(const std::string& run_id);
  void RemoveRunSeriesLocked(const std::string& run_id);

  prometheus::Family<prometheus::Gauge> *tokens_per_s_, *mfu_, *slowest_step_, *slowest_rank_,
      *step_, *ranks_, *worker_up_, *run_state_, *straggler_;
  prometheus::Family<prometheus::Counter>* hangs_;
  mutable std::mutex mu_;
  std::map<std::string, std::map<int, RankStepSample>> runs_;  // run_id -> rank -> latest
  std::map<std::string, std::map<int, bool>> up_;              // series we created, to remove
  std::map<std::string, std::map<int, bool>> straggling_;      // likewise, forge_straggler
  std::map<std::string, std::string> state_;
  std::map<std::string, prometheus::Counter*> hang_counts_;
};

}  // namespace forge
