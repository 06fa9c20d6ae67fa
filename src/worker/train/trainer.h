// The training loop: schedule, gradient accumulation, periodic evaluation, checkpoints (save,
// resume, stop on request) and the progress line. It knows nothing about devices (a
// TrainBackend) or file formats (a BatchProvider), so the CLI, tests and benchmarks drive it
// alike.
//
// Checkpoints (trainer_checkpoint.h, worker/checkpoint/): with checkpoint.every_steps > 0 the
// state after every such step and after the last one is saved under CheckpointRoot(cfg),
// written in the background and committed at a later step boundary once every rank wrote. A
// stop request saves at the next step boundary and returns. With checkpoint.resume set the run
// continues from a checkpoint (any world size and mode): step, data cursor, weights and moments
// are restored, so with the same world size the run is bitwise the uninterrupted one.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "common/config.h"
#include "common/status.h"
#include "worker/data/data_plan.h"
#include "worker/train/backend.h"

namespace forge {

class Comm;  // worker/parallel/comm.h
struct ShardReport;  // worker/checkpoint/checkpoint_writer.h

// Fills one micro-batch ([micro_batch, seq_len] inputs and targets).
struct BatchProvider {
  // Micro-step k of the global batch that starts at global sequence `cursor`.
  std::function<Status(int64_t cursor, int micro_step, int32_t* inputs, int32_t* targets)> train;
  // The i-th validation micro-batch (fixed order).
  std::function<Status(int64_t index, int32_t* inputs, int32_t* targets)> val;
  // Optional (data mixtures, data_plan.h). Called on every rank once before the first step,
  // after any resume, with the checkpoint resumed ("" for a fresh start), its data record (null
  // for a fresh start or a checkpoint that has none) and the global cursor: it fixes the data
  // plan `train` draws by. What it says into `notes` rank 0 prints as warnings.
  std::function<Status(const std::string& resumed_dir, const DataUsage* saved, int64_t cursor,
                       std::vector<std::string>* notes)>
      start;
  // Optional: what each source has given at a global cursor; every checkpoint records it.
  std::function<DataUsage(int64_t cursor)> usage;
};

// One eval.samples prompt and the model's greedy completion at an eval step.
struct EvalSample {
  std::string prompt, completion;
};

struct StepRecord {
  int64_t step = 0;
  float loss = 0.0f, grad_norm = 0.0f, lr = 0.0f;
  double tokens_per_s = 0.0, step_seconds = 0.0;
  float val_loss = -1.0f;  // < 0 when not evaluated at this step
  // The validation loss before step 1, on every record of a run that started fresh and
  // evaluated then (< 0 on a resumed one): whichever record reaches the coordinator carries it.
  float initial_val_loss = -1.0f;
  // The checkpoints committed since the previous record (checkpoint_step < 0: none): the
  // newest one's step, and over all of them the longest stall of a rank's loop while taking
  // them (summed), the slowest rank's background writes (summed), and the bytes of all shards
  // / that write time. Usually one; two when a save's write outlasted the steps to the next
  // save and both committed between two records.
  int64_t checkpoint_step = -1;
  int checkpoints_committed = 0;
  double checkpoint_blocked_s = 0.0, checkpoint_write_s = 0.0;
  uint64_t checkpoint_bytes = 0;
  double checkpoint_bytes_per_s = 0.0;
  // For metrics (src/metrics/): how many steps this record's averages cover (those since the
  // previous record) and the time the loop spent fetching their batches.
  int64_t window_steps = 0;
  double data_wait_seconds = 0.0;
  // Device memory of a CUDA backend at this record, in bytes (0 on the CPU backend): its own
  // buffers (allocated; reserved is the same number, as it keeps no caching allocator) and the
  // high-water mark of the device memory it uses, library workspaces included (peak).
  int64_t gpu_allocated_bytes = 0, gpu_reserved_bytes = 0, gpu_peak_bytes = 0;
  // Optimizer steps skipped so far in this process (non-finite loss or gradients, and loss
  // spikes).
  int64_t skipped_steps = 0;
  // At eval steps of a run with eval.samples (rank 0): the prompts' completions.
  std::vector<EvalSample> samples;
  // Loss spikes (spike_guard.h): this step's update was skipped as one; the spikes and the
  // rollbacks so far in this process; the global data cursor the step read at.
  bool loss_spike = false;
  int64_t loss_spikes = 0, spike_rollbacks = 0;
  int64_t data_cursor = 0;
  // Set when this step's spike was the spike_max_in_row-th in a row: the run went back to the
  // checkpoint of rollback_to_step (its own state when there was none to load: -1) and leaves
  // out the data cursors [skip_from, skip_to). The next record is of step rollback_to_step + 1.
  bool rollback = false;
  int64_t rollback_to_step = -1, skip_from = 0, skip_to = 0;
  // What happened, in words, when the step was a spike (and then a rollback): rank 0
  // forwards each line to the coordinator as a run event. Empty otherwise.
  std::vector<std::string> events;
};

struct TrainOptions {
  int64_t max_steps = -1;                 // < 0: schedule.total_steps
  bool print_progress = true;
  // JSON lines, one per logged step ("" = none). A fresh run truncates the file; a resumed one
  // keeps the records up to the step it resumes from and appends.
  std::string metrics_path;
  std::function<void(const StepRecord&)> on_step;  // called for every logged step
  // Optional (eval.samples): called on every rank at each eval step with the backend, after
  // the validation loss; completes the prompts from the current weights (rank 0's answer goes
  // into the record; the others may return nothing). Reading the weights may be collective.
  std::function<StatusOr<std::vector<EvalSample>>(TrainBackend*)> eval_samples;
  // Advances by one as each optimizer step finishes, logged or not, from the step the run
  // started at: the last step finished, unless a spike rollback replayed steps, after which it
  // keeps counting up (the worker agent's heartbeats carry it: the coordinator's hang
  // detection watches every rank's progress advance).
  std::atomic<int64_t>* step_done = nullptr;
  // Data-parallel group (null: one process). The backend must train over the same Comm and
  // `data.train` must return this rank's slice (FillTrainBatch with rank/world). Each rank
  // then runs global_batch / (micro_batch * world) micro-steps; losses are global, so every
  // rank sees the same records; only rank 0 prints and writes metrics.
  Comm* comm = nullptr;
  // When it turns true (e.g. from a SIGTERM handler), the trainer saves a checkpoint at the
  // next step boundary and returns (TrainResult::stopped). Ranks agree on it with a small
  // collective per step, so a signal that reaches one rank stops all; set it on every rank or
  // on none.
  std::atomic<bool>* stop_requested = nullptr;
  // When it turns true, a checkpoint is saved at the next step boundary and training goes on
  // (the flag is cleared). Agreed over the ranks like stop_requested; set it on every rank.
  std::atomic<bool>* checkpoint_requested = nullptr;
  // Under a coordinator: every rank hands its written shard's report to this hook instead of
  // rank 0 writing manifest.json and applying retention; the coordinator does both once every
  // rank has reported. The hook returns once this rank's report is recorded; the ranks then
  // agree on the outcome, so when a commit returns the manifest is written.
  std::function<Status(const ShardReport&)> report_shard;
  // Under a coordinator: the data plan it scheduled for this placement, and the checkpoint
  // whose cursors it holds ("" = the start of the run). TrainInProcessGroup trains by it when
  // the run starts from that point (checking it against the checkpoint's own data record), and
  // derives the plan from the checkpoint when the worker resumed another one itself.
  std::optional<DataPlan> data_plan;
  std::string data_plan_checkpoint;
};

struct TrainResult {
  int64_t steps = 0;            // the last step completed (global: counts resumed steps)
  float first_loss = 0.0f, final_train_loss = 0.0f;
  float initial_val_loss = 0.0f;  // < 0 when resumed (no evaluation before the first step)
  float final_val_loss = 0.0f;
  double tokens_per_s = 0.0;    // over the steps this run trained, excluding evaluation
  double seconds = 0.0;
  std::string resumed_from;     // the checkpoint loaded ("" = fresh start)
  int64_t resumed_step = 0;
  bool stopped = false;         // ended early on stop_requested
  std::vector<int64_t> checkpoints;     // steps committed by this run
  double checkpoint_blocked_s = 0.0;    // summed over its saves (slowest rank each)
  std::vector<std::string> warnings;    // rank 0: resume fallbacks, retention failures
  int64_t skipped_steps = 0;           // optimizer steps skipped (non-finite or spikes)
  int64_t loss_spikes = 0;             // of those, loss spikes (spike_guard.h)
  int64_t spike_rollbacks = 0;         // rollbacks after spike_max_in_row spikes in a row
};

// Initialises the parameters from cfg.seed (or resumes, see above) and trains for the
// configured steps.
StatusOr<TrainResult> RunTraining(const RunConfig& cfg, TrainBackend* backend,
                                  const BatchProvider& data, const TrainOptions& opt);

// Mean validation loss over cfg.eval.batches micro-batches. With a Comm (collective) rank r
// evaluates batches r, r+W, ... and every rank returns the same mean.
StatusOr<float> Evaluate(const RunConfig& cfg, TrainBackend* backend, const BatchProvider& data,
                         Comm* comm = nullptr);

}  // namespace forge
