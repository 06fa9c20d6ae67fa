#include "worker/agent/coordinator_link.h"

#include "rpc/auth.h"

namespace forge::agent {

StatusOr<std::unique_ptr<CoordinatorLink>> CoordinatorLink::Connect(const LinkOptions& options) {
  auto link = std::unique_ptr<CoordinatorLink>(new CoordinatorLink());
  link->opt_ = options;
  FORGE_ASSIGN_OR_RETURN(auto channel, rpc::MakeChannel(options.channel));
  link->stub_ = v1::WorkerService::NewStub(channel);
  return link;
}

template <typename Req, typename Resp, typename Fn>
Status CoordinatorLink::Call(const char* what, const Req& req, Resp* out, Fn method, bool retry,
                             double call_timeout_s) {
  rpc::RetryPolicy policy;
  policy.give_up_after_s = retry ? opt_.give_up_after_s : 0.0;
  policy.call_timeout_s = call_timeout_s;
  grpc::Status s = rpc::CallWithRetry(policy, [&](std::chrono::system_clock::time_point deadline) {
    grpc::ClientContext ctx;
    ctx.set_deadline(deadline);
    rpc::AddBearer(&ctx, opt_.join_secret);
    out->Clear();
    return (stub_.get()->*method)(&ctx, req, out);
  });
  return rpc::FromGrpc(s, std::string(what) + " (coordinator " + opt_.channel.address + ")");
}

Status CoordinatorLink::Join(const v1::JoinRequest& req, v1::JoinResponse* out) {
  return Call("Join", req, out, &v1::WorkerService::Stub::Join, true, 10.0);
}

Status CoordinatorLink::Heartbeat(const v1::HeartbeatRequest& req, v1::HeartbeatResponse* out,
                                  bool retry) {
  return Call("Heartbeat", req, out, &v1::WorkerService::Stub::Heartbeat, retry, 5.0);
}

Status CoordinatorLink::CommitCheckpoint(const v1::CommitCheckpointRequest& req,
                                         v1::CommitCheckpointResponse* out) {
  // The last rank's call writes the manifest (fsyncs): a longer deadline.
  return Call("CommitCheckpoint", req, out, &v1::WorkerService::Stub::CommitCheckpoint, true,
              60.0);
}

Status CoordinatorLink::ExchangeCommId(const v1::ExchangeCommIdRequest& req,
                                       v1::ExchangeCommIdResponse* out) {
  return Call("ExchangeCommId", req, out, &v1::WorkerService::Stub::ExchangeCommId, true, 10.0);
}

}  // namespace forge::agent
