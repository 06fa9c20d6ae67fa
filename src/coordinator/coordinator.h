// The coordinator's logic: run lifecycle, worker pool, placement, heartbeats, checkpoint
// commits. server.cc puts gRPC services (with authentication) in front of it; tests can call
// it directly. All state changes go to the RunStore before a call is answered, so a restarted
// coordinator (same state dir) continues where the killed one stopped: runs, placements and
// half-reported checkpoints are reloaded, and every known worker gets two heartbeat timeouts
// from when it serves (Serving()) to reconnect.
//
// Run lifecycle:
//   SubmitRun      -> PENDING (spec validated, run dir <runs_dir>/<id>)
//   placed         -> RUNNING (attempt + 1; resume point: none, latest or the named step)
//   StopRun        -> CHECKPOINTING (workers get STOP: save, then end) -> STOPPED
//   StopRun(immediate), or stop while not placed -> STOPPED (placed workers get ABORT)
//   every rank reports DONE_COMPLETED -> COMPLETED
//   a worker misses heartbeats (for heartbeat_timeout_ms of the coordinator's own running
//   time: a paused or starved coordinator does not count its absence), reports DONE_FAILED,
//   makes no step progress for the spec's train.hang_timeout_s (hung: stopped, or blocked in a
//   collective or a data read) or its launcher reports its processes gone -> RESTARTING (its workers leave the pool;
//   the others get ABORT) and placed again from the latest committed checkpoint; beyond
//   train.max_restarts -> FAILED with the reason
//   elastic (train.min_workers < train.workers): a RESTARTING run whose full world is not back
//   within train.elastic_grace_s is placed on fewer workers (down to min_workers, the same
//   global batch and sample order); once the full world is idle again, the shrunk placement
//   gets STOP (saves a checkpoint, ends) and the run -> RESTARTING -> RUNNING on the full world
//   from that checkpoint, not counted as a restart
//   ResumeRun (STOPPED/FAILED) -> PENDING
#pragma once

#include <chrono>
#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include <grpcpp/grpcpp.h>

#include "common/status.h"
#include "coordinator/run_store.h"
#include "coordinator/scheduler.h"
#include "coordinator/straggler_watch.h"
#include "forge/v1/runs.pb.h"
#include "forge/v1/workers.pb.h"

namespace forge {
class RunAggregates;
}

namespace forge::coord {

struct CoordinatorOptions {
  std::string state_dir;           // holds coordinator.db
  std::string runs_dir;            // "" = <state_dir>/runs; every run's directory is inside
                                   // (and so every checkpoint: checkpoint.dir is relative)
  // Where specs may point data.dataset_dir and data.sources (absolute, or relative to the
  // first root); none: a spec may not name one (its workers read their own
  // $FORGE_DATA_DIR/dataset).
  std::vector<std::string> data_roots;
  int heartbeat_interval_ms = 1000;
  int heartbeat_timeout_ms = 10000;  // a placed worker silent this long is lost
  int join_retry_ms = 500;         // idle workers poll Join this often
  // `forge train`'s in-process coordinator only (its user is the machine's owner, its workers
  // live and die with its process): the spec's train.run_dir, checkpoint.dir,
  // checkpoint.resume and data.dataset_dir are used as written, and workers and active runs
  // left in the store by an earlier process are dropped at start.
  bool local_process = false;
  // Run-level metrics (--metrics-port): fed from heartbeats and state changes; null = none.
  // Must outlive the coordinator.
  RunAggregates* aggregates = nullptr;
};

class Coordinator {
 public:
  static StatusOr<std::unique_ptr<Coordinator>> Open(const CoordinatorOptions& options);
  ~Coordinator();
  Coordinator(const Coordinator&) = delete;
  Coordinator& operator=(const Coordinator&) = delete;

  // User API.
  grpc::Status SubmitRun(const v1::SubmitRunRequest& req, v1::Run* out);
  grpc::Status StopRun(const v1::StopRunRequest& req, v1::Run* out);
  grpc::Status ResumeRun(const v1::ResumeRunRequest& req, v1::Run* out);
  grpc::Status CheckpointRun(const v1::CheckpointRunRequest& req, v1::Run* out);
  grpc::Status GetRun(const v1::GetRunRequest& req, v1::Run* out);
  grpc::Status ListRuns(const v1::ListRunsRequest& req, v1::ListRunsResponse* out);
  grpc::Status ListCheckpoints(const v1::ListCheckpointsRequest& req,
                               v1::ListCheckpointsResponse* out);
  grpc::Status ExportCheckpoint(const v1::ExportCheckpointRequest& req,
                                v1::ExportCheckpointResponse* out);
  // Everything stored about the run (step records, events, checkpoints); NOT_FOUND if unknown.
  grpc::Status GetRunHistory(const v1::GetRunHistoryRequest& req, v1::RunHistory* out);
  // The data plan at the latest committed checkpoint (data_plans.h); NOT_FOUND if unknown.
  grpc::Status GetDataPlan(const v1::GetDataPlanRequest& req, v1::DataPlan* out);
  // Sends updates through `send` (false: the client went away) until the run ends or
  // `cancelled` turns true.
  grpc::Status WatchRun(const v1::WatchRunRequest& req,
                        const std::function<bool(const v1::RunUpdate&)>& send,
                        const std::function<bool()>& cancelled);

  // Worker API.
  grpc::Status Join(const v1::JoinRequest& req, v1::JoinResponse* out);
  grpc::Status Heartbeat(const v1::HeartbeatRequest& req, v1::HeartbeatResponse* out);
  grpc::Status CommitCheckpoint(const v1::CommitCheckpointRequest& req,
                                v1::CommitCheckpointResponse* out);
  grpc::Status ExchangeCommId(const v1::ExchangeCommIdRequest& req,
                              v1::ExchangeCommIdResponse* out);

  // The launcher that started the processes of the run's attempt saw them end (`forge train`
  // supervising its workers): the run restarts or fails as after a heartbeat timeout, without
  // waiting for one. OK and no change when the run is not running that attempt any more.
  Status WorkersExited(const std::string& run_id, int attempt, const std::string& why);

  // The server in front of it accepts calls from now on: the workers known from the state
  // (placed before a restart) are timed from here, not from Open. They get two heartbeat
  // timeouts to reach it before they count as lost: they first have to find it again (their
  // channels back off while it was away, and a loaded machine slows both sides; one timeout
  // cost a healthy run a restart in the chaos soak).
  void Serving();

  // Stops the monitor thread and wakes watchers (they end their streams).
  void Shutdown();

 private:
  using Clock = std::chrono::steady_clock;
  struct LiveWorker {
    WorkerRecord rec;
    Clock::time_point last_seen;
    // Hang detection: the highest step its placement's heartbeats reported, and when it last
    // advanced (or the placement began, or this coordinator learnt of it).
    int64_t progress_step = 0;
    Clock::time_point progress_at = Clock::now();
    // Known from the state of an earlier coordinator and not heard from since (Serving()).
    bool from_state = false;
  };

  explicit Coordinator(const CoordinatorOptions& options);
  Status Load();
  void MonitorLoop();
  std::chrono::milliseconds MonitorPeriod() const;  // how often the monitor checks heartbeats
  // The monitor's tick came `late` after it was due: beyond a tick's length the coordinator
  // itself was away, and every worker's heartbeat deadline moves by that much. mu_ held.
  void ExcuseOwnAbsence(Clock::duration late);

  // All below: with mu_ held.
  Status SetState(RunRecord* run, RunState state, const std::string& reason,
                  const std::string& event);
  void Schedule();
  // The workers free for a placement (heard from since this coordinator started, on no run),
  // earliest joined first.
  std::vector<PoolWorker> IdlePool() const;
  // `note`: why the world differs from the previous placement's (elastic), for the event.
  Status Place(RunRecord* run, const std::vector<std::string>& worker_ids,
               const std::string& note = "");
  // What elastic placement needs from a run's spec, parsed once (dropped when the spec
  // changes): the world it asks for (train.workers), the least it goes on with
  // (train.min_workers), the batch shape a world must divide, and the grace period.
  struct ElasticBasis {
    int requested = 1, min = 1, micro_batch = 1;
    int world_step = 1;  // worlds must be multiples of it (hsdp: parallel.shard_group_size)
    int64_t global_batch = 1;
    double grace_s = 0;
  };
  const ElasticBasis& Elastic(const RunRecord& run);
  // A running run placed on fewer workers than it asks for, whose full world is back
  // (FullWorldBack): its placement is told to stop with a checkpoint (grow_to), and FinishIfDone
  // places it again on the full world from that checkpoint.
  void GrowBack();
  // A placed worker is gone or failed: the run restarts (or fails, or stops if a stop was
  // pending); every worker of the placement leaves the pool.
  Status LoseRun(RunRecord* run, const std::string& why);
  void ReleaseWorkers(const std::string& run_id);
  // train.hang_timeout_s of the run's spec, in seconds (0: off), parsed once.
  double HangTimeout(const RunRecord& run);
  // Runs whose placed ranks made no step progress for their hang timeout: each gets an event
  // naming the rank and worker, forge_hangs_total + 1, and a restart.
  void DetectHangs(Clock::time_point now);
  std::vector<std::string> PlacedWorkers(const RunRecord& run) const;  // by rank
  bool Placed(const RunRecord& run) const;
  // Whether `requested` workers are there for `run`, shrunk and placed now: a whole idle
  // placement, or (a run on standalone GPU workers) its own workers plus idle standalone GPU
  // ones, which the next placement combines once it stops.
  bool FullWorldBack(const RunRecord& run, const std::vector<PoolWorker>& idle,
                     int requested) const;
  Status FinishIfDone(RunRecord* run);
  // Heartbeat -> opt_.aggregates (no-ops without it).
  void ReportRankMetrics(const RunRecord& run, const WorkerRecord& w, int rank,
                         const v1::StepMetrics& m);
  // The MFU of worker w's GPU for a step record of the run at run_tokens_per_s: the run's
  // FLOPs per token over the peak of the device w reported (metrics.peak_tflops when the spec
  // sets it); < 0 when no peak is known (cpu backend or device, a name not in the table).
  double RankMfu(const RunRecord& run, const WorkerRecord& w, double run_tokens_per_s);
  void MarkWorkerUp(const std::string& run_id, int rank, bool up);
  // A rank's step record -> the straggler watch (the spec's train.straggler_threshold and
  // straggler_reports, parsed once): a change is a run event and forge_straggler.
  Status WatchStragglers(RunRecord* run, const WorkerRecord& w, int rank,
                         const v1::StepMetrics& m);
  // Rank 0's trainer events (loss spikes, rollbacks) -> run events.
  Status RecordWorkerEvents(RunRecord* run, const v1::HeartbeatRequest& req);
  Status AppendRunEvent(RunRecord* run, const std::string& message);
  void FillRun(const RunRecord& r, v1::Run* out);
  void FillAssignment(const RunRecord& run, const WorkerRecord& w, v1::Assignment* a) const;
  RunRecord* FindRun(const std::string& id);
  Status PersistWorker(const WorkerRecord& w);
  // The placement a worker request names (its worker_id, run_id, attempt and rank) is the
  // worker's current one; the worker then counts as seen now. mu_ held.
  template <typename WorkerRequest>
  grpc::Status CheckPlacement(const WorkerRequest& req, LiveWorker** worker, RunRecord** run);

  CoordinatorOptions opt_;
  std::unique_ptr<RunStore> store_;
  std::mutex mu_;
  std::condition_variable changed_;  // any run change (watchers)
  std::map<std::string, RunRecord> runs_;
  std::vector<std::string> run_order_;  // submission order
  std::map<std::string, LiveWorker> workers_;
  std::map<std::string, std::map<int, v1::WorkerPhase>> done_;  // run -> rank -> final phase
  std::map<std::string, std::string> comm_ids_;                 // "<run>#<attempt>" -> id
  std::map<std::string, std::set<int>> checkpoint_asks_;  // run -> ranks not yet told CHECKPOINT
  std::map<std::string, MetricRecord> latest_metrics_;
  struct MfuBasis {  // what RankMfu needs from a run's spec, parsed once
    double flops_per_token = 0, peak_tflops = 0;
    bool cpu = false;
  };
  std::map<std::string, MfuBasis> mfu_basis_;
  std::map<std::string, double> hang_timeout_s_;  // run -> train.hang_timeout_s
  struct StragglerConfig {
    double threshold = 0;  // train.straggler_threshold (0: off)
    int reports = 1;       // train.straggler_reports
  };
  std::map<std::string, StragglerConfig> straggler_cfg_;
  StragglerWatch stragglers_;  // of the current placements
  // run -> its placement's newest loss-spike rollback, for Run.warnings
  std::map<std::string, std::string> spike_warning_;
  std::map<std::string, ElasticBasis> elastic_;
  // Elastic runs waiting to be placed again: since when (the loss, or when this coordinator
  // first saw them waiting); the full world gets train.elastic_grace_s from then.
  std::map<std::string, Clock::time_point> short_since_;
  bool shutdown_ = false;
  std::thread monitor_;
};

}  // namespace forge::coord
