// `forge train CONFIG` launched alone (no mpirun / srun): the same machinery as a cluster, in
// one process. An in-process coordinator (state in <run_dir>/coordinator, listening on a free
// loopback port; the address and a fresh user token are written there so `forgectl
// --coordinator $(cat .../address) --token-file .../token watch RUN` can follow it) gets the
// run. One worker (one GPU, or the CPU with train.workers 1) trains it in this process. Several
// run as forge-worker processes of one launch group that this process supervises: with the
// CUDA backend and several visible GPUs (and a global batch that splits over them) one per GPU
// started by bash (NCCL ids relayed by the coordinator); on the CPU with train.workers > 1 the
// ranks of one `mpirun` ($PATH's, or FORGE_MPIRUN). When a rank is lost (killed, crashed) or
// the coordinator restarts the run (hang, heartbeat timeout) the group is replaced after a
// backoff (1 s doubling to 30 s) and the run resumes from its last committed checkpoint, at
// most train.max_restarts times; then it fails naming the rank and how it ended. On the CPU,
// with train.min_workers below the world, a group that cannot come back (it ends again before
// the run gains a checkpoint) is replaced by a smaller one the coordinator continues on, and a
// full group is retried beside it until the run grows back onto it.
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
