// One process's part of a training run, between a RunConfig and RunTraining: joining the
// launcher's process group (MPI under mpirun / srun --mpi=pmix), opening the dataset, building
// this rank's batches, choosing the backend, creating the run directory and printing the
// header line. `forge train` (launched directly) and the worker agent (placed by a
// coordinator) both train through here.
#pragma once

#include <memory>
#include <string>

#include "common/config.h"
#include "common/status.h"
#include "worker/parallel/bootstrap.h"
#include "worker/parallel/comm.h"
#include "worker/train/trainer.h"

namespace forge {

// The data-parallel group this process belongs to (world 1 when launched alone).
struct ProcessGroup {
  LaunchInfo launch;
  std::unique_ptr<Comm> comm;  // null when alone
  int rank() const { return launch.rank; }
  int world() const { return launch.world; }
};

// Detects the launch and, under MPI, initialises it and builds an MpiComm with the config's
// collective timeout. A non-MPI launch of world > 1 is Unavailable (CPU data parallelism runs
// over MPI).
StatusOr<ProcessGroup> JoinProcessGroup(const RunConfig& cfg);

// cfg.data.dataset_dir, or $FORGE_DATA_DIR/dataset (the output of `forge data prepare`).
std::string DatasetDir(const RunConfig& cfg);

struct ProcessRunResult {
  TrainResult train;
  std::string metrics_path;       // rank 0: <run_dir>/metrics.jsonl; others ""
  double unigram_baseline = 0.0;  // validation cross-entropy of the unigram model
};

// Trains cfg on `group` (its comm goes into opt.comm). Rank 0 creates the run dir, writes
// metrics.jsonl and prints. opt.stop_requested, on_step etc. are the caller's.
StatusOr<ProcessRunResult> TrainInProcessGroup(const RunConfig& cfg, ProcessGroup* group,
                                               TrainOptions opt);

}  // namespace forge
