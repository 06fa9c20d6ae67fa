// A worker's connection to the coordinator: the WorkerService stub, its join secret, and
// calls that retry with backoff while the coordinator is unreachable (restarting), so a
// coordinator killed and restarted mid-run costs the workers a pause, not the run.
#pragma once

#include <memory>
#include <string>

#include "common/status.h"
#include "forge/v1/workers.grpc.pb.h"
#include "rpc/channel.h"

namespace forge::agent {

struct LinkOptions {
  rpc::ChannelOptions channel;
  std::string join_secret;
  double give_up_after_s = 300.0;  // how long a call keeps retrying an unreachable coordinator
};

class CoordinatorLink {
 public:
  static StatusOr<std::unique_ptr<CoordinatorLink>> Connect(const LinkOptions& options);

  Status Join(const v1::JoinRequest& req, v1::JoinResponse* out);
  Status Heartbeat(const v1::HeartbeatRequest& req, v1::HeartbeatResponse* out,
                   bool retry = true);
  Status CommitCheckpoint(const v1::CommitCheckpointRequest& req,
                          v1::CommitCheckpointResponse* out);
  Status ExchangeCommId(const v1::ExchangeCommIdRequest& req, v1::ExchangeCommIdResponse* out);

 private:
  template <typename Req, typename Resp, typename Fn>
  Status Call(const char* what, const Req& req, Resp* out, Fn method, bool retry,
              double call_timeout_s);

  LinkOptions opt_;
  std::unique_ptr<v1::WorkerService::Stub> stub_;
};

}  // namespace forge::agent
