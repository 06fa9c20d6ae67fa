#include "metrics/metric_catalog.h"

namespace forge {

const std::vector<MetricInfo>& MetricCatalog() {
  using T = MetricType;
  using S = MetricSource;
  static const std::vector<MetricInfo> kCatalog = {
      // --- worker: one series per (run_id, rank) -------------------------------------------
      {"forge_step", T::kGauge, S::kWorker, {"run_id", "rank"},
       "Last completed optimizer step (global, counting resumed steps)."},
      {"forge_tokens_per_second", T::kGauge, S::kWorker, {"run_id", "rank"},
       "This rank's share of training throughput (global tokens/s divided by world size), "
       "averaged over the steps since the previous record; sum over ranks for the run's."},
      {"forge_mfu_ratio", T::kGauge, S::kWorker, {"run_id", "rank"},
       "Model FLOPs utilisation of this rank's device: tokens/s * FLOPs/token over the dense "
       "BF16 peak (absent when the peak is unknown)."},
      {"forge_step_seconds", T::kHistogram, S::kWorker, {"run_id", "rank"},
       "Wall time of one optimizer step (each logged record counts its steps at their mean)."},
      {"forge_loss", T::kGauge, S::kWorker, {"run_id", "rank"}, "Training loss of the last logged step."},
      {"forge_val_loss", T::kGauge, S::kWorker, {"run_id", "rank"}, "Last validation loss."},
      {"forge_grad_norm", T::kGauge, S::kWorker, {"run_id", "rank"},
       "Global gradient L2 norm before clipping, last logged step."},
      {"forge_learning_rate", T::kGauge, S::kWorker, {"run_id", "rank"}, "Learning rate of the last logged step."},
      {"forge_gpu_memory_bytes", T::kGauge, S::kWorker, {"run_id", "rank", "kind"},
       "Device memory of the training backend: kind=allocated (its buffers), reserved (held "
       "from the driver), peak (high-water mark); 0 on the CPU backend."},
      {"forge_comm_seconds_total", T::kCounter, S::kWorker, {"run_id", "rank", "op"},
       "Time the step stood still waiting for collectives, by collective (all_reduce, "
       "reduce_scatter, all_gather, broadcast, barrier): the communication not hidden behind "
       "compute. Host communicators (MPI): time blocked in the wait; NCCL: the compute "
       "stream's stalls at its waits on the NCCL stream (CUDA events)."},
      {"forge_collective_seconds_total", T::kCounter, S::kWorker, {"run_id", "rank", "op"},
       "Running time of collectives, by collective, hidden behind compute or not. NCCL: each "
       "collective's time on the NCCL stream (CUDA events), waiting for slower ranks "
       "included; host communicators (MPI): the same time as forge_comm_seconds_total."},
      {"forge_data_wait_seconds_total", T::kCounter, S::kWorker, {"run_id", "rank"},
       "Time the training loop spent fetching batches."},
      {"forge_checkpoint_seconds", T::kGauge, S::kWorker, {"run_id", "rank", "phase"},
       "Last committed checkpoint: phase=blocked (training loop stalled taking the snapshot) "
       "and phase=write (slowest rank's background write)."},
      {"forge_checkpoint_bytes", T::kGauge, S::kWorker, {"run_id", "rank"},
       "Bytes of all shards of the last committed checkpoint."},
      {"forge_checkpoint_last_step", T::kGauge, S::kWorker, {"run_id", "rank"},
       "Step of the newest committed checkpoint (the resumed step before the first)."},
      {"forge_checkpoint_every_steps", T::kGauge, S::kWorker, {"run_id", "rank"},
       "Configured checkpoint interval in steps (0: only on a stop request)."},
      {"forge_checkpoints_total", T::kCounter, S::kWorker, {"run_id", "rank"},
       "Checkpoints committed by this process."},
      {"forge_skipped_steps_total", T::kCounter, S::kWorker, {"run_id", "rank"},
       "Optimizer steps whose update was skipped (non-finite loss or gradients, or a loss "
       "spike)."},
      {"forge_loss_spikes_total", T::kCounter, S::kWorker, {"run_id", "rank"},
       "Steps skipped as loss spikes: loss or gradient norm more than train.spike_sigma "
       "standard deviations above the last train.spike_window steps."},
      {"forge_spike_rollbacks_total", T::kCounter, S::kWorker, {"run_id", "rank"},
       "Rollbacks to the last committed checkpoint after train.spike_max_in_row loss spikes in "
       "a row (the data they read is left out)."},
      {"forge_worker_up", T::kGauge, S::kWorker, {"run_id", "rank"},
       "1 while the worker serves a run (from the coordinator: 0 once its heartbeats stop)."},
      {"forge_run_state", T::kGauge, S::kWorker, {"run_id", "rank", "state"},
       "1 for the run's current state, 0 for the others (from the coordinator: no rank label)."},
      // --- GPU health from NVML: one series per device this process sees --------------------
      {"forge_gpu_info", T::kGauge, S::kGpuHealth, {"run_id", "rank", "gpu", "name", "uuid"},
       "1 per visible GPU; its name and UUID as labels."},
      {"forge_gpu_utilization_ratio", T::kGauge, S::kGpuHealth, {"run_id", "rank", "gpu"},
       "Fraction of the last sample period a kernel was running (NVML utilization.gpu)."},
      {"forge_gpu_device_memory_bytes", T::kGauge, S::kGpuHealth, {"run_id", "rank", "gpu", "kind"},
       "Device memory as NVML sees it (all processes): kind=used|total."},
      {"forge_gpu_power_watts", T::kGauge, S::kGpuHealth, {"run_id", "rank", "gpu"}, "Board power draw."},
      {"forge_gpu_temperature_celsius", T::kGauge, S::kGpuHealth, {"run_id", "rank", "gpu"}, "GPU core temperature."},
      {"forge_gpu_sm_clock_hertz", T::kGauge, S::kGpuHealth, {"run_id", "rank", "gpu"}, "Current SM clock."},
      {"forge_gpu_throttle_reason", T::kGauge, S::kGpuHealth, {"run_id", "rank", "gpu", "reason"},
       "1 while NVML reports this clock throttle reason active, else 0."},
      // --- coordinator: run-level aggregates, one series per run ----------------------------
      {"forge_run_tokens_per_second", T::kGauge, S::kCoordinator, {"run_id"},
       "Run throughput: sum of the ranks' latest tokens/s."},
      {"forge_run_mfu_ratio", T::kGauge, S::kCoordinator, {"run_id"}, "Mean MFU over the ranks that report one."},
      {"forge_run_slowest_step_seconds", T::kGauge, S::kCoordinator, {"run_id"},
       "The slowest rank's latest mean step time (stragglers)."},
      {"forge_run_slowest_rank", T::kGauge, S::kCoordinator, {"run_id"}, "Which rank that is."},
      {"forge_run_step", T::kGauge, S::kCoordinator, {"run_id"}, "Lowest step any rank reported."},
      {"forge_run_ranks_reporting", T::kGauge, S::kCoordinator, {"run_id"},
       "Ranks whose step samples the aggregates cover."},
      {"forge_straggler", T::kGauge, S::kCoordinator, {"run_id", "rank"},
       "1 while the rank straggles: its busy time per step (step time less its wait in "
       "collectives) above train.straggler_threshold times the other ranks' median for "
       "train.straggler_reports step reports in a row; else 0."},
      {"forge_hangs_total", T::kCounter, S::kCoordinator, {"run_id"},
       "Hangs detected: a placed rank whose step did not advance for train.hang_timeout_s "
       "(stopped, or blocked in a collective or a data read); each restarted the run from its "
       "last committed checkpoint."},
  };
  return kCatalog;
}

const MetricInfo* FindMetric(std::string_view name) {
  for (const MetricInfo& m : MetricCatalog())
    if (m.name == name) return &m;
  return nullptr;
}

const MetricInfo* FindSeries(std::string_view series_name) {
  if (const MetricInfo* m = FindMetric(series_name)) return m;
  for (std::string_view suffix : {"_bucket", "_sum", "_count"}) {
    if (series_name.size() <= suffix.size() ||
        series_name.substr(series_name.size() - suffix.size()) != suffix)
      continue;
    const MetricInfo* m = FindMetric(series_name.substr(0, series_name.size() - suffix.size()));
    if (m && m->type == MetricType::kHistogram) return m;
  }
  return nullptr;
}

const std::vector<std::string_view>& RunStateNames() {
  static const std::vector<std::string_view> kNames = {
      "pending", "running", "checkpointing", "stopped", "completed", "failed", "restarting"};
  return kNames;
}

bool IsRunStateName(std::string_view state) {
  for (std::string_view s : RunStateNames())
    if (s == state) return true;
  return false;
}

const std::vector<double>& StepSecondsBuckets() {
  static const std::vector<double> kBuckets = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
                                               0.1,   0.25,   0.5,   1.0,  2.5,   5.0,
                                               10.0,  25.0,   50.0,  100.0};
  return kBuckets;
}

}  // namespace forge
