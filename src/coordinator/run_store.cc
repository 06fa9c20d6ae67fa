#include "coordinator/run_store.h"

#include <sqlite3.h>

#include <variant>

namespace forge::coord {
namespace {

constexpr const char* kSchema = R"sql(
CREATE TABLE IF NOT EXISTS runs (
  seq INTEGER PRIMARY KEY AUTOINCREMENT,
  id TEXT UNIQUE NOT NULL, name TEXT, state INTEGER, reason TEXT, spec_yaml TEXT, run_dir TEXT,
  workers INTEGER, attempt INTEGER, restarts INTEGER, max_restarts INTEGER, resume TEXT,
  step INTEGER, total_steps INTEGER, created_ms INTEGER, updated_ms INTEGER);
CREATE TABLE IF NOT EXISTS run_events (
  id INTEGER PRIMARY KEY AUTOINCREMENT, run_id TEXT, time_ms INTEGER, state INTEGER,
  message TEXT);
CREATE INDEX IF NOT EXISTS run_events_run ON run_events(run_id, id);
CREATE TABLE IF NOT EXISTS step_metrics (
  seq INTEGER PRIMARY KEY AUTOINCREMENT, run_id TEXT, step INTEGER, loss REAL, val_loss REAL,
  grad_norm REAL, lr REAL, tokens_per_s REAL, mfu REAL, step_seconds REAL, time_ms INTEGER,
  gpu_allocated_bytes INTEGER DEFAULT 0, gpu_reserved_bytes INTEGER DEFAULT 0,
  gpu_peak_bytes INTEGER DEFAULT 0,
  UNIQUE(run_id, step));
CREATE TABLE IF NOT EXISTS checkpoints (
  run_id TEXT, step INTEGER, dir TEXT, world INTEGER, bytes INTEGER, committed_ms INTEGER,
  data TEXT DEFAULT '', PRIMARY KEY(run_id, step));
CREATE TABLE IF NOT EXISTS shard_reports (
  run_id TEXT, attempt INTEGER, step INTEGER, rank INTEGER, report TEXT,
  PRIMARY KEY(run_id, attempt, step, rank));
CREATE TABLE IF NOT EXISTS workers (
  id TEXT PRIMARY KEY, host TEXT, device TEXT, group_id TEXT, group_rank INTEGER,
  group_size INTEGER, run_id TEXT, attempt INTEGER, rank INTEGER, joined_ms INTEGER,
  done_phase INTEGER, device_name TEXT DEFAULT '');
)sql";

using Value = std::variant<int64_t, double, std::string>;

// One prepared statement: bind, step, read columns; finalized on scope exit.
class Stmt {
 public:
  Stmt(sqlite3* db, const char* sql) : db_(db) {
    rc_ = sqlite3_prepare_v2(db, sql, -1, &st_, nullptr);
  }
  ~Stmt() { sqlite3_finalize(st_); }
  Status Bind(std::initializer_list<Value> values) {
    if (rc_ != SQLITE_OK) return Error("prepare");
    int i = 1;
    for (const Value& v : values) {
      int rc;
      if (auto* n = std::get_if<int64_t>(&v)) rc = sqlite3_bind_int64(st_, i, *n);
      else if (auto* d = std::get_if<double>(&v)) rc = sqlite3_bind_double(st_, i, *d);
      else {
        const std::string& s = std::get<std::string>(v);
        rc = sqlite3_bind_text(st_, i, s.data(), int(s.size()), SQLITE_TRANSIENT);
      }
      if (rc != SQLITE_OK) return Error("bind");
      ++i;
    }
    return Status::Ok();
  }
  // true: a row is ready; false: done.
  StatusOr<bool> Step() {
    const int rc = sqlite3_step(st_);
    if (rc == SQLITE_ROW) return true;
    if (rc == SQLITE_DONE) return false;
    return Error("step");
  }
  Status Run() {
    FORGE_ASSIGN_OR_RETURN(bool row, Step());
    (void)row;
    return Status::Ok();
  }
  int64_t Int(int c) const { return sqlite3_column_int64(st_, c); }
  double Real(int c) const { return sqlite3_column_double(st_, c); }
  std::string Text(int c) const {
    const unsigned char* t = sqlite3_column_text(st_, c);
    return t ? std::string(reinterpret_cast<const char*>(t), sqlite3_column_bytes(st_, c)) : "";
  }

 private:
  Status Error(const char* what) const {
    return Status::IoError(std::string("sqlite ") + what + ": " + sqlite3_errmsg(db_));
  }
  sqlite3* db_;
  sqlite3_stmt* st_ = nullptr;
  int rc_;
};

Status Exec(sqlite3* db, const char* sql) {
  char* err = nullptr;
  if (sqlite3_exec(db, sql, nullptr, nullptr, &err) == SQLITE_OK) return Status::Ok();
  std::string msg = err ? err : "unknown";
  sqlite3_free(err);
  return Status::IoError(std::string("sqlite: ") + msg);
}

constexpr const char* kRunColumns =
    "seq, id, name, state, reason, spec_yaml, run_dir, workers, attempt, restarts, "
    "max_restarts, resume, step, total_steps, created_ms, updated_ms, grow_to";

RunRecord ReadRun(const Stmt& s) {
  RunRecord r;
  r.seq = s.Int(0);
  r.id = s.Text(1);
  r.name = s.Text(2);
  r.state = static_cast<RunState>(s.Int(3));
  r.reason = s.Text(4);
  r.spec_yaml = s.Text(5);
  r.run_dir = s.Text(6);
  r.workers = int(s.Int(7));
  r.attempt = int(s.Int(8));
  r.restarts = int(s.Int(9));
  r.max_restarts = int(s.Int(10));
  r.resume = s.Text(11);
  r.step = s.Int(12);
  r.total_steps = s.Int(13);
  r.created_ms = s.Int(14);
  r.updated_ms = s.Int(15);
  r.grow_to = int(s.Int(16));
  return r;
}

MetricRecord ReadMetric(const Stmt& s) {
  MetricRecord m;
  m.seq = s.Int(0);
  m.run_id = s.Text(1);
  m.step = s.Int(2);
  m.loss = float(s.Real(3));
  m.val_loss = float(s.Real(4));
  m.grad_norm = float(s.Real(5));
  m.lr = float(s.Real(6));
  m.tokens_per_s = s.Real(7);
  m.mfu = s.Real(8);
  m.step_seconds = s.Real(9);
  m.time_ms = s.Int(10);
  m.gpu_allocated_bytes = s.Int(11);
  m.gpu_reserved_bytes = s.Int(12);
  m.gpu_peak_bytes = s.Int(13);
  return m;
}

}  // namespace

const char* RunStateName(RunState s) {
  switch (s) {
    case RunState::kPending: return "PENDING";
    case RunState::kRunning: return "RUNNING";
    case RunState::kCheckpointing: return "CHECKPOINTING";
    case RunState::kStopped: return "STOPPED";
    case RunState::kCompleted: return "COMPLETED";
    case RunState::kFailed: return "FAILED";
    case RunState::kRestarting: return "RESTARTING";
  }
  return "UNKNOWN";
}

bool IsTerminal(RunState s) {
  return s == RunState::kStopped || s == RunState::kCompleted || s == RunState::kFailed;
}

StatusOr<std::unique_ptr<RunStore>> RunStore::Open(const std::string& path) {
  sqlite3* db = nullptr;
  if (sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, nullptr) !=
      SQLITE_OK) {
    std::string msg = db ? sqlite3_errmsg(db) : "out of memory";
    sqlite3_close(db);
    return Status::IoError("cannot open run store " + path + ": " + msg);
  }
  std::unique_ptr<RunStore> store(new RunStore(db));
  sqlite3_busy_timeout(db, 5000);
  FORGE_RETURN_IF_ERROR(Exec(db, "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;")
                            .Annotate("run store " + path));
  FORGE_RETURN_IF_ERROR(Exec(db, kSchema).Annotate("run store " + path));
  // Stores written before workers.done_phase and device_name existed gain the columns (fails
  // harmlessly when they are already there).
  (void)Exec(db, "ALTER TABLE workers ADD COLUMN done_phase INTEGER DEFAULT 0");
  (void)Exec(db, "ALTER TABLE workers ADD COLUMN device_name TEXT DEFAULT ''");
  // Likewise runs.grow_to (older rows read 0: not growing).
  (void)Exec(db, "ALTER TABLE runs ADD COLUMN grow_to INTEGER DEFAULT 0");
  // Likewise checkpoints.data (older rows read '': no data record).
  (void)Exec(db, "ALTER TABLE checkpoints ADD COLUMN data TEXT DEFAULT ''");
  // Likewise the memory columns of step_metrics (older rows read 0: not measured).
  for (const char* col : {"gpu_allocated_bytes", "gpu_reserved_bytes", "gpu_peak_bytes"})
    (void)Exec(db, (std::string("ALTER TABLE step_metrics ADD COLUMN ") + col +
                    " INTEGER DEFAULT 0")
                       .c_str());
  return store;
}

RunStore::~RunStore() { sqlite3_close(db_); }

Status RunStore::InsertRun(RunRecord* r) {
  std::lock_guard<std::mutex> l(mu_);
  Stmt s(db_,
         "INSERT INTO runs (id, name, state, reason, spec_yaml, run_dir, workers, attempt, "
         "restarts, max_restarts, resume, step, total_steps, created_ms, updated_ms, grow_to) "
         "VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)");
  FORGE_RETURN_IF_ERROR(s.Bind({r->id, r->name, int64_t(r->state), r->reason, r->spec_yaml,
                                r->run_dir, int64_t(r->workers), int64_t(r->attempt),
                                int64_t(r->restarts), int64_t(r->max_restarts), r->resume,
                                r->step, r->total_steps, r->created_ms, r->updated_ms,
                                int64_t(r->grow_to)}));
  FORGE_RETURN_IF_ERROR(s.Run());
  r->seq = sqlite3_last_insert_rowid(db_);
  return Status::Ok();
}

Status RunStore::UpdateRun(const RunRecord& r) {
  std::lock_guard<std::mutex> l(mu_);
  Stmt s(db_,
         "UPDATE runs SET name=?, state=?, reason=?, spec_yaml=?, run_dir=?, workers=?, "
         "attempt=?, restarts=?, max_restarts=?, resume=?, step=?, total_steps=?, "
         "updated_ms=?, grow_to=? WHERE id=?");
  FORGE_RETURN_IF_ERROR(s.Bind({r.name, int64_t(r.state), r.reason, r.spec_yaml, r.run_dir,
                                int64_t(r.workers), int64_t(r.attempt), int64_t(r.restarts),
                                int64_t(r.max_restarts), r.resume, r.step, r.total_steps,
                                r.updated_ms, int64_t(r.grow_to), r.id}));
  return s.Run();
}

StatusOr<std::optional<RunRecord>> RunStore::GetRun(const std::string& id) {
  std::lock_guard<std::mutex> l(mu_);
  Stmt s(db_, (std::string("SELECT ") + kRunColumns + " FROM runs WHERE id=?").c_str());
  FORGE_RETURN_IF_ERROR(s.Bind({id}));
  FORGE_ASSIGN_OR_RETURN(bool row, s.Step());
  if (!row) return std::optional<RunRecord>();
  return std::optional<RunRecord>(ReadRun(s));
}

StatusOr<std::vector<RunRecord>> RunStore::ListRuns() {
  std::lock_guard<std::mutex> l(mu_);
  Stmt s(db_, (std::string("SELECT ") + kRunColumns + " FROM runs ORDER BY seq").c_str());
  FORGE_RETURN_IF_ERROR(s.Bind({}));
  std::vector<RunRecord> out;
  for (;;) {
    FORGE_ASSIGN_OR_RETURN(bool row, s.Step());
    if (!row) break;
    out.push_back(ReadRun(s));
  }
  return out;
}

StatusOr<int64_t> RunStore::AppendEvent(const EventRecord& e) {
  std::lock_guard<std::mutex> l(mu_);
  Stmt s(db_, "INSERT INTO run_events (run_id, time_ms, state, message) VALUES (?,?,?,?)");
  FORGE_RETURN_IF_ERROR(s.Bind({e.run_id, e.time_ms, int64_t(e.state), e.message}));
  FORGE_RETURN_IF_ERROR(s.Run());
  return int64_t(sqlite3_last_insert_rowid(db_));
}

StatusOr<std::vector<EventRecord>> RunStore::EventsAfter(const std::string& run_id,
                                                         int64_t after_id) {
  std::lock_guard<std::mutex> l(mu_);
  Stmt s(db_,
         "SELECT id, run_id, time_ms, state, message FROM run_events WHERE run_id=? AND id>? "
         "ORDER BY id");
  FORGE_RETURN_IF_ERROR(s.Bind({run_id, after_id}));
  std::vector<EventRecord> out;
  for (;;) {
    FORGE_ASSIGN_OR_RETURN(bool row, s.Step());
    if (!row) break;
    EventRecord e;
    e.id = s.Int(0);
    e.run_id = s.Text(1);
    e.time_ms = s.Int(2);
    e.state = static_cast<RunState>(s.Int(3));
    e.message = s.Text(4);
    out.push_back(std::move(e));
  }
  return out;
}

Status RunStore::PutMetrics(MetricRecord* m) {
  std::lock_guard<std::mutex> l(mu_);
  Stmt s(db_,
         "INSERT OR REPLACE INTO step_metrics (run_id, step, loss, val_loss, grad_norm, lr, "
         "tokens_per_s, mfu, step_seconds, time_ms, gpu_allocated_bytes, gpu_reserved_bytes, "
         "gpu_peak_bytes) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)");
  FORGE_RETURN_IF_ERROR(s.Bind({m->run_id, m->step, double(m->loss), double(m->val_loss),
                                double(m->grad_norm), double(m->lr), m->tokens_per_s, m->mfu,
                                m->step_seconds, m->time_ms, m->gpu_allocated_bytes,
                                m->gpu_reserved_bytes, m->gpu_peak_bytes}));
  FORGE_RETURN_IF_ERROR(s.Run());
  m->seq = sqlite3_last_insert_rowid(db_);
  return Status::Ok();
}

constexpr const char* kMetricColumns =
    "seq, run_id, step, loss, val_loss, grad_norm, lr, tokens_per_s, mfu, step_seconds, time_ms, "
    "gpu_allocated_bytes, gpu_reserved_bytes, gpu_peak_bytes";

StatusOr<std::vector<MetricRecord>> RunStore::MetricsAfter(const std::string& run_id,
                                                           int64_t after_seq) {
  std::lock_guard<std::mutex> l(mu_);
  Stmt s(db_, (std::string("SELECT ") + kMetricColumns +
               " FROM step_metrics WHERE run_id=? AND seq>? ORDER BY seq")
                  .c_str());
  FORGE_RETURN_IF_ERROR(s.Bind({run_id, after_seq}));
  std::vector<MetricRecord> out;
  for (;;) {
    FORGE_ASSIGN_OR_RETURN(bool row, s.Step());
    if (!row) break;
    out.push_back(ReadMetric(s));
  }
  return out;
}

StatusOr<std::optional<MetricRecord>> RunStore::LatestMetrics(const std::string& run_id) {
  std::lock_guard<std::mutex> l(mu_);
  Stmt s(db_, (std::string("SELECT ") + kMetricColumns +
               " FROM step_metrics WHERE run_id=? ORDER BY step DESC LIMIT 1")
                  .c_str());
  FORGE_RETURN_IF_ERROR(s.Bind({run_id}));
  FORGE_ASSIGN_OR_RETURN(bool row, s.Step());
  if (!row) return std::optional<MetricRecord>();
  return std::optional<MetricRecord>(ReadMetric(s));
}

Status RunStore::PutCheckpoint(const CheckpointRecord& c) {
  std::lock_guard<std::mutex> l(mu_);
  Stmt s(db_,
         "INSERT OR REPLACE INTO checkpoints (run_id, step, dir, world, bytes, committed_ms, "
         "data) VALUES (?,?,?,?,?,?,?)");
  FORGE_RETURN_IF_ERROR(s.Bind({c.run_id, c.step, c.dir, int64_t(c.world), int64_t(c.bytes),
                                c.committed_ms, c.data}));
  return s.Run();
}

StatusOr<std::vector<CheckpointRecord>> RunStore::Checkpoints(const std::string& run_id) {
  std::lock_guard<std::mutex> l(mu_);
  Stmt s(db_,
         "SELECT run_id, step, dir, world, bytes, committed_ms, data FROM checkpoints "
         "WHERE run_id=? "
         "ORDER BY step");
  FORGE_RETURN_IF_ERROR(s.Bind({run_id}));
  std::vector<CheckpointRecord> out;
  for (;;) {
    FORGE_ASSIGN_OR_RETURN(bool row, s.Step());
    if (!row) break;
    CheckpointRecord c;
    c.run_id = s.Text(0);
    c.step = s.Int(1);
    c.dir = s.Text(2);
    c.world = int(s.Int(3));
    c.bytes = uint64_t(s.Int(4));
    c.committed_ms = s.Int(5);
    c.data = s.Text(6);
    out.push_back(std::move(c));
  }
  return out;
}

Status RunStore::DeleteCheckpoint(const std::string& run_id, int64_t step) {
  std::lock_guard<std::mutex> l(mu_);
  Stmt s(db_, "DELETE FROM checkpoints WHERE run_id=? AND step=?");
  FORGE_RETURN_IF_ERROR(s.Bind({run_id, step}));
  return s.Run();
}

Status RunStore::PutShardReport(const std::string& run_id, int attempt, int64_t step, int rank,
                                const std::string& report) {
  std::lock_guard<std::mutex> l(mu_);
  Stmt s(db_,
         "INSERT OR REPLACE INTO shard_reports (run_id, attempt, step, rank, report) "
         "VALUES (?,?,?,?,?)");
  FORGE_RETURN_IF_ERROR(s.Bind({run_id, int64_t(attempt), step, int64_t(rank), report}));
  return s.Run();
}

StatusOr<std::vector<std::pair<int, std::string>>> RunStore::ShardReports(
    const std::string& run_id, int attempt, int64_t step) {
  std::lock_guard<std::mutex> l(mu_);
  Stmt s(db_,
         "SELECT rank, report FROM shard_reports WHERE run_id=? AND attempt=? AND step=? "
         "ORDER BY rank");
  FORGE_RETURN_IF_ERROR(s.Bind({run_id, int64_t(attempt), step}));
  std::vector<std::pair<int, std::string>> out;
  for (;;) {
    FORGE_ASSIGN_OR_RETURN(bool row, s.Step());
    if (!row) break;
    out.emplace_back(int(s.Int(0)), s.Text(1));
  }
  return out;
}

Status RunStore::DeleteShardReports(const std::string& run_id, int64_t step) {
  std::lock_guard<std::mutex> l(mu_);
  Stmt s(db_, "DELETE FROM shard_reports WHERE run_id=? AND step<=?");
  FORGE_RETURN_IF_ERROR(s.Bind({run_id, step}));
  return s.Run();
}

Status RunStore::PutWorker(const WorkerRecord& w) {
  std::lock_guard<std::mutex> l(mu_);
  Stmt s(db_,
         "INSERT OR REPLACE INTO workers (id, host, device, group_id, group_rank, group_size, "
         "run_id, attempt, rank, joined_ms, done_phase, device_name) "
         "VALUES (?,?,?,?,?,?,?,?,?,?,?,?)");
  FORGE_RETURN_IF_ERROR(s.Bind({w.id, w.host, w.device, w.group_id, int64_t(w.group_rank),
                                int64_t(w.group_size), w.run_id, int64_t(w.attempt),
                                int64_t(w.rank), w.joined_ms, int64_t(w.done_phase),
                                w.device_name}));
  return s.Run();
}

Status RunStore::DeleteWorker(const std::string& id) {
  std::lock_guard<std::mutex> l(mu_);
  Stmt s(db_, "DELETE FROM workers WHERE id=?");
  FORGE_RETURN_IF_ERROR(s.Bind({id}));
  return s.Run();
}

StatusOr<std::vector<WorkerRecord>> RunStore::Workers() {
  std::lock_guard<std::mutex> l(mu_);
  Stmt s(db_,
         "SELECT id, host, device, group_id, group_rank, group_size, run_id, attempt, rank, "
         "joined_ms, done_phase, device_name FROM workers ORDER BY joined_ms, id");
  FORGE_RETURN_IF_ERROR(s.Bind({}));
  std::vector<WorkerRecord> out;
  for (;;) {
    FORGE_ASSIGN_OR_RETURN(bool row, s.Step());
    if (!row) break;
    WorkerRecord w;
    w.id = s.Text(0);
    w.host = s.Text(1);
    w.device = s.Text(2);
    w.group_id = s.Text(3);
    w.group_rank = int(s.Int(4));
    w.group_size = int(s.Int(5));
    w.run_id = s.Text(6);
    w.attempt = int(s.Int(7));
    w.rank = int(s.Int(8));
    w.joined_ms = s.Int(9);
    w.done_phase = int(s.Int(10));
    w.device_name = s.Text(11);
    out.push_back(std::move(w));
  }
  return out;
}

}  // namespace forge::coord
