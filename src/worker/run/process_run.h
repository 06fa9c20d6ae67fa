// One process's part of a training run, between a RunConfig and RunTraining: joining the
// launcher's process group (MPI under mpirun / srun --mpi=pmix), opening the dataset, building
// this rank's batches, choosing the backend, creating the run directory and printing the
// header line. `forge train` (launched directly) and the worker agent (placed by a
// coordinator) both train through here.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "common/config.h"
#include "common/status.h"
#include "worker/data/run_sources.h"
#include "worker/parallel/bootstrap.h"
#include "worker/parallel/comm.h"
#include "worker/parallel/nccl_comm.h"
#include "worker/parallel/rendezvous.h"
#include "worker/train/trainer.h"

namespace forge {

// The data-parallel group this process belongs to (world 1 when launched alone).
struct ProcessGroup {
  LaunchInfo launch;
  // GPU data parallelism: the backend's NCCL communicator (null otherwise). Declared before
  // `comm`, which may stage through it, so it is destroyed after.
  std::unique_ptr<NcclComm> nccl;
  std::unique_ptr<NcclComm> host_nccl;  // a second communicator: carries `comm`'s collectives
  std::unique_ptr<Comm> comm;  // the trainer's host collectives; null when alone
  int rank() const { return launch.rank; }
  int world() const { return launch.world; }
};

// Detects the launch. CPU: under MPI, initialises it and builds an MpiComm with the config's
// collective timeout; a non-MPI launch of world > 1 is Unavailable (CPU data parallelism runs
// over MPI). CUDA (train.backend cuda, or auto with a GPU) with world > 1: an NcclComm on the
// local rank's GPU plus a host-staged comm over it, the NCCL id handed over by `rendezvous`
// (the coordinator's), else MPI_Bcast under MPI, else TCP from MASTER_ADDR / MASTER_PORT.
StatusOr<ProcessGroup> JoinProcessGroup(const RunConfig& cfg, IdRendezvous* rendezvous = nullptr);

// A group the coordinator formed from workers that share no launcher (one process per GPU,
// e.g. Kubernetes pods): rank and world come from the placement, the GPU from
// placed.local_rank, the NCCL unique id through `rendezvous` (the coordinator's ExchangeCommId,
// worker/agent/coordinator_rendezvous.h). Needs the CUDA backend when world > 1 (CPU ranks train
// together over MPI only): Unavailable otherwise.
StatusOr<ProcessGroup> JoinPlacedGroup(const RunConfig& cfg, const LaunchInfo& placed,
                                       IdRendezvous* rendezvous);

struct ProcessRunResult {
  TrainResult train;
  std::string metrics_path;       // rank 0: <run_dir>/metrics.jsonl; others ""
  double unigram_baseline = 0.0;  // validation cross-entropy of the unigram model
};

// Trains cfg on `group` (its comm goes into opt.comm). Rank 0 creates the run dir, writes
// metrics.jsonl and prints. opt.stop_requested, on_step etc. are the caller's. The batches come
// from a TrainMixture over the run's sources (or opt.data_plan's), its plan fixed at start
// (BatchProvider::start) and recorded in every checkpoint (BatchProvider::usage).
StatusOr<ProcessRunResult> TrainInProcessGroup(const RunConfig& cfg, ProcessGroup* group,
                                               TrainOptions opt);

}  // namespace forge
