#include "coordinator/server.h"

#include "common/file_io.h"
#include "forge/v1/runs.grpc.pb.h"
#include "forge/v1/workers.grpc.pb.h"
#include "rpc/auth.h"

namespace forge::coord {
namespace {

// An RPC method that checks the caller's bearer token against `key` (naming `api` when it is
// wrong), then hands the request to the Coordinator method of the same name.
#define FORGE_CHECKED_RPC(Method, Req, Resp, key, api)                                          \
  grpc::Status Method(grpc::ServerContext* ctx, const v1::Req* req, v1::Resp* resp) override { \
    if (grpc::Status a = rpc::CheckBearer(*ctx, key, api); !a.ok()) return a;                  \
    return c_->Method(*req, resp);                                                              \
  }

class RunServiceImpl final : public v1::RunService::Service {
 public:
  RunServiceImpl(Coordinator* c, std::string token) : c_(c), token_(std::move(token)) {}

#define FORGE_USER_RPC(Method, Req, Resp) FORGE_CHECKED_RPC(Method, Req, Resp, token_, "user API")
  FORGE_USER_RPC(SubmitRun, SubmitRunRequest, Run)
  FORGE_USER_RPC(StopRun, StopRunRequest, Run)
  FORGE_USER_RPC(ResumeRun, ResumeRunRequest, Run)
  FORGE_USER_RPC(CheckpointRun, CheckpointRunRequest, Run)
  FORGE_USER_RPC(GetRun, GetRunRequest, Run)
  FORGE_USER_RPC(ListRuns, ListRunsRequest, ListRunsResponse)
  FORGE_USER_RPC(ListCheckpoints, ListCheckpointsRequest, ListCheckpointsResponse)
  FORGE_USER_RPC(ExportCheckpoint, ExportCheckpointRequest, ExportCheckpointResponse)
  FORGE_USER_RPC(GetRunHistory, GetRunHistoryRequest, RunHistory)
  FORGE_USER_RPC(GetDataPlan, GetDataPlanRequest, DataPlan)
#undef FORGE_USER_RPC

  grpc::Status WatchRun(grpc::ServerContext* ctx, const v1::WatchRunRequest* req,
                        grpc::ServerWriter<v1::RunUpdate>* writer) override {
    if (grpc::Status a = rpc::CheckBearer(*ctx, token_, "user API"); !a.ok()) return a;
    return c_->WatchRun(
        *req, [&](const v1::RunUpdate& u) { return writer->Write(u); },
        [&] { return ctx->IsCancelled(); });
  }

 private:
  Coordinator* c_;
  std::string token_;
};

class WorkerServiceImpl final : public v1::WorkerService::Service {
 public:
  WorkerServiceImpl(Coordinator* c, std::string secret) : c_(c), secret_(std::move(secret)) {}

#define FORGE_WORKER_RPC(Method, Req, Resp) \
  FORGE_CHECKED_RPC(Method, Req, Resp, secret_, "worker API")
  FORGE_WORKER_RPC(Join, JoinRequest, JoinResponse)
  FORGE_WORKER_RPC(Heartbeat, HeartbeatRequest, HeartbeatResponse)
  FORGE_WORKER_RPC(CommitCheckpoint, CommitCheckpointRequest, CommitCheckpointResponse)
  FORGE_WORKER_RPC(ExchangeCommId, ExchangeCommIdRequest, ExchangeCommIdResponse)
#undef FORGE_WORKER_RPC

 private:
  Coordinator* c_;
  std::string secret_;
};

#undef FORGE_CHECKED_RPC

}  // namespace

struct CoordinatorServer::Services {
  RunServiceImpl runs;
  WorkerServiceImpl workers;
};

StatusOr<std::unique_ptr<CoordinatorServer>> CoordinatorServer::Start(const ServerOptions& o,
                                                                      Coordinator* coordinator) {
  if (o.user_token.empty()) return Status::Invalid("coordinator: a user token is required");
  if (o.join_secret.empty()) return Status::Invalid("coordinator: a join secret is required");
  if (rpc::ConstantTimeEquals(o.user_token, o.join_secret))
    return Status::Invalid("coordinator: the join secret must differ from the user token");
  std::unique_ptr<CoordinatorServer> s(new CoordinatorServer());
  s->services_.reset(new Services{RunServiceImpl(coordinator, o.user_token),
                                  WorkerServiceImpl(coordinator, o.join_secret)});
  std::shared_ptr<grpc::ServerCredentials> creds;
  if (!o.tls_cert_file.empty() || !o.tls_key_file.empty()) {
    if (o.tls_cert_file.empty() || o.tls_key_file.empty())
      return Status::Invalid("coordinator: TLS needs both --tls-cert and --tls-key");
    grpc::SslServerCredentialsOptions ssl;
    grpc::SslServerCredentialsOptions::PemKeyCertPair pair;
    FORGE_ASSIGN_OR_RETURN(pair.cert_chain, ReadSmallFile(o.tls_cert_file));
    FORGE_ASSIGN_OR_RETURN(pair.private_key, ReadSmallFile(o.tls_key_file));
    ssl.pem_key_cert_pairs.push_back(std::move(pair));
    creds = grpc::SslServerCredentials(ssl);
  } else {
    creds = grpc::InsecureServerCredentials();
  }
  grpc::ServerBuilder builder;
  builder.AddListeningPort(o.listen, creds, &s->port_);
  builder.RegisterService(&s->services_->runs);
  builder.RegisterService(&s->services_->workers);
  // Many idle watchers or workers must not starve the heartbeat path of threads.
  builder.SetSyncServerOption(grpc::ServerBuilder::SyncServerOption::MAX_POLLERS, 4);
  s->server_ = builder.BuildAndStart();
  if (!s->server_ || s->port_ == 0)
    return Status::Unavailable("coordinator: cannot listen on " + o.listen);
  return s;
}

CoordinatorServer::~CoordinatorServer() { Shutdown(); }

void CoordinatorServer::Wait() {
  if (server_) server_->Wait();
}

void CoordinatorServer::Shutdown() {
  if (server_) server_->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
}

}  // namespace forge::coord
