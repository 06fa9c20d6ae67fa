#include "worker/agent/worker_agent.h"

#include <mpi.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <memory>
#include <mutex>
#include <random>
#include <string_view>
#include <thread>
#include <vector>

#include "worker/agent/coordinator_rendezvous.h"
#include "worker/agent/restart_on_abort.h"
#include "common/config.h"
#include "metrics/gpu_health.h"
#include "metrics/timed_comm.h"
#include "metrics/train_metrics.h"
#include "worker/checkpoint/checkpoint_writer.h"
#include "worker/parallel/bootstrap.h"
#include "worker/parallel/mpi_comm.h"
#include "worker/run/process_run.h"
#include "worker/train/backend.h"

namespace forge::agent {
namespace {

std::string HostName() {
  char buf[256] = {};
  gethostname(buf, sizeof buf - 1);
  return buf;
}

// N of "cuda:N" (0 otherwise): the GPU a standalone worker trains on.
int DeviceIndex(const std::string& device) {
  const size_t colon = device.find(':');
  return colon == std::string::npos ? 0 : std::atoi(device.c_str() + colon + 1);
}

std::string RandomHex(int n) {
  std::random_device rd;
  std::string out;
  for (int i = 0; i < n; ++i) out += "0123456789abcdef"[rd() & 15];
  return out;
}

// Who this process is: its launch group and a unique worker id.
struct Identity {
  LaunchInfo launch;
  std::string worker_id, host, device;
  std::string device_name;  // the GPU's product name ("" on cpu): the coordinator's MFU peak
  v1::LaunchGroup group;
};

StatusOr<Identity> Identify(const AgentOptions& o) {
  Identity id;
  FORGE_ASSIGN_OR_RETURN(id.launch, DetectLaunch());
  id.host = HostName();
  id.worker_id = id.host + ":" + std::to_string(getpid()) + ":" + RandomHex(6);
  id.device = o.device;
  if (id.device.empty())
    id.device = CudaDeviceAvailable() ? "cuda:" + std::to_string(id.launch.local_rank) : "cpu";
  if (id.device.rfind("cuda", 0) == 0) id.device_name = GpuProductName(DeviceIndex(id.device));
  id.group.set_size(1);
  if (id.launch.kind == LaunchKind::kMpi) {
    FORGE_RETURN_IF_ERROR(InitMpi());
    int rank = 0, world = 1;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    // One id for the whole launch, chosen by rank 0.
    char gid[64] = {};
    if (rank == 0) std::snprintf(gid, sizeof gid, "%s", (id.worker_id + "/mpi").c_str());
    MPI_Bcast(gid, sizeof gid, MPI_CHAR, 0, MPI_COMM_WORLD);
    id.group.set_id(gid);
    id.group.set_rank(rank);
    id.group.set_size(world);
    id.launch.rank = rank;
    id.launch.world = world;
  } else if (id.launch.world > 1) {
    return Status::Unavailable("forge-worker launched as rank " + std::to_string(id.launch.rank) +
                               " of " + std::to_string(id.launch.world) + " by " +
                               LaunchKindName(id.launch.kind) +
                               " variables: CPU workers train together over MPI (mpirun or srun "
                               "--mpi=pmix); start GPU workers one per process without them");
  }
  return id;
}

// Rank 0's unsent step records kept for the next heartbeat (HeartbeatRequest.earlier_metrics).
constexpr size_t kMaxBacklog = 512;

// What the heartbeat thread sends and what it was told.
struct Progress {
  std::mutex mu;
  std::condition_variable wake;
  bool have_new = false;
  v1::StepMetrics latest;
  std::vector<v1::StepMetrics> backlog;  // rank 0: logged before `latest`, not yet sent
  std::vector<std::string> events;        // rank 0: trainer events not yet sent
  bool done = false;
};

class Placement {
 public:
  Placement(CoordinatorLink* link, const Identity& id, const v1::Assignment& a,
            const AgentOptions& o)
      : link_(link), id_(id), a_(a), o_(o) {}

  // Trains the placement; returns the phase to report and its message. The heartbeat runs from
  // the start, not from the first step: ranks whose peer never arrives (stopped or lost after
  // the placement) wait inside the group's set-up (MPI_Comm_dup, NCCL's init), where only the
  // heartbeat can hear the coordinator's abort.
  v1::WorkerPhase Run(std::string* message) {
    std::thread beat([this] { HeartbeatLoop(); });
    const v1::WorkerPhase phase = Train(message);
    {
      std::lock_guard<std::mutex> l(progress_.mu);
      progress_.done = true;
    }
    progress_.wake.notify_all();
    beat.join();
    return phase;
  }

  // What the engine returned (or why the placement could not start).
  const StatusOr<ProcessRunResult>& result() const { return result_; }

  // The last report, with the newest metrics.
  v1::HeartbeatRequest FinalReport(v1::WorkerPhase phase, const std::string& message) {
    v1::HeartbeatRequest req = Base();
    req.set_phase(phase);
    req.set_message(message);
    std::lock_guard<std::mutex> l(progress_.mu);
    if (progress_.latest.step() > 0) *req.mutable_metrics() = progress_.latest;
    for (const v1::StepMetrics& m : progress_.backlog) *req.add_earlier_metrics() = m;
    progress_.backlog.clear();
    for (const std::string& e : progress_.events) req.add_events(e);
    progress_.events.clear();
    return req;
  }

 private:
  // The placement's work under Run's heartbeat: its group, then training.
  v1::WorkerPhase Train(std::string* message) {
    auto cfg = ParseRunConfig(a_.spec_yaml(), a_.run_id() + " spec");
    if (!cfg.ok()) return Failed(cfg.status(), message);
    // The coordinator names the checkpoint on restarts and resumes; otherwise the spec's own
    // (cleared by a cluster coordinator, kept by `forge train`'s local one) stands.
    if (!a_.resume_checkpoint().empty()) cfg->checkpoint.resume = a_.resume_checkpoint();
    if (id_.group.size() > 1 &&
        (a_.world() != id_.group.size() || a_.rank() != id_.group.rank()))
      return Failed(Status::Invalid("placed as rank " + std::to_string(a_.rank()) + " of " +
                                    std::to_string(a_.world()) + " but launched as rank " +
                                    std::to_string(id_.group.rank()) + " of " +
                                    std::to_string(id_.group.size())),
                    message);

    ProcessGroup group;
    if (id_.launch.kind == LaunchKind::kMpi) {
      auto g = JoinProcessGroup(*cfg);
      if (!g.ok()) return Failed(g.status(), message);
      group = std::move(g).value();
    } else if (a_.world() > 1) {
      // Standalone GPU workers: NCCL with its id relayed by the coordinator.
      LaunchInfo placed;
      placed.rank = a_.rank();
      placed.world = a_.world();
      placed.local_rank = DeviceIndex(id_.device);
      auto rendezvous = MakeCoordinatorRendezvous(link_, {id_.worker_id, a_.run_id(), a_.attempt()},
                                                  cfg->parallel.collective_timeout_s);
      auto g = JoinPlacedGroup(*cfg, placed, rendezvous.get());
      if (!g.ok()) return Failed(g.status(), message);
      group = std::move(g).value();
    }
    TrainOptions topt;
    topt.print_progress = o_.print_progress && a_.rank() == 0;
    topt.stop_requested = stop_;
    topt.checkpoint_requested = &checkpoint_;
    topt.step_done = &step_done_;
    topt.max_steps = o_.max_steps;
    topt.on_step = [this](const StepRecord& r) {
      OnStep(r);
      if (o_.on_step) o_.on_step(r);
    };
    topt.report_shard = [this](const ShardReport& r) { return ReportShard(r); };
    if (a_.has_data_plan() && a_.data_plan().sources_size() > 0) {
      DataPlan plan;
      plan.origin = a_.data_plan().origin();
      for (const v1::DataSource& s : a_.data_plan().sources())
        plan.sources.push_back({s.dir(), s.weight(), s.stream(), s.base()});
      topt.data_plan = std::move(plan);
      topt.data_plan_checkpoint = a_.data_plan().checkpoint();
    }

    // /metrics on metrics.port + local rank, as `forge train` serves it, labelled with the
    // coordinator's run id (the run-level series of the coordinator use the same id). A port
    // that cannot be bound costs the series, not the run: the placement trains on.
    std::unique_ptr<TrainMetrics> metrics;
    if (o_.serve_metrics) {
      const int local_rank = id_.launch.kind == LaunchKind::kMpi ? id_.launch.local_rank
                                                                 : DeviceIndex(id_.device);
      auto m = TrainMetrics::Start(*cfg, a_.run_id(), a_.rank(), local_rank, a_.world());
      if (!m.ok())
        std::fprintf(stderr, "forge-worker: %s rank %d: no /metrics: %s\n", a_.run_id().c_str(),
                     a_.rank(), m.status().ToString().c_str());
      else
        metrics = std::move(m).value();
    }
    // Every rank reports its own wait in collectives per step (the coordinator's straggler
    // watch): host communicators are wrapped and timed on the host; the backend's NCCL
    // communicator times its collectives and the compute stream's waits with CUDA events
    // (comm_time_sink.h), into the same counters.
    if (metrics) {
      group.comm = metrics->TimeCollectives(std::move(group.comm), &comm_wait_);
      topt.on_step = metrics->StepCallback(std::move(topt.on_step));
    } else if (group.comm && std::string_view(group.comm->name()) != "nccl") {
      group.comm = MakeTimedComm(std::move(group.comm), nullptr, &comm_wait_);
    }
    CommTimeCounter nccl_times(metrics ? &metrics->worker() : nullptr, &comm_wait_);
    if (group.nccl) group.nccl->SetTimeSink(&nccl_times);

    result_ = TrainInProcessGroup(*cfg, &group, topt);
    if (group.nccl) group.nccl->SetTimeSink(nullptr);  // nccl_times and metrics end first
    if (metrics)
      metrics->Finish(!result_.ok() ? "failed" : result_->train.stopped ? "stopped" : "completed");
    if (!result_.ok()) {
      if (group.comm && group.world() > 1)
        group.comm->Abort(Status::Internal("rank " + std::to_string(a_.rank()) + " failed"));
      return Failed(result_.status(), message);
    }
    if (result_->train.stopped) return v1::DONE_STOPPED;
    return v1::DONE_COMPLETED;
  }

  v1::WorkerPhase Failed(const Status& s, std::string* message) {
    *message = s.ToString();
    result_ = s;
    return v1::DONE_FAILED;
  }

  v1::HeartbeatRequest Base() const {
    v1::HeartbeatRequest req;
    req.set_worker_id(id_.worker_id);
    req.set_run_id(a_.run_id());
    req.set_attempt(a_.attempt());
    req.set_rank(a_.rank());
    req.set_step_done(step_done_.load());
    return req;
  }

  void OnStep(const StepRecord& r) {
    {
      std::lock_guard<std::mutex> l(progress_.mu);
      // Rank 0's records are the run's stored history: one not sent yet waits in the backlog.
      if (progress_.have_new && a_.rank() == 0) {
        progress_.backlog.push_back(progress_.latest);
        if (progress_.backlog.size() > kMaxBacklog)
          progress_.backlog.erase(progress_.backlog.begin());
      }
      v1::StepMetrics& m = progress_.latest;
      m.set_step(r.step);
      m.set_loss(r.loss);
      m.set_val_loss(r.val_loss);
      m.set_initial_val_loss(r.initial_val_loss > 0 ? r.initial_val_loss : 0.0f);
      m.set_grad_norm(r.grad_norm);
      m.set_lr(r.lr);
      m.set_tokens_per_second(r.tokens_per_s);  // the run's: MFU is the coordinator's to compute
      m.set_gpu_allocated_bytes(r.gpu_allocated_bytes);
      m.set_gpu_reserved_bytes(r.gpu_reserved_bytes);
      m.set_gpu_peak_bytes(r.gpu_peak_bytes);
      m.set_step_seconds(r.step_seconds);
      m.clear_samples();
      for (const EvalSample& e : r.samples) {
        v1::EvalSample* p = m.add_samples();
        p->set_prompt(e.prompt);
        p->set_completion(e.completion);
      }
      // This rank's own wait in collectives per step since its previous record.
      const double waited = comm_wait_.seconds();
      m.set_comm_wait_seconds((waited - comm_wait_reported_) /
                              double(std::max<int64_t>(1, r.window_steps)));
      comm_wait_reported_ = waited;
      progress_.have_new = true;
      if (a_.rank() == 0) {
        progress_.events.insert(progress_.events.end(), r.events.begin(), r.events.end());
        while (progress_.events.size() > kMaxBacklog)
          progress_.events.erase(progress_.events.begin());
      }
    }
    if (o_.throttle_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(o_.throttle_ms));
  }

  Status ReportShard(const ShardReport& r) {
    v1::CommitCheckpointRequest req;
    req.set_worker_id(id_.worker_id);
    req.set_run_id(a_.run_id());
    req.set_attempt(a_.attempt());
    req.set_rank(a_.rank());
    req.set_step(r.step);
    req.set_shard_report(EncodeShardReport(r));
    v1::CommitCheckpointResponse resp;
    return link_->CommitCheckpoint(req, &resp);
  }

  void HeartbeatLoop() {
    const auto interval = std::chrono::milliseconds(std::max(50, a_.heartbeat_interval_ms()));
    // After a failed heartbeat (the coordinator is away, e.g. restarting) the next one goes
    // sooner, so a restarted coordinator hears from this worker soon after it serves.
    const auto retry = std::min(interval, std::chrono::milliseconds(200));
    bool failed = false;
    for (;;) {
      v1::HeartbeatRequest req = Base();
      req.set_phase(v1::TRAINING);
      {
        std::unique_lock<std::mutex> l(progress_.mu);
        progress_.wake.wait_for(l, failed ? retry : interval, [&] { return progress_.done; });
        if (progress_.done) return;
        req.set_step_done(step_done_.load());  // as of now, not of the wait's start
        if (progress_.have_new) *req.mutable_metrics() = progress_.latest;
        for (const v1::StepMetrics& m : progress_.backlog) *req.add_earlier_metrics() = m;
        progress_.backlog.clear();
        for (const std::string& e : progress_.events) req.add_events(e);
        progress_.events.clear();
        progress_.have_new = false;
      }
      v1::HeartbeatResponse resp;
      // No retry loop here: the next tick is the retry (training goes on meanwhile).
      failed = false;
      if (Status s = link_->Heartbeat(req, &resp, /*retry=*/false); !s.ok()) {
        failed = true;
        std::lock_guard<std::mutex> l(progress_.mu);
        if (req.has_metrics()) progress_.have_new = true;  // send it again next time
        // ... with the records it carried before the ones logged since.
        progress_.backlog.insert(progress_.backlog.begin(), req.earlier_metrics().begin(),
                                 req.earlier_metrics().end());
        while (progress_.backlog.size() > kMaxBacklog)
          progress_.backlog.erase(progress_.backlog.begin());
        progress_.events.insert(progress_.events.begin(), req.events().begin(),
                                req.events().end());
        continue;
      }
      switch (resp.command()) {
        case v1::STOP: stop_->store(true); break;
        case v1::CHECKPOINT: checkpoint_.store(true); break;
        case v1::ABORT:
          std::fprintf(stderr, "forge-worker: %s rank %d: abort: %s\n", a_.run_id().c_str(),
                       a_.rank(), resp.reason().c_str());
          std::fflush(stderr);
          std::_Exit(kAbortedExitCode);  // peers may sit in a collective: no clean unwinding
        default: break;
      }
    }
  }

  CoordinatorLink* link_;
  const Identity& id_;
  v1::Assignment a_;
  const AgentOptions& o_;
  std::atomic<bool> own_stop_{false}, checkpoint_{false};
  std::atomic<int64_t> step_done_{0};
  CommWaitClock comm_wait_;          // this rank's waits in collectives (timed_comm.h)
  double comm_wait_reported_ = 0.0;  // its value at the previous step record
  std::atomic<bool>* stop_ = o_.stop_flag ? o_.stop_flag : &own_stop_;
  StatusOr<ProcessRunResult> result_ = Status::Internal("placement not run");
  Progress progress_;
};

}  // namespace

int RunWorkerAgent(const AgentOptions& o) {
  auto id = Identify(o);
  if (!id.ok()) {
    std::fprintf(stderr, "forge-worker: %s\n", id.status().ToString().c_str());
    return 1;
  }
  auto link = CoordinatorLink::Connect(o.link);
  if (!link.ok()) {
    std::fprintf(stderr, "forge-worker: %s\n", link.status().ToString().c_str());
    return 1;
  }
  int placements = 0, rc = 0;
  bool joined_once = false;
  while (o.max_placements < 0 || placements < o.max_placements) {
    if (o.quit && o.quit->load()) break;
    v1::JoinRequest join;
    join.set_worker_id(id->worker_id);
    join.set_host(id->host);
    join.set_device(id->device);
    join.set_device_name(id->device_name);
    *join.mutable_group() = id->group;
    v1::JoinResponse resp;
    if (Status s = (*link)->Join(join, &resp); !s.ok()) {
      std::fprintf(stderr, "forge-worker: %s\n", s.ToString().c_str());
      rc = 1;
      break;
    }
    if (o.on_joined && !joined_once) {
      o.on_joined();
      joined_once = true;
    }
    if (!resp.assigned()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(std::max(20, resp.retry_after_ms())));
      continue;
    }
    const v1::Assignment& a = resp.assignment();
    if (o.announce && a.rank() == 0)
      std::printf("forge-worker: %s attempt %d: rank %d of %d%s\n", a.run_id().c_str(),
                  a.attempt(), a.rank(), a.world(),
                  a.resume_checkpoint().empty() ? ""
                                                : (", resuming " + a.resume_checkpoint()).c_str());
    std::fflush(stdout);
    Placement p(link->get(), *id, a, o);
    std::string message;
    const v1::WorkerPhase phase = p.Run(&message);
    ++placements;
    if (o.on_result) o.on_result(p.result());
    v1::HeartbeatResponse final_resp;
    Status reported = (*link)->Heartbeat(p.FinalReport(phase, message), &final_resp);
    if (phase == v1::DONE_FAILED) {
      if (!o.on_result)  // an in-process caller reports the error itself
        std::fprintf(stderr, "forge-worker: %s rank %d failed: %s\n", a.run_id().c_str(), a.rank(),
                   message.c_str());
      rc = 1;
      break;  // the launch group is likely broken: let the launcher start fresh workers
    }
    if (!reported.ok())
      std::fprintf(stderr, "forge-worker: could not report the end of %s: %s\n",
                   a.run_id().c_str(), reported.ToString().c_str());
  }
  if (id->launch.kind == LaunchKind::kMpi) {
    if (rc != 0) MPI_Abort(MPI_COMM_WORLD, rc);
    FinalizeMpi();
  }
  return rc;
}

}  // namespace forge::agent
