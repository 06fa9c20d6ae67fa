// The coordinator's durable state: one SQLite database (WAL journal) under --state-dir. Tables:
//   runs          one row per run (spec, state, placement counters, progress)
//   run_events    state changes and notable events, in order (WatchRun, `forgectl status`)
//   step_metrics  rank 0's logged steps (loss, tokens/s, MFU, step time, GPU memory); a step redone
//                 after a restart replaces its row
//   checkpoints   committed checkpoints (the manifest is written), each with its data record:
//                 what every data source had given at its cursor (JSON, as in the manifest)
//   shard_reports ranks' reports of a checkpoint not yet committed (survive a restart)
//   workers       the pool and who is placed where (re-adopted after a coordinator restart)
// Every write is its own transaction; with WAL + synchronous=NORMAL a killed coordinator
// (kill -9) loses nothing that a call was answered for. Thread-safe (one connection, a mutex).
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"

struct sqlite3;

namespace forge::coord {

// Values of forge.v1.RunState (kept equal so they can be cast).
enum class RunState : int {
  kPending = 1,
  kRunning = 2,
  kCheckpointing = 3,
  kStopped = 4,
  kCompleted = 5,
  kFailed = 6,
  kRestarting = 7,
};
const char* RunStateName(RunState s);
bool IsTerminal(RunState s);  // STOPPED, COMPLETED, FAILED

struct RunRecord {
  std::string id;
  std::string name;
  RunState state = RunState::kPending;
  std::string reason;
  std::string spec_yaml;     // normalised; train.run_dir is the run's directory
  std::string run_dir;
  int workers = 1;           // the world of its current (or last) placement; the spec's
                             // train.workers is the world it asks for (elastic runs differ)
  int attempt = 0;           // placements so far
  int restarts = 0;
  int max_restarts = 3;
  std::string resume;        // where the next placement starts: "" fresh, "latest", "step_N"
  int64_t step = 0;
  int64_t total_steps = 0;
  int64_t created_ms = 0, updated_ms = 0;
  int64_t seq = 0;           // insertion order (set by the store)
  int grow_to = 0;           // > 0: its shrunk placement was told to stop at a checkpoint so
                             // that it can be placed again on this many workers
};

struct EventRecord {
  int64_t id = 0;
  std::string run_id;
  int64_t time_ms = 0;
  RunState state = RunState::kPending;
  std::string message;
};

struct MetricRecord {
  int64_t seq = 0;           // set by the store; increases with every write
  std::string run_id;
  int64_t step = 0;
  float loss = 0, val_loss = -1, grad_norm = 0, lr = 0;
  double tokens_per_s = 0, mfu = 0, step_seconds = 0;
  int64_t time_ms = 0;
  int64_t gpu_allocated_bytes = 0, gpu_reserved_bytes = 0, gpu_peak_bytes = 0;  // 0 on CPU
  float initial_val_loss = 0;  // the validation loss before step 1 (0: not carried)
};

struct CheckpointRecord {
  std::string run_id;
  int64_t step = 0;
  std::string dir;
  int world = 1;
  uint64_t bytes = 0;
  int64_t committed_ms = 0;
  std::string data;  // EncodeDataUsage (worker/data/data_plan.h); "" when it has none
};

struct WorkerRecord {
  std::string id, host, device;
  std::string device_name;   // the GPU's product name (JoinRequest.device_name); "" if none
  std::string group_id;
  int group_rank = 0, group_size = 1;
  std::string run_id;        // "" when idle
  int attempt = 0, rank = 0;
  int64_t joined_ms = 0;
  int done_phase = 0;        // forge.v1.WorkerPhase its placement ended with; 0 while it runs
};

class RunStore {
 public:
  // Opens (creating) <path>; sets WAL and creates the tables.
  static StatusOr<std::unique_ptr<RunStore>> Open(const std::string& path);
  ~RunStore();
  RunStore(const RunStore&) = delete;
  RunStore& operator=(const RunStore&) = delete;

  Status InsertRun(RunRecord* run);  // sets run->seq
  Status UpdateRun(const RunRecord& run);
  StatusOr<std::optional<RunRecord>> GetRun(const std::string& id);
  StatusOr<std::vector<RunRecord>> ListRuns();  // by insertion order

  StatusOr<int64_t> AppendEvent(const EventRecord& e);  // returns its id
  StatusOr<std::vector<EventRecord>> EventsAfter(const std::string& run_id, int64_t after_id);

  Status PutMetrics(MetricRecord* m);  // sets m->seq
  StatusOr<std::vector<MetricRecord>> MetricsAfter(const std::string& run_id, int64_t after_seq);
  StatusOr<std::optional<MetricRecord>> LatestMetrics(const std::string& run_id);

  Status PutCheckpoint(const CheckpointRecord& c);
  StatusOr<std::vector<CheckpointRecord>> Checkpoints(const std::string& run_id);  // by step
  Status DeleteCheckpoint(const std::string& run_id, int64_t step);

  Status PutShardReport(const std::string& run_id, int attempt, int64_t step, int rank,
                        const std::string& report);
  StatusOr<std::vector<std::pair<int, std::string>>> ShardReports(const std::string& run_id,
                                                                  int attempt, int64_t step);
  Status DeleteShardReports(const std::string& run_id, int64_t step);

  Status PutWorker(const WorkerRecord& w);
  Status DeleteWorker(const std::string& id);
  StatusOr<std::vector<WorkerRecord>> Workers();

 private:
  explicit RunStore(sqlite3* db) : db_(db) {}
  sqlite3* db_;
  std::mutex mu_;
};

}  // namespace forge::coord
