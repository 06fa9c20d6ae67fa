// Metrics of one training process, set up from cfg.metrics: what `forge train` (and a worker
// agent) calls around RunTraining.
//
//   auto m = TrainMetrics::Start(cfg, run_id, rank, local_rank, world);  // null: port 0
//   group.comm = (*m)->TimeCollectives(std::move(group.comm));  // forge_comm_seconds_total
//   opt.on_step = (*m)->StepCallback(opt.on_step);
//   ... RunTraining ...
//   (*m)->Finish("completed");   // or "stopped" / "failed"
//
// run_id: the coordinator's run id where there is a coordinator (forge-worker, and `forge
// train`'s local launch, whose in-process worker starts it once placed), cfg.name under a
// launcher without one; every rank of a run must pass the same. world: the run's world size
// (the per-rank series are the global record's share, rank_sample.h).
// It serves /metrics on bind_address:(port + local_rank), or with metrics.port `any` on a free
// port each rank binds itself and logs ("forge: rank R serves /metrics on ADDR:PORT"), with the
// worker series
// (worker_metrics.h) and, where NVML loads, the GPU health of the one GPU this rank trains on
// (gpu_health.h, TrainingGpu). MFU uses metrics.peak_tflops, else the dense BF16 peak of the GPU this rank
// trains on (when the run trains on CUDA); without either there is no forge_mfu_ratio.
#pragma once

#include <prometheus/registry.h>

#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "common/config.h"
#include "common/status.h"
#include "metrics/gpu_health.h"
#include "metrics/metrics_server.h"
#include "metrics/timed_comm.h"
#include "metrics/worker_metrics.h"
#include "worker/parallel/comm.h"

namespace forge {

struct StepRecord;

class TrainMetrics {
 public:
  // Null (and OK) when cfg.metrics.port is 0. Unavailable when the port cannot be bound.
  static StatusOr<std::unique_ptr<TrainMetrics>> Start(const RunConfig& cfg,
                                                       const std::string& run_id, int rank,
                                                       int local_rank, int world);

  // Wraps a host communicator (MPI, local, host-staged) so its waits are counted (and added to
  // `clock`, if given); a device communicator (NCCL: its waits are stream-ordered, not host
  // time; it reports through NcclComm::SetTimeSink and a CommTimeCounter) and null come back
  // unchanged.
  std::unique_ptr<Comm> TimeCollectives(std::unique_ptr<Comm> comm, CommWaitClock* clock = nullptr);
  // Observes every record, then calls `next` (if any).
  std::function<void(const StepRecord&)> StepCallback(
      std::function<void(const StepRecord&)> next = {});
  // The run's final state (RunStateNames()); worker_up stays 1 while the process serves.
  void Finish(std::string_view state);

  WorkerMetrics& worker() { return *worker_; }
  int port() const { return server_->port(); }
  double peak_tflops() const { return worker_->options().peak_tflops; }
  const std::string& device() const { return device_; }  // what the peak is for
  bool gpu_health() const { return gpu_ != nullptr; }

 private:
  TrainMetrics() = default;
  std::shared_ptr<prometheus::Registry> registry_;
  std::unique_ptr<MetricsServer> server_;
  std::unique_ptr<WorkerMetrics> worker_;
  std::shared_ptr<GpuHealthCollector> gpu_;
  std::string device_;
};

}  // namespace forge
