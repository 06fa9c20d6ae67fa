// Where this process sits in the job: rank, world size and local rank (the GPU index on its
// node), read from the launcher's environment in this order:
//   1. MPI: launched by mpirun (OMPI_COMM_WORLD_*) or srun --mpi=pmix (PMIX_RANK + Slurm vars);
//      the communicator then comes from MPI itself (MPI_Init).
//   2. Slurm without MPI: SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID.
//   3. torchrun style: RANK, WORLD_SIZE, LOCAL_RANK.
//   4. Nothing: one process (rank 0 of 1).
#pragma once

#include <string>

#include "common/status.h"

namespace forge {

enum class LaunchKind { kSingle, kMpi, kSlurm, kTorchrun };
const char* LaunchKindName(LaunchKind k);

struct LaunchInfo {
  LaunchKind kind = LaunchKind::kSingle;
  int rank = 0;
  int world = 1;
  int local_rank = 0;
};

// Reads the variables above through `getenv` (tests pass their own). Errors name the variable
// (not an integer, rank outside [0, world)).
using GetEnvFn = const char* (*)(const char*);
StatusOr<LaunchInfo> DetectLaunch(GetEnvFn getenv_fn = nullptr);

}  // namespace forge
