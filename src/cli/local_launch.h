// `forge train CONFIG` launched alone (no mpirun / srun): the same machinery as a cluster, in
// one process. An in-process coordinator (state in <run_dir>/coordinator, listening on a free
// loopback port; the address and a fresh user token are written there so `forgectl
// --coordinator $(cat .../address) --token-file .../token watch RUN` can follow it) gets the
// run, and one local worker joins it over gRPC and trains it with the engine. The CUDA backend
// trains on one GPU for now (the engine's multi-GPU NCCL step is not wired), so this is one
// worker: the GPU where one is visible, else the CPU.
#pragma once

#include <atomic>

#include "common/config.h"
#include "common/status.h"
#include "worker/train/process_run.h"
#include "worker/train/trainer.h"

namespace forge::cli {

// Trains cfg as described above. opt.stop_requested (the signal handler's flag), max_steps,
// on_step and print_progress are honoured as by TrainInProcessGroup.
StatusOr<ProcessRunResult> TrainWithLocalCoordinator(const RunConfig& cfg, const TrainOptions& opt);

}  // namespace forge::cli
