// The NCCL unique-id exchange through the coordinator (worker/parallel/rendezvous.h's hook):
// rank 0 publishes its id with ExchangeCommId, the other ranks of the same placement poll until
// it is there. For GPU workers that share no launcher (Kubernetes, separate srun steps); a
// placement says so with Assignment.comm_id_from_coordinator.
#pragma once

#include <memory>
#include <string>

#include "worker/agent/coordinator_link.h"
#include "worker/parallel/rendezvous.h"

namespace forge::agent {

struct PlacementRef {
  std::string worker_id, run_id;
  int attempt = 0;
};

// `link` must outlive the result. Fetching ranks give up after timeout_s.
std::unique_ptr<IdRendezvous> MakeCoordinatorRendezvous(CoordinatorLink* link, PlacementRef ref,
                                                        double timeout_s = 300.0);

}  // namespace forge::agent
