#include "coordinator/run_store.h"

#include <sqlite3.h>

#include <span>
#include <variant>
#include <vector>

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
  gpu_peak_bytes INTEGER DEFAULT 0, initial_val_loss REAL DEFAULT 0,
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
    return Bind(std::span<const Value>(values.begin(), values.size()));
  }
  Status Bind(std::span<const Value> values) {
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

// A table's columns bound to the fields of its record type, so that the column list, the
// reads and the binds are one table: each column names its field and when it is written.
enum class Write {
  kNever,     // the database assigns it (seq)
  kOnInsert,  // set when the row is inserted, never updated
  kAlways,
};

template <typename R>
struct Column {
  const char* name;
  std::variant<int64_t R::*, uint64_t R::*, int R::*, float R::*, double R::*, std::string R::*,
               RunState R::*>
      field;
  Write write = Write::kAlways;
};

template <typename R>
using Columns = std::span<const Column<R>>;

void Load(const Stmt& s, int c, int64_t* v) { *v = s.Int(c); }
void Load(const Stmt& s, int c, uint64_t* v) { *v = uint64_t(s.Int(c)); }
void Load(const Stmt& s, int c, int* v) { *v = int(s.Int(c)); }
void Load(const Stmt& s, int c, float* v) { *v = float(s.Real(c)); }
void Load(const Stmt& s, int c, double* v) { *v = s.Real(c); }
void Load(const Stmt& s, int c, std::string* v) { *v = s.Text(c); }
void Load(const Stmt& s, int c, RunState* v) { *v = static_cast<RunState>(s.Int(c)); }

Value Stored(int64_t v) { return v; }
Value Stored(uint64_t v) { return int64_t(v); }
Value Stored(int v) { return int64_t(v); }
Value Stored(float v) { return double(v); }
Value Stored(double v) { return v; }
Value Stored(const std::string& v) { return v; }
Value Stored(RunState v) { return int64_t(v); }

// The row the statement stands on, read in the order of `cols` (as SelectList lists them).
template <typename R>
R ReadRow(const Stmt& s, Columns<R> cols) {
  R r;
  for (size_t c = 0; c < cols.size(); ++c)
    std::visit([&](auto field) { Load(s, int(c), &(r.*field)); }, cols[c].field);
  return r;
}

// Calls row() on each row the statement yields, standing on it.
template <typename F>
Status ForEachRow(Stmt& s, F row) {
  for (;;) {
    FORGE_ASSIGN_OR_RETURN(bool more, s.Step());
    if (!more) return Status::Ok();
    row();
  }
}

// Every row the statement yields, read as ReadRow does.
template <typename R>
StatusOr<std::vector<R>> ReadRows(Stmt& s, Columns<R> cols) {
  std::vector<R> out;
  FORGE_RETURN_IF_ERROR(ForEachRow(s, [&] { out.push_back(ReadRow(s, cols)); }));
  return out;
}

template <typename R>
std::string SelectList(Columns<R> cols) {
  std::string out;
  for (const Column<R>& c : cols) out += std::string(out.empty() ? "" : ", ") + c.name;
  return out;
}

// "INSERT [OR REPLACE] INTO table (columns written on insert) VALUES (?,...)", and the values
// to bind.
template <typename R>
std::string InsertSql(const char* insert, const char* table, Columns<R> cols) {
  std::string names, marks;
  for (const Column<R>& c : cols) {
    if (c.write == Write::kNever) continue;
    names += std::string(names.empty() ? "" : ", ") + c.name;
    marks += marks.empty() ? "?" : ",?";
  }
  return std::string(insert) + " INTO " + table + " (" + names + ") VALUES (" + marks + ")";
}
template <typename R>
std::vector<Value> InsertValues(const R& r, Columns<R> cols) {
  std::vector<Value> out;
  for (const Column<R>& c : cols)
    if (c.write != Write::kNever)
      std::visit([&](auto field) { out.push_back(Stored(r.*field)); }, c.field);
  return out;
}

// "UPDATE table SET (columns written always)=? ... WHERE key=?", and the values to bind.
template <typename R>
std::string UpdateSql(const char* table, Columns<R> cols, const char* key) {
  std::string sets;
  for (const Column<R>& c : cols)
    if (c.write == Write::kAlways) sets += std::string(sets.empty() ? "" : ", ") + c.name + "=?";
  return std::string("UPDATE ") + table + " SET " + sets + " WHERE " + key + "=?";
}
template <typename R>
std::vector<Value> UpdateValues(const R& r, Columns<R> cols, Value key) {
  std::vector<Value> out;
  for (const Column<R>& c : cols)
    if (c.write == Write::kAlways)
      std::visit([&](auto field) { out.push_back(Stored(r.*field)); }, c.field);
  out.push_back(std::move(key));
  return out;
}

using RR = RunRecord;
constexpr Column<RunRecord> kRunTable[] = {
    {"seq", &RR::seq, Write::kNever},
    {"id", &RR::id, Write::kOnInsert},
    {"name", &RR::name},
    {"state", &RR::state},
    {"reason", &RR::reason},
    {"spec_yaml", &RR::spec_yaml},
    {"run_dir", &RR::run_dir},
    {"workers", &RR::workers},
    {"attempt", &RR::attempt},
    {"restarts", &RR::restarts},
    {"max_restarts", &RR::max_restarts},
    {"resume", &RR::resume},
    {"step", &RR::step},
    {"total_steps", &RR::total_steps},
    {"created_ms", &RR::created_ms, Write::kOnInsert},
    {"updated_ms", &RR::updated_ms},
    {"grow_to", &RR::grow_to},
};
const Columns<RunRecord> kRunColumns(kRunTable);

using MR = MetricRecord;
constexpr Column<MetricRecord> kMetricTable[] = {
    {"seq", &MR::seq, Write::kNever},
    {"run_id", &MR::run_id},
    {"step", &MR::step},
    {"loss", &MR::loss},
    {"val_loss", &MR::val_loss},
    {"grad_norm", &MR::grad_norm},
    {"lr", &MR::lr},
    {"tokens_per_s", &MR::tokens_per_s},
    {"mfu", &MR::mfu},
    {"step_seconds", &MR::step_seconds},
    {"time_ms", &MR::time_ms},
    {"gpu_allocated_bytes", &MR::gpu_allocated_bytes},
    {"gpu_reserved_bytes", &MR::gpu_reserved_bytes},
    {"gpu_peak_bytes", &MR::gpu_peak_bytes},
    {"initial_val_loss", &MR::initial_val_loss},
};
const Columns<MetricRecord> kMetricColumns(kMetricTable);

using ER = EventRecord;
constexpr Column<EventRecord> kEventTable[] = {
    {"id", &ER::id, Write::kNever},
    {"run_id", &ER::run_id},
    {"time_ms", &ER::time_ms},
    {"state", &ER::state},
    {"message", &ER::message},
};
const Columns<EventRecord> kEventColumns(kEventTable);

using CR = CheckpointRecord;
constexpr Column<CheckpointRecord> kCheckpointTable[] = {
    {"run_id", &CR::run_id},
    {"step", &CR::step},
    {"dir", &CR::dir},
    {"world", &CR::world},
    {"bytes", &CR::bytes},
    {"committed_ms", &CR::committed_ms},
    {"data", &CR::data},
};
const Columns<CheckpointRecord> kCheckpointColumns(kCheckpointTable);

using WR = WorkerRecord;
constexpr Column<WorkerRecord> kWorkerTable[] = {
    {"id", &WR::id},
    {"host", &WR::host},
    {"device", &WR::device},
    {"group_id", &WR::group_id},
    {"group_rank", &WR::group_rank},
    {"group_size", &WR::group_size},
    {"run_id", &WR::run_id},
    {"attempt", &WR::attempt},
    {"rank", &WR::rank},
    {"joined_ms", &WR::joined_ms},
    {"done_phase", &WR::done_phase},
    {"device_name", &WR::device_name},
};
const Columns<WorkerRecord> kWorkerColumns(kWorkerTable);

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
  // Likewise step_metrics.initial_val_loss (older rows read 0: not carried).
  (void)Exec(db, "ALTER TABLE step_metrics ADD COLUMN initial_val_loss REAL DEFAULT 0");
  return store;
}

RunStore::~RunStore() { sqlite3_close(db_); }

Status RunStore::InsertRun(RunRecord* r) {
  std::lock_guard<std::mutex> l(mu_);
  Stmt s(db_, InsertSql("INSERT", "runs", kRunColumns).c_str());
  FORGE_RETURN_IF_ERROR(s.Bind(InsertValues(*r, kRunColumns)));
  FORGE_RETURN_IF_ERROR(s.Run());
  r->seq = sqlite3_last_insert_rowid(db_);
  return Status::Ok();
}

Status RunStore::UpdateRun(const RunRecord& r) {
  std::lock_guard<std::mutex> l(mu_);
  Stmt s(db_, UpdateSql("runs", kRunColumns, "id").c_str());
  FORGE_RETURN_IF_ERROR(s.Bind(UpdateValues(r, kRunColumns, r.id)));
  return s.Run();
}

StatusOr<std::optional<RunRecord>> RunStore::GetRun(const std::string& id) {
  std::lock_guard<std::mutex> l(mu_);
  Stmt s(db_, ("SELECT " + SelectList(kRunColumns) + " FROM runs WHERE id=?").c_str());
  FORGE_RETURN_IF_ERROR(s.Bind({id}));
  FORGE_ASSIGN_OR_RETURN(bool row, s.Step());
  if (!row) return std::optional<RunRecord>();
  return std::optional<RunRecord>(ReadRow(s, kRunColumns));
}

StatusOr<std::vector<RunRecord>> RunStore::ListRuns() {
  std::lock_guard<std::mutex> l(mu_);
  Stmt s(db_, ("SELECT " + SelectList(kRunColumns) + " FROM runs ORDER BY seq").c_str());
  FORGE_RETURN_IF_ERROR(s.Bind({}));
  return ReadRows(s, kRunColumns);
}

StatusOr<int64_t> RunStore::AppendEvent(const EventRecord& e) {
  std::lock_guard<std::mutex> l(mu_);
  Stmt s(db_, InsertSql("INSERT", "run_events", kEventColumns).c_str());
  FORGE_RETURN_IF_ERROR(s.Bind(InsertValues(e, kEventColumns)));
  FORGE_RETURN_IF_ERROR(s.Run());
  return int64_t(sqlite3_last_insert_rowid(db_));
}

StatusOr<std::vector<EventRecord>> RunStore::EventsAfter(const std::string& run_id,
                                                         int64_t after_id) {
  std::lock_guard<std::mutex> l(mu_);
  Stmt s(db_, ("SELECT " + SelectList(kEventColumns) +
               " FROM run_events WHERE run_id=? AND id>? ORDER BY id")
                  .c_str());
  FORGE_RETURN_IF_ERROR(s.Bind({run_id, after_id}));
  return ReadRows(s, kEventColumns);
}

Status RunStore::PutMetrics(MetricRecord* m) {
  std::lock_guard<std::mutex> l(mu_);
  Stmt s(db_, InsertSql("INSERT OR REPLACE", "step_metrics", kMetricColumns).c_str());
  FORGE_RETURN_IF_ERROR(s.Bind(InsertValues(*m, kMetricColumns)));
  FORGE_RETURN_IF_ERROR(s.Run());
  m->seq = sqlite3_last_insert_rowid(db_);
  return Status::Ok();
}

StatusOr<std::vector<MetricRecord>> RunStore::MetricsAfter(const std::string& run_id,
                                                           int64_t after_seq) {
  std::lock_guard<std::mutex> l(mu_);
  Stmt s(db_, ("SELECT " + SelectList(kMetricColumns) +
               " FROM step_metrics WHERE run_id=? AND seq>? ORDER BY seq")
                  .c_str());
  FORGE_RETURN_IF_ERROR(s.Bind({run_id, after_seq}));
  return ReadRows(s, kMetricColumns);
}

StatusOr<std::optional<MetricRecord>> RunStore::LatestMetrics(const std::string& run_id) {
  std::lock_guard<std::mutex> l(mu_);
  Stmt s(db_, ("SELECT " + SelectList(kMetricColumns) +
               " FROM step_metrics WHERE run_id=? ORDER BY step DESC LIMIT 1")
                  .c_str());
  FORGE_RETURN_IF_ERROR(s.Bind({run_id}));
  FORGE_ASSIGN_OR_RETURN(bool row, s.Step());
  if (!row) return std::optional<MetricRecord>();
  return std::optional<MetricRecord>(ReadRow(s, kMetricColumns));
}

Status RunStore::PutCheckpoint(const CheckpointRecord& c) {
  std::lock_guard<std::mutex> l(mu_);
  Stmt s(db_, InsertSql("INSERT OR REPLACE", "checkpoints", kCheckpointColumns).c_str());
  FORGE_RETURN_IF_ERROR(s.Bind(InsertValues(c, kCheckpointColumns)));
  return s.Run();
}

StatusOr<std::vector<CheckpointRecord>> RunStore::Checkpoints(const std::string& run_id) {
  std::lock_guard<std::mutex> l(mu_);
  Stmt s(db_, ("SELECT " + SelectList(kCheckpointColumns) +
               " FROM checkpoints WHERE run_id=? ORDER BY step")
                  .c_str());
  FORGE_RETURN_IF_ERROR(s.Bind({run_id}));
  return ReadRows(s, kCheckpointColumns);
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
  FORGE_RETURN_IF_ERROR(ForEachRow(s, [&] { out.emplace_back(int(s.Int(0)), s.Text(1)); }));
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
  Stmt s(db_, InsertSql("INSERT OR REPLACE", "workers", kWorkerColumns).c_str());
  FORGE_RETURN_IF_ERROR(s.Bind(InsertValues(w, kWorkerColumns)));
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
         ("SELECT " + SelectList(kWorkerColumns) + " FROM workers ORDER BY joined_ms, id").c_str());
  FORGE_RETURN_IF_ERROR(s.Bind({}));
  return ReadRows(s, kWorkerColumns);
}

}  // namespace forge::coord
