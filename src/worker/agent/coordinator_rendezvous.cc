#include "worker/agent/coordinator_rendezvous.h"

#include <chrono>
#include <thread>

namespace forge::agent {
namespace {

class CoordinatorRendezvous final : public IdRendezvous {
 public:
  CoordinatorRendezvous(CoordinatorLink* link, PlacementRef ref, double timeout_s)
      : link_(link), ref_(std::move(ref)), timeout_s_(timeout_s) {}

  Status Exchange(int rank, int world, UniqueIdBytes* id) override {
    v1::ExchangeCommIdRequest req;
    req.set_worker_id(ref_.worker_id);
    req.set_run_id(ref_.run_id);
    req.set_attempt(ref_.attempt);
    req.set_rank(rank);
    if (rank == 0) req.set_comm_id(std::string(id->data(), id->size()));
    const auto start = std::chrono::steady_clock::now();
    for (;;) {
      v1::ExchangeCommIdResponse resp;
      FORGE_RETURN_IF_ERROR(link_->ExchangeCommId(req, &resp));
      if (resp.ready()) {
        if (resp.comm_id().size() != id->size())
          return Status::DataLoss("communicator id of " + std::to_string(resp.comm_id().size()) +
                                  " bytes, expected " + std::to_string(id->size()));
        std::copy(resp.comm_id().begin(), resp.comm_id().end(), id->begin());
        return Status::Ok();
      }
      if (std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() >
          timeout_s_)
        return Status::Unavailable("rank " + std::to_string(rank) + " of " +
                                   std::to_string(world) + ": rank 0 published no "
                                   "communicator id within " + std::to_string(timeout_s_) + " s");
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  }

 private:
  CoordinatorLink* link_;
  PlacementRef ref_;
  double timeout_s_;
};

}  // namespace

std::unique_ptr<IdRendezvous> MakeCoordinatorRendezvous(CoordinatorLink* link, PlacementRef ref,
                                                        double timeout_s) {
  return std::make_unique<CoordinatorRendezvous>(link, std::move(ref), timeout_s);
}

}  // namespace forge::agent
