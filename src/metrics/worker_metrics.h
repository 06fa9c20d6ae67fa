// A worker's training metrics for one run: fed from the trainer's StepRecords
// (TrainOptions::on_step) and from the timed collectives (timed_comm.h), registered in a
// prometheus-cpp registry that a MetricsServer serves on /metrics. Every series carries
// run_id and rank labels; names and meanings are in metric_catalog.h.
//
// Thread-safety: ObserveStep, SetRunState and the Add* calls may come from any thread (the
// prometheus-cpp metrics are atomic; the little state of our own is under a mutex).
#pragma once

#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include <cstdint>
#include <mutex>
#include <string>
#include <string_view>

#include "common/status.h"
#include "metrics/rank_sample.h"
#include "worker/parallel/comm.h"

namespace forge {

struct StepRecord;  // worker/train/trainer.h

struct WorkerMetricsOptions {
  std::string run_id;
  int rank = 0;   // global rank
  int world = 1;
  double flops_per_token = 0.0;  // TrainFlopsPerToken(cfg.model)
  double peak_tflops = 0.0;      // dense BF16 peak of the device; <= 0: no MFU series
  int64_t checkpoint_every_steps = 0;
};

class WorkerMetrics {
 public:
  // Registers the worker families in `registry` (which must outlive this) and sets
  // forge_worker_up to 1 and the run state to "running".
  WorkerMetrics(prometheus::Registry& registry, WorkerMetricsOptions options);

  // One trainer record: step, loss, lr, grad norm, throughput, MFU, step-time histogram (the
  // record's mean counted once per step it covers), data wait, device memory, checkpoints,
  // skipped steps, loss spikes and spike rollbacks.
  void ObserveStep(const StepRecord& r);
  // One of RunStateNames(); anything else is InvalidArgument and changes nothing.
  Status SetRunState(std::string_view state);
  void SetUp(bool up);
  // forge_comm_seconds_total: exposed wait for a collective (comm_time_sink.h).
  void AddCommSeconds(CollectiveOp op, double seconds);
  // forge_collective_seconds_total: a collective's running time, overlapped or not.
  void AddCollectiveSeconds(CollectiveOp op, double seconds);
  void AddSkippedSteps(int64_t n);

  // The latest record as the coordinator would aggregate it.
  RankStepSample last_sample() const;
  const WorkerMetricsOptions& options() const { return options_; }

 private:
  prometheus::Labels Labels() const;  // run_id, rank
  prometheus::Labels Labels(const std::string& key, const std::string& value) const;
  // Sets the (run_id, rank[, key=value]) series of a gauge family, creating it on first use:
  // a series appears with its first real value, never as a made-up 0.
  void Set(prometheus::Family<prometheus::Gauge>* f, double v) { f->Add(Labels()).Set(v); }

  WorkerMetricsOptions options_;
  prometheus::Family<prometheus::Gauge> *step_, *tokens_per_s_, *mfu_, *loss_, *val_loss_,
      *grad_norm_, *lr_, *gpu_memory_, *ckpt_seconds_, *ckpt_bytes_, *ckpt_last_step_,
      *ckpt_every_, *up_, *run_state_;
  prometheus::Counter *data_wait_, *checkpoints_, *skipped_, *spikes_, *rollbacks_;
  prometheus::Family<prometheus::Counter> *comm_, *collective_;
  prometheus::Histogram* step_seconds_;

  mutable std::mutex mu_;
  bool seen_record_ = false;
  RankStepSample last_;
  int64_t skipped_seen_ = 0;  // StepRecord::skipped_steps already counted
  int64_t spikes_seen_ = 0, rollbacks_seen_ = 0;  // loss_spikes, spike_rollbacks alike
};

}  // namespace forge
