// `forge train CONFIG` launched alone (no mpirun / srun): the same machinery as a cluster, in
// one process. An in-process coordinator (state in <run_dir>/coordinator, listening on a free
// loopback port; the address and a fresh user token are written there so `forgectl
// --coordinator $(cat .../address) --token-file .../token watch RUN` can follow it) gets the
// run, and a local worker in this process joins it over gRPC and trains it with the engine.
// With the CUDA backend and several visible GPUs (and a global batch that splits over them)
// the run is placed on one worker per GPU: this process (GPU 0, rank 0) plus a forge-worker
// process per other GPU, NCCL ids relayed by the coordinator. Otherwise, on the CPU with
// train.workers > 1, every rank is a forge-worker process of one `mpirun` launch group ($PATH's,
// or FORGE_MPIRUN) that this process supervises: when a rank is lost (killed, crashed) or the
// coordinator restarts the run (hang, heartbeat timeout) the group is replaced after a backoff
// (1 s doubling to 30 s) and the run resumes from its last committed checkpoint, at most
// train.max_restarts times; then it fails naming the rank and how it ended. With
// train.min_workers below train.workers a group that cannot come back (it ends again before
// the run gains a checkpoint) is replaced by a smaller one the coordinator continues on, and a
// full group is retried beside it until the run grows back onto it. Otherwise one worker in
// this process: the GPU where one is visible, else the CPU.
#pragma once

#include <atomic>

#include "common/config.h"
#include "common/status.h"
#include "worker/run/process_run.h"
#include "worker/train/trainer.h"

namespace forge::cli {

// Trains cfg as described above. opt.stop_requested (the signal handler's flag), max_steps,
// on_step and print_progress are honoured as by TrainInProcessGroup.
StatusOr<ProcessRunResult> TrainWithLocalCoordinator(const RunConfig& cfg, const TrainOptions& opt);

}  // namespace forge::cli
