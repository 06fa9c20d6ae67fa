// The training backend: what the trainer needs from a device. One implementation per device
// kind (CPU float32 reference, CUDA BF16); the trainer, tests and benchmarks drive either.
// A backend owns the parameters (master weights), AdamW moments and its activations.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/config.h"
#include "common/status.h"
#include "worker/model/param_layout.h"
#include "worker/model/unit_buffers.h"

namespace forge {

class Comm;  // worker/parallel/comm.h

// One micro-batch: host token arrays [micro_batch, seq_len].
struct MicroBatch {
  const int32_t* inputs = nullptr;
  const int32_t* targets = nullptr;
};

// Loss-spike limits for one step (worker/train/spike_guard.h); infinite: none.
struct SpikeLimits {
  float loss = std::numeric_limits<float>::infinity();
  float grad_norm = std::numeric_limits<float>::infinity();
  bool any() const { return std::isfinite(loss) || std::isfinite(grad_norm); }
  // The backend's and the trainer's one test: a finite step above either limit.
  bool Exceeded(float step_loss, float step_grad_norm) const {
    return step_loss > loss || step_grad_norm > grad_norm;
  }
};

struct StepHyper {
  StepHyper() = default;
  StepHyper(float lr_, int64_t step_) : lr(lr_), step(step_) {}
  float lr = 0.0f;
  int64_t step = 1;  // 1-based optimizer step (AdamW bias correction)
  // A backend whose SkipsAboveLimits() is true skips the update of a step whose global loss
  // or gradient norm exceeds these, as it skips a non-finite one (and counts it in
  // StepStats::skipped_steps).
  SpikeLimits skip_above;
};

struct StepStats {
  float loss = 0.0f;       // mean over the step's micro-batches
  float grad_norm = 0.0f;  // global L2 norm before clipping
  bool valid = false;      // false when the backend skipped reading them (no sync)
  // Optimizer steps skipped so far because the gradients were not finite (an overflowed
  // step: weights and moments left as they were); cumulative, so steps between two reads
  // are counted too.
  int64_t skipped_steps = 0;
};

class TrainBackend {
 public:
  virtual ~TrainBackend() = default;
  virtual const char* name() const = 0;

  // Replaces the master weights (fp32, one buffer per unit) and zeroes the moments.
  virtual Status SetParams(const UnitBuffers& master) = 0;
  virtual Status GetParams(UnitBuffers* master) = 0;
  // AdamW moments, for checkpoints.
  virtual Status GetMoments(UnitBuffers* m, UnitBuffers* v) = 0;
  virtual Status SetMoments(const UnitBuffers& m, const UnitBuffers& v) = 0;

  // One optimizer step: forward+backward over every micro-batch (gradients accumulated,
  // each weighted 1/micro.size()), global-norm clipping, AdamW. With want_stats=false a
  // device backend need not synchronise with the host.
  virtual Status TrainStep(const std::vector<MicroBatch>& micro, const StepHyper& hyper,
                           bool want_stats, StepStats* stats) = 0;

  // Backend state beyond weights and moments that an exact resume needs (the CUDA backend's
  // FP8 scaling histories), as named opaque blobs for the checkpoint (TrainerState::extra).
  // Between steps only. SetExtraState ignores names it does not know and fails, changing
  // nothing, on a blob it cannot take (the caller may then continue without it).
  virtual Status GetExtraState(std::map<std::string, std::string>* blobs) {
    (void)blobs;
    return Status::Ok();
  }
  virtual Status SetExtraState(const std::map<std::string, std::string>& blobs) {
    (void)blobs;
    return Status::Ok();
  }

  // Whether TrainStep honours StepHyper::skip_above (it then needs no more than the step's
  // own global loss and gradient norm, which it has before the update).
  virtual bool SkipsAboveLimits() const { return false; }

  // Mean loss of one micro-batch, no gradients.
  virtual Status EvalLoss(const MicroBatch& batch, float* loss) = 0;
  // Called by every rank before a round of EvalLoss calls (even a rank with no batch of its
  // own): a sharded backend (fsdp) gathers its parameters here, so EvalLoss needs no
  // collective and ranks may evaluate different numbers of batches.
  virtual Status BeginEval() { return Status::Ok(); }
  // True when every EvalLoss call is itself collective (the CUDA backend's fsdp gathers the
  // parameters inside each pass): every rank must then make the same number of calls, so
  // Evaluate gives ranks with fewer batches extra passes whose losses it drops.
  virtual bool EvalIsCollective() const { return false; }

  // Gradients (fp32, per unit) of the mean loss over `micro` (as TrainStep would apply them,
  // before clipping), without updating anything. For tests against the CPU reference.
  virtual Status ComputeGradients(const std::vector<MicroBatch>& micro, UnitBuffers* grads,
                                  float* loss) = 0;
};

// The CPU float32 reference backend. With a Comm (world W; must outlive the backend) it trains
// data-parallel in cfg.parallel.mode; TrainStep's micro-batches are then this rank's slice
// (global_batch / (micro_batch * W) of them) and its stats are global. TrainStep,
// ComputeGradients, BeginEval, and GetParams (fsdp) / GetMoments (zero1, zero2, fsdp) are
// collective: every rank calls them in the same order.
std::unique_ptr<TrainBackend> MakeCpuBackend(const RunConfig& cfg, Comm* comm = nullptr);

// The CUDA backend on the current device (nullptr + error when CUDA is not built in or no
// device is visible); data-parallel over `comm` (an NcclComm) when its world is > 1.
StatusOr<std::unique_ptr<TrainBackend>> MakeCudaBackend(const RunConfig& cfg,
                                                        Comm* comm = nullptr);
bool CudaDeviceAvailable();
// Free memory of the current CUDA device in bytes; < 0 without CUDA or when it cannot be read.
double CudaFreeDeviceMemoryBytes();

}  // namespace forge
