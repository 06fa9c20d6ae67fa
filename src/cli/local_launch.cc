#include "cli/local_launch.h"

#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <thread>
#include <vector>

#include "agent/worker_agent.h"
#include "common/file_io.h"
#include "coordinator/coordinator.h"
#include "coordinator/server.h"
#include "rpc/auth.h"
#include "worker/parallel/nccl_comm.h"
#include "worker/train/backend.h"

extern "C" char** environ;

namespace forge::cli {
namespace {

// One worker per visible GPU when the CUDA backend trains and the global batch splits over
// them; else one.
int LocalWorkers(const RunConfig& cfg) {
  const bool cuda = cfg.train.backend == Backend::kCuda ||
                    (cfg.train.backend == Backend::kAuto && CudaDeviceAvailable());
  const int gpus = cuda ? NcclVisibleDevices() : 0;
  if (gpus <= 1) return 1;
  const int64_t per_step = int64_t{cfg.batch.micro_batch} * gpus;
  if (cfg.batch.global_batch % per_step != 0) {
    std::fprintf(stderr,
                 "forge: %d GPUs visible, but batch.global_batch (%ld) is not a multiple of "
                 "micro_batch * %d: training on one GPU\n",
                 gpus, long(cfg.batch.global_batch), gpus);
    return 1;
  }
  return gpus;
}

// forge-worker processes for GPUs 1..n-1, in their own process group (a Ctrl-C reaches only
// `forge`, whose rank stops the run for all through the trainer's agreement).
StatusOr<std::vector<pid_t>> SpawnGpuWorkers(int n, const std::string& address,
                                             const std::string& secret, int64_t max_steps) {
  std::error_code ec;
  const std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe", ec);
  const std::string bin = (self.parent_path() / "forge-worker").string();
  if (ec || !std::filesystem::exists(bin))
    return Status::NotFound("forge-worker not found next to forge (" + bin + ")");
  std::vector<std::string> env_strings;
  for (char** e = environ; *e != nullptr; ++e)
    if (std::string(*e).rfind("FORGE_JOIN_SECRET=", 0) != 0) env_strings.push_back(*e);
  env_strings.push_back("FORGE_JOIN_SECRET=" + secret);
  std::vector<char*> envp;
  for (std::string& e : env_strings) envp.push_back(e.data());
  envp.push_back(nullptr);
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP);
  posix_spawnattr_setpgroup(&attr, 0);
  std::vector<pid_t> pids;
  Status failed;
  for (int gpu = 1; gpu < n && failed.ok(); ++gpu) {
    std::vector<std::string> args = {bin, "--coordinator", address, "--device",
                                     "cuda:" + std::to_string(gpu), "--max-placements", "1",
                                     "--give-up-after-s", "30", "--max-steps",
                                     std::to_string(max_steps)};
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    pid_t pid = 0;
    const int rc = posix_spawn(&pid, bin.c_str(), nullptr, &attr, argv.data(), envp.data());
    if (rc != 0) failed = Status::Unavailable("cannot start " + bin + ": " + std::strerror(rc));
    else pids.push_back(pid);
  }
  posix_spawnattr_destroy(&attr);
  if (!failed.ok()) {
    for (pid_t p : pids) {
      ::kill(p, SIGKILL);
      ::waitpid(p, nullptr, 0);
    }
    return failed;
  }
  return pids;
}

// Waits for the workers to end by themselves (they report and exit after the run); after
// `grace_s` the rest are killed.
void ReapWorkers(const std::vector<pid_t>& pids, double grace_s) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(int(grace_s * 1000));
  for (pid_t p : pids) {
    while (::waitpid(p, nullptr, WNOHANG) == 0) {
      if (std::chrono::steady_clock::now() > end) {
        ::kill(p, SIGKILL);
        ::waitpid(p, nullptr, 0);
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  }
}

}  // namespace

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
  spec.train.workers = LocalWorkers(cfg);
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
  // ao.serve_metrics stays on: this worker serves rank 0's /metrics (metrics.port) with the
  // coordinator's run id and the placement's rank and world, like every forge-worker.
  ao.print_progress = opt.print_progress;
  ao.stop_flag = opt.stop_requested;
  ao.max_steps = opt.max_steps;
  ao.on_step = opt.on_step;
  if (spec.train.workers > 1) ao.device = "cuda:0";
  StatusOr<ProcessRunResult> result = Status::Internal("the local worker was never placed");
  ao.on_result = [&](const StatusOr<ProcessRunResult>& r) { result = r; };
  // The other GPUs' workers join after this one, so this process is rank 0 (the scheduler
  // ranks standalone workers in join order): it prints and writes metrics.jsonl.
  std::vector<pid_t> children;
  Status spawned;
  std::atomic<bool> quit{false}, finished{false};
  ao.quit = &quit;
  // Without its other workers the run can never be placed: stop it and stop joining.
  auto give_up = [&](const Status& why) {
    spawned = why;
    quit.store(true);
    v1::StopRunRequest stop;
    stop.set_run_id(run.id());
    stop.set_immediate(true);
    v1::Run ignored;
    (void)coordinator->StopRun(stop, &ignored);
  };
  std::thread watcher;
  ao.on_joined = [&] {
    if (spec.train.workers <= 1) return;
    auto pids = SpawnGpuWorkers(spec.train.workers, address, so.join_secret, opt.max_steps);
    if (!pids.ok()) return give_up(pids.status());
    children = std::move(pids).value();
    watcher = std::thread([&] {
      while (!finished.load()) {
        for (pid_t p : children) {
          siginfo_t info{};
          // Exited? (left unreaped for ReapWorkers)
          if (::waitid(P_PID, id_t(p), &info, WEXITED | WNOHANG | WNOWAIT) == 0 &&
              info.si_pid == p && !finished.load()) {
            v1::GetRunRequest get;
            get.set_run_id(run.id());
            v1::Run now;
            (void)coordinator->GetRun(get, &now);
            if (now.state() == v1::PENDING)  // it died before the run was placed
              return give_up(Status::Unavailable("forge-worker pid " + std::to_string(p) +
                                                 " exited before the run started"));
          }
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(200));
      }
    });
  };
  const int rc = agent::RunWorkerAgent(ao);
  finished.store(true);
  if (watcher.joinable()) watcher.join();
  ReapWorkers(children, 30.0);
  server->Shutdown();
  coordinator->Shutdown();
  if (!spawned.ok()) return spawned.Annotate("starting the other GPUs' workers");
  if (rc != 0 && result.ok()) return Status::Internal("local worker exited with code " + std::to_string(rc));
  return result;
}

}  // namespace forge::cli
