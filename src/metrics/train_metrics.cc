#include "metrics/train_metrics.h"

#include <cstdio>
#include <cstring>

#include "common/peak_flops.h"
#include "metrics/timed_comm.h"
#include "worker/model/param_layout.h"
#include "worker/train/backend.h"
#include "worker/train/trainer.h"

namespace forge {

StatusOr<std::unique_ptr<TrainMetrics>> TrainMetrics::Start(const RunConfig& cfg,
                                                            const std::string& run_id, int rank,
                                                            int local_rank, int world) {
  if (cfg.metrics.port == 0) return std::unique_ptr<TrainMetrics>();
  // metrics.port any (-1): every rank binds a free port of its own and logs it (below).
  const bool any_port = cfg.metrics.port == -1;
  const int port = any_port ? 0 : cfg.metrics.port + local_rank;
  if (port > 65535)
    return Status::Invalid("metrics.port " + std::to_string(cfg.metrics.port) + " + local rank " +
                           std::to_string(local_rank) + " exceeds 65535");
  std::unique_ptr<TrainMetrics> m(new TrainMetrics());
  FORGE_ASSIGN_OR_RETURN(m->server_, MetricsServer::Start(cfg.metrics.bind_address, port));
  m->registry_ = std::make_shared<prometheus::Registry>();
  m->server_->Register(m->registry_);

  std::string why;
  m->gpu_ = GpuHealthCollector::Make(run_id, rank, local_rank, world, &why);
  if (m->gpu_) m->server_->Register(m->gpu_);

  WorkerMetricsOptions o;
  o.run_id = run_id;
  o.rank = rank;
  o.world = world;
  o.flops_per_token = TrainFlopsPerToken(cfg.model);
  o.checkpoint_every_steps = cfg.checkpoint.every_steps;
  if (cfg.metrics.peak_tflops > 0.0) {
    o.peak_tflops = cfg.metrics.peak_tflops;
    m->device_ = "metrics.peak_tflops";
  } else if (m->gpu_ && cfg.train.backend != Backend::kCpu && CudaDeviceAvailable()) {
    // The GPU whose health this rank exports is the one it trains on (TrainingGpu).
    const unsigned index = m->gpu_->device();
    auto name = m->gpu_->nvml().DeviceName(index);
    if (name.ok()) {
      m->device_ = *name;
      o.peak_tflops = DenseBf16PeakTflops(*name);
    }
  }
  m->worker_ = std::make_unique<WorkerMetrics>(*m->registry_, std::move(o));
  if (rank == 0) {
    std::printf("forge: metrics on http://%s:%d/metrics%s | MFU %s | GPU health %s\n",
                cfg.metrics.bind_address.c_str(), m->server_->port(),
                world > 1 && !any_port ? " (other ranks: port + local rank)" : "",
                m->peak_tflops() > 0.0
                    ? ("vs " + std::to_string(m->peak_tflops()) + " TFLOP/s (" + m->device_ + ")")
                          .c_str()
                    : "off (no peak for this device; set metrics.peak_tflops)",
                m->gpu_ ? "from NVML" : ("off: " + why).c_str());
    std::fflush(stdout);
  }
  if (any_port) {
    // The port this rank got, for whoever scrapes it (one line per rank, rank 0's too).
    std::printf("forge: rank %d serves /metrics on %s:%d\n", rank,
                cfg.metrics.bind_address.c_str(), m->server_->port());
    std::fflush(stdout);
  }
  return m;
}

std::unique_ptr<Comm> TrainMetrics::TimeCollectives(std::unique_ptr<Comm> comm,
                                                    CommWaitClock* clock) {
  if (!comm || std::strcmp(comm->name(), "nccl") == 0) return comm;
  return MakeTimedComm(std::move(comm), worker_.get(), clock);
}

std::function<void(const StepRecord&)> TrainMetrics::StepCallback(
    std::function<void(const StepRecord&)> next) {
  return [this, next = std::move(next)](const StepRecord& r) {
    worker_->ObserveStep(r);
    if (next) next(r);
  };
}

void TrainMetrics::Finish(std::string_view state) { (void)worker_->SetRunState(state); }

}  // namespace forge
