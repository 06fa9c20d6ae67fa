// A config's training step on one GPU, on random tokens over the model's vocabulary (as the
// anchors draw them: torch.randint(0, V)), as forge-bench and forge-calibrate run and time it.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <random>
#include <vector>

#include "bench_profile.h"
#include "common/config.h"
#include "common/status.h"
#include "worker/train/cuda_backend.h"

namespace forge::bench {

class BenchStep {
 public:
  // The backend as `options` set it; one micro-batch of cfg.batch.micro_batch sequences.
  static StatusOr<std::unique_ptr<BenchStep>> Make(const RunConfig& cfg,
                                                   const CudaBackendOptions& options) {
    auto made = MakeCudaTrainBackend(cfg, options);
    if (!made.ok()) return made.status();
    std::unique_ptr<BenchStep> s(new BenchStep);
    s->cfg_ = cfg;
    s->backend_ = std::move(made).value();
    const int64_t n = s->tokens();
    std::mt19937_64 rng(cfg.seed);
    std::uniform_int_distribution<int32_t> tok(0, cfg.model.vocab - 1);
    s->inputs_.resize(size_t(n));
    s->targets_.resize(size_t(n));
    for (auto& t : s->inputs_) t = tok(rng);
    for (auto& t : s->targets_) t = tok(rng);
    s->micro_ = {{s->inputs_.data(), s->targets_.data()}};
    return s;
  }

  int64_t tokens() const { return int64_t{cfg_.batch.micro_batch} * cfg_.model.seq_len; }
  CudaTrainBackend& backend() { return *backend_; }

  // One optimizer step (the first captures the CUDA graph where the config asks for one).
  Status Train(bool want_stats, StepStats* stats) {
    return backend_->TrainStep(micro_, StepHyper{cfg_.optimizer.lr, ++step_}, want_stats, stats);
  }

  // The mean time of `steps` steps back to back, between events on the compute stream.
  StatusOr<double> MeanStepMs(int steps) {
    cudaStream_t stream = static_cast<cudaStream_t>(backend_->compute_stream());
    cudaEvent_t start, stop;
    if (cudaEventCreate(&start) != cudaSuccess) return Status::Internal("cudaEventCreate failed");
    if (cudaEventCreate(&stop) != cudaSuccess) {
      cudaEventDestroy(start);
      return Status::Internal("cudaEventCreate failed");
    }
    Status st = cudaEventRecord(start, stream) == cudaSuccess
                    ? Status::Ok()
                    : Status::Internal("cudaEventRecord failed");
    for (int i = 0; i < steps && st.ok(); ++i) st = Train(false, nullptr);
    float total_ms = 0.0f;
    if (st.ok() && (cudaEventRecord(stop, stream) != cudaSuccess ||
                    cudaEventSynchronize(stop) != cudaSuccess ||
                    cudaEventElapsedTime(&total_ms, start, stop) != cudaSuccess))
      st = Status::Internal("timing events failed");
    cudaEventDestroy(start);
    cudaEventDestroy(stop);
    if (!st.ok()) return st;
    return double(total_ms) / steps;
  }

  // The per-phase profile of eager single-stream steps (bench_profile.h).
  StatusOr<PhaseTimes> Profile(int steps = 3) {
    return ProfilePhases(*backend_, micro_, cfg_.optimizer.lr, &step_, steps);
  }

 private:
  BenchStep() = default;
  RunConfig cfg_;
  std::unique_ptr<CudaTrainBackend> backend_;
  std::vector<int32_t> inputs_, targets_;
  std::vector<MicroBatch> micro_;
  int64_t step_ = 0;
};

}  // namespace forge::bench
