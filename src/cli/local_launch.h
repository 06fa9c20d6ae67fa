// `forge train CONFIG` launched alone (no mpirun / srun): the same machinery as a cluster, in
// one process. An in-process coordinator (state in <run_dir>/coordinator, listening on a free
// loopback port; the address and a fresh user token are written there so `forgectl
// --coordinator $(cat .../address) --token-file .../token watch RUN` can follow it) gets the
// run, and a local worker in this process joins it over gRPC and trains it with the engine.
// With the CUDA backend and several visible GPUs (and a global batch that splits over them)
// the run is placed on one worker per GPU: this process (GPU 0, rank 0) plus a forge-worker
// process per other GPU, NCCL ids relayed by the coordinator. Otherwise one worker: the GPU
// where one is visible, else the CPU.
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
