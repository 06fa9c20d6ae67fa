// Placement: which idle workers take a run that needs N ranks. Pure function over the pool,
// so it is tested on its own.
//   - Workers launched together (one mpirun/srun: same LaunchGroup id, size > 1) share an MPI
//     communicator: they are placed only as a whole group of exactly N, rank = group rank.
//   - Workers launched alone (group size 1) are taken in join order and ranked by host, then GPU
//     index (rank r on the same GPU whichever worker joined first: a relaunched run sums in the
//     same order). N > 1 of them only when every one has a GPU (they build an NCCL
//     communicator from an id relayed by the coordinator); CPU workers train data-parallel
//     only over MPI.
#pragma once

#include <string>
#include <vector>

namespace forge::coord {

struct PoolWorker {
  std::string id;
  std::string device;     // "cpu" or "cuda:N"
  std::string group_id;   // "" when launched alone
  int group_rank = 0, group_size = 1;
  std::string host;
};

struct Placement {
  std::vector<std::string> worker_ids;  // by rank; empty: cannot place now
  bool comm_id_from_coordinator = false;
};

// A worker launched alone (not part of a launch group) with a GPU: what PlaceRun combines.
bool StandaloneGpu(const std::string& device, const std::string& group_id, int group_size);

// `idle` in join order.
Placement PlaceRun(const std::vector<PoolWorker>& idle, int world);

}  // namespace forge::coord
