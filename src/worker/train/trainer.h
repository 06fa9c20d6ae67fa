// The training loop: schedule, gradient accumulation, periodic evaluation and the progress
// line. It knows nothing about devices (a TrainBackend) or file formats (a BatchProvider), so
// the CLI, tests and benchmarks drive it alike.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "common/config.h"
#include "common/status.h"
#include "worker/train/backend.h"

namespace forge {

class Comm;  // worker/parallel/comm.h

// Fills one micro-batch ([micro_batch, seq_len] inputs and targets).
struct BatchProvider {
  // Micro-step k of the global batch that starts at global sequence `cursor`.
  std::function<Status(int64_t cursor, int micro_step, int32_t* inputs, int32_t* targets)> train;
  // The i-th validation micro-batch (fixed order).
  std::function<Status(int64_t index, int32_t* inputs, int32_t* targets)> val;
};

struct StepRecord {
  int64_t step = 0;
  float loss = 0.0f, grad_norm = 0.0f, lr = 0.0f;
  double tokens_per_s = 0.0, step_seconds = 0.0;
  float val_loss = -1.0f;  // < 0 when not evaluated at this step
};

struct TrainOptions {
  int64_t max_steps = -1;                 // < 0: schedule.total_steps
  bool print_progress = true;
  std::string metrics_path;               // JSON lines, one per logged step ("" = none)
  std::function<void(const StepRecord&)> on_step;  // called for every logged step
  // Data-parallel group (null: one process). The backend must train over the same Comm and
  // `data.train` must return this rank's slice (FillTrainBatch with rank/world). Each rank
  // then runs global_batch / (micro_batch * world) micro-steps; losses are global, so every
  // rank sees the same records; only rank 0 prints and writes metrics.
  Comm* comm = nullptr;
};

struct TrainResult {
  int64_t steps = 0;
  float first_loss = 0.0f, final_train_loss = 0.0f;
  float initial_val_loss = 0.0f, final_val_loss = 0.0f;
  double tokens_per_s = 0.0;    // over the whole run, excluding evaluation
  double seconds = 0.0;
};

// Initialises the parameters from cfg.seed and trains for the configured steps.
StatusOr<TrainResult> RunTraining(const RunConfig& cfg, TrainBackend* backend,
                                  const BatchProvider& data, const TrainOptions& opt);

// Mean validation loss over cfg.eval.batches micro-batches. With a Comm (collective) rank r
// evaluates batches r, r+W, ... and every rank returns the same mean.
StatusOr<float> Evaluate(const RunConfig& cfg, TrainBackend* backend, const BatchProvider& data,
                         Comm* comm = nullptr);

}  // namespace forge
