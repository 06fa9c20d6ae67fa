#include "cli/local_launch.h"

#include <sys/stat.h>

#include <filesystem>

#include "agent/worker_agent.h"
#include "common/file_io.h"
#include "coordinator/coordinator.h"
#include "coordinator/server.h"
#include "rpc/auth.h"

namespace forge::cli {

StatusOr<ProcessRunResult> TrainWithLocalCoordinator(const RunConfig& cfg,
                                                     const TrainOptions& opt) {
  const std::string state_dir = cfg.train.run_dir + "/coordinator";
  std::error_code ec;
  std::filesystem::create_directories(state_dir, ec);
  if (ec) return Status::IoError("cannot create " + state_dir + ": " + ec.message());

  coord::CoordinatorOptions co;
  co.state_dir = state_dir;
  co.local_process = true;
  FORGE_ASSIGN_OR_RETURN(auto coordinator, coord::Coordinator::Open(co));

  coord::ServerOptions so;
  so.listen = "127.0.0.1:0";
  so.user_token = rpc::RandomSecret();
  so.join_secret = rpc::RandomSecret();
  FORGE_ASSIGN_OR_RETURN(auto server, coord::CoordinatorServer::Start(so, coordinator.get()));
  const std::string address = "127.0.0.1:" + std::to_string(server->port());
  FORGE_RETURN_IF_ERROR(WriteFileAtomic(state_dir + "/token", so.user_token + "\n"));
  ::chmod((state_dir + "/token").c_str(), 0600);
  FORGE_RETURN_IF_ERROR(WriteFileAtomic(state_dir + "/address", address + "\n"));

  RunConfig spec = cfg;
  spec.train.workers = 1;
  spec.train.max_restarts = 0;  // nobody would bring a lost local worker back
  v1::SubmitRunRequest submit;
  submit.set_spec_yaml(RunConfigToYaml(spec));
  submit.set_source(cfg.source_path.empty() ? "<config>" : cfg.source_path);
  v1::Run run;
  if (grpc::Status s = coordinator->SubmitRun(submit, &run); !s.ok())
    return Status::Invalid(s.error_message());

  agent::AgentOptions ao;
  ao.link.channel.address = address;
  ao.link.join_secret = so.join_secret;
  ao.link.give_up_after_s = 30.0;
  ao.max_placements = 1;
  ao.announce = false;
  ao.print_progress = opt.print_progress;
  ao.stop_flag = opt.stop_requested;
  ao.max_steps = opt.max_steps;
  ao.on_step = opt.on_step;
  StatusOr<ProcessRunResult> result = Status::Internal("the local worker was never placed");
  ao.on_result = [&](const StatusOr<ProcessRunResult>& r) { result = r; };
  const int rc = agent::RunWorkerAgent(ao);
  server->Shutdown();
  coordinator->Shutdown();
  if (rc != 0 && result.ok()) return Status::Internal("local worker exited with code " + std::to_string(rc));
  return result;
}

}  // namespace forge::cli
