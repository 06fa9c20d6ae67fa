// Handing rank 0's NCCL unique id (128 opaque bytes) to every rank before ncclCommInitRank.
// A hook, so the coordinator can replace it (workers get the id from Join); two built in:
//   - MPI: MPI_Bcast from rank 0 (under mpirun / srun --mpi=pmix; MPI must be initialised);
//   - TCP: rank 0 listens on MASTER_ADDR:MASTER_PORT, the others connect (retrying until the
//     timeout) and receive the id; torchrun-style, for launches without MPI.
#pragma once

#include <array>
#include <memory>
#include <string>

#include "common/status.h"
#include "worker/parallel/bootstrap.h"

namespace forge {

using UniqueIdBytes = std::array<char, 128>;

class IdRendezvous {
 public:
  virtual ~IdRendezvous() = default;
  // Collective over all ranks: on rank 0 *id is the input, on the others the output.
  virtual Status Exchange(int rank, int world, UniqueIdBytes* id) = 0;
};

std::unique_ptr<IdRendezvous> MakeMpiRendezvous();

// Over a communicator the ranks already share (a broadcast from rank 0; `comm` must outlive
// the result): for a second NCCL communicator next to a first one.
std::unique_ptr<IdRendezvous> MakeCommRendezvous(class Comm* comm);

struct TcpRendezvousOptions {
  std::string host = "127.0.0.1";  // rank 0's address as the others reach it
  int port = 29500;
  double timeout_s = 300.0;  // how long to wait for the other side
};
// Options from MASTER_ADDR / MASTER_PORT (defaults above where unset).
StatusOr<TcpRendezvousOptions> TcpRendezvousOptionsFromEnv();
std::unique_ptr<IdRendezvous> MakeTcpRendezvous(const TcpRendezvousOptions& options);

// The built-in choice for a launch: MPI_Bcast under MPI (InitMpi() first), else TCP from
// MASTER_ADDR / MASTER_PORT with `timeout_s`. The coordinator passes its own hook instead.
StatusOr<std::unique_ptr<IdRendezvous>> RendezvousForLaunch(const LaunchInfo& launch,
                                                            double timeout_s);

}  // namespace forge
