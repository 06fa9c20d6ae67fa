#include "metrics/worker_metrics.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "metrics/families.h"
#include "metrics/metric_catalog.h"
#include "worker/train/trainer.h"

namespace forge {

WorkerMetrics::WorkerMetrics(prometheus::Registry& r, WorkerMetricsOptions options)
    : options_(std::move(options)) {
  step_ = &GaugeFamily(r, "forge_step");
  tokens_per_s_ = &GaugeFamily(r, "forge_tokens_per_second");
  mfu_ = &GaugeFamily(r, "forge_mfu_ratio");
  loss_ = &GaugeFamily(r, "forge_loss");
  val_loss_ = &GaugeFamily(r, "forge_val_loss");
  grad_norm_ = &GaugeFamily(r, "forge_grad_norm");
  lr_ = &GaugeFamily(r, "forge_learning_rate");
  gpu_memory_ = &GaugeFamily(r, "forge_gpu_memory_bytes");
  ckpt_seconds_ = &GaugeFamily(r, "forge_checkpoint_seconds");
  ckpt_bytes_ = &GaugeFamily(r, "forge_checkpoint_bytes");
  ckpt_last_step_ = &GaugeFamily(r, "forge_checkpoint_last_step");
  ckpt_every_ = &GaugeFamily(r, "forge_checkpoint_every_steps");
  up_ = &GaugeFamily(r, "forge_worker_up");
  run_state_ = &GaugeFamily(r, "forge_run_state");
  comm_ = &CounterFamily(r, "forge_comm_seconds_total");
  collective_ = &CounterFamily(r, "forge_collective_seconds_total");
  data_wait_ = &CounterFamily(r, "forge_data_wait_seconds_total").Add(Labels());
  checkpoints_ = &CounterFamily(r, "forge_checkpoints_total").Add(Labels());
  skipped_ = &CounterFamily(r, "forge_skipped_steps_total").Add(Labels());
  spikes_ = &CounterFamily(r, "forge_loss_spikes_total").Add(Labels());
  rollbacks_ = &CounterFamily(r, "forge_spike_rollbacks_total").Add(Labels());
  step_seconds_ = &HistogramFamily(r, "forge_step_seconds").Add(Labels(), StepSecondsBuckets());
  for (CollectiveOp op : {CollectiveOp::kAllReduce, CollectiveOp::kReduceScatter,
                          CollectiveOp::kAllGather, CollectiveOp::kBroadcast,
                          CollectiveOp::kBarrier})
  {  // all ops present from the start, at 0
    comm_->Add(Labels("op", CollectiveName(op)));
    collective_->Add(Labels("op", CollectiveName(op)));
  }
  Set(ckpt_every_, double(options_.checkpoint_every_steps));
  SetUp(true);
  (void)SetRunState("running");
}

prometheus::Labels WorkerMetrics::Labels() const {
  return {{"run_id", options_.run_id}, {"rank", std::to_string(options_.rank)}};
}

prometheus::Labels WorkerMetrics::Labels(const std::string& key, const std::string& value) const {
  prometheus::Labels l = Labels();
  l[key] = value;
  return l;
}

void WorkerMetrics::ObserveStep(const StepRecord& rec) {
  const RankStepSample s = RankSampleFromRecord(rec, options_.world, options_.flops_per_token,
                                                options_.peak_tflops);
  const int64_t steps = std::max<int64_t>(1, rec.window_steps);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!seen_record_ && rec.checkpoint_step < 0) {
      // Before the first commit the newest checkpoint is where this run started (0 or the
      // resumed step), so "steps since the last checkpoint" is right from the first record.
      Set(ckpt_last_step_, double(std::max<int64_t>(0, rec.step - steps)));
    }
    seen_record_ = true;
    last_ = s;
    // The record carries the process's running totals of skipped steps (non-finite or loss
    // spikes), spikes and rollbacks; the counters take what is new since the last record.
    auto take = [](prometheus::Counter* c, int64_t total, int64_t* seen) {
      if (total > *seen) {
        c->Increment(double(total - *seen));
        *seen = total;
      }
    };
    take(skipped_, rec.skipped_steps, &skipped_seen_);
    take(spikes_, rec.loss_spikes, &spikes_seen_);
    take(rollbacks_, rec.spike_rollbacks, &rollbacks_seen_);
  }
  Set(step_, double(rec.step));
  Set(tokens_per_s_, s.tokens_per_s);
  if (s.mfu >= 0.0) Set(mfu_, s.mfu);
  Set(loss_, rec.loss);
  if (rec.val_loss >= 0.0f) Set(val_loss_, rec.val_loss);
  Set(grad_norm_, rec.grad_norm);
  Set(lr_, rec.lr);

  // The record holds the mean of `steps` steps: count each at the mean.
  const std::vector<double>& bounds = StepSecondsBuckets();
  std::vector<double> increments(bounds.size() + 1, 0.0);
  const size_t bucket =
      std::lower_bound(bounds.begin(), bounds.end(), rec.step_seconds) - bounds.begin();
  increments[bucket] = double(steps);
  step_seconds_->ObserveMultiple(increments, rec.step_seconds * double(steps));

  if (rec.data_wait_seconds > 0.0) data_wait_->Increment(rec.data_wait_seconds);
  gpu_memory_->Add(Labels("kind", "allocated")).Set(double(rec.gpu_allocated_bytes));
  gpu_memory_->Add(Labels("kind", "reserved")).Set(double(rec.gpu_reserved_bytes));
  gpu_memory_->Add(Labels("kind", "peak")).Set(double(rec.gpu_peak_bytes));

  if (rec.checkpoint_step >= 0) {
    ckpt_seconds_->Add(Labels("phase", "blocked")).Set(rec.checkpoint_blocked_s);
    ckpt_seconds_->Add(Labels("phase", "write")).Set(rec.checkpoint_write_s);
    Set(ckpt_bytes_, double(rec.checkpoint_bytes));
    Set(ckpt_last_step_, double(rec.checkpoint_step));
    checkpoints_->Increment(std::max(1, rec.checkpoints_committed));
  }
}

Status WorkerMetrics::SetRunState(std::string_view state) {
  if (!IsRunStateName(state))
    return Status::Invalid("run state '" + std::string(state) + "' is not one of the known states");
  for (std::string_view s : RunStateNames())
    run_state_->Add(Labels("state", std::string(s))).Set(s == state ? 1.0 : 0.0);
  return Status::Ok();
}

void WorkerMetrics::SetUp(bool up) { Set(up_, up ? 1.0 : 0.0); }

void WorkerMetrics::AddCommSeconds(CollectiveOp op, double seconds) {
  if (seconds > 0.0) comm_->Add(Labels("op", CollectiveName(op))).Increment(seconds);
}

void WorkerMetrics::AddCollectiveSeconds(CollectiveOp op, double seconds) {
  if (seconds > 0.0) collective_->Add(Labels("op", CollectiveName(op))).Increment(seconds);
}

void WorkerMetrics::AddSkippedSteps(int64_t n) {
  if (n > 0) skipped_->Increment(double(n));
}

RankStepSample WorkerMetrics::last_sample() const {
  std::lock_guard<std::mutex> lock(mu_);
  return last_;
}

}  // namespace forge
