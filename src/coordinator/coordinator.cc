#include "coordinator/coordinator.h"

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <optional>
#include <random>

#include <nlohmann/json.hpp>
#include <sqlite3.h>

#include "common/config.h"
#include "common/peak_flops.h"
#include "common/text_excerpt.h"
#include "coordinator/data_plans.h"
#include "coordinator/run_paths.h"
#include "coordinator/scheduler.h"
#include "metrics/run_aggregates.h"
#include "worker/checkpoint/checkpoint.h"
#include "worker/infer/model_source.h"
#include "worker/model/param_layout.h"

namespace forge::coord {
namespace {

namespace fs = std::filesystem;

int64_t NowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// Whether an I/O error says the storage is full (or a file-size limit was hit): file_io's
// messages end with strerror's text, the run store's with SQLite's.
bool OutOfSpace(const std::string& message) {
  for (int e : {ENOSPC, EDQUOT, EFBIG})
    if (message.find(std::strerror(e)) != std::string::npos) return true;
  return message.find(sqlite3_errstr(SQLITE_FULL)) != std::string::npos;
}

grpc::Status ToGrpc(const Status& s) {
  if (s.ok()) return grpc::Status::OK;
  grpc::StatusCode code = grpc::StatusCode::INTERNAL;
  switch (s.code()) {
    // The coordinator's storage failed (a manifest, a run dir): not a bug of its own, and not
    // worth retrying in a loop; the message names the path.
    case Code::kIoError:
      code = OutOfSpace(s.message()) ? grpc::StatusCode::RESOURCE_EXHAUSTED
                                     : grpc::StatusCode::FAILED_PRECONDITION;
      break;
    case Code::kInvalidArgument: code = grpc::StatusCode::INVALID_ARGUMENT; break;
    case Code::kNotFound: code = grpc::StatusCode::NOT_FOUND; break;
    case Code::kFailedPrecondition: code = grpc::StatusCode::FAILED_PRECONDITION; break;
    case Code::kUnavailable: code = grpc::StatusCode::UNAVAILABLE; break;
    case Code::kDataLoss: code = grpc::StatusCode::DATA_LOSS; break;
    default: break;
  }
  return {code, s.message()};
}

std::string ShortNum(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

grpc::Status NotFoundRun(const std::string& id) {
  return {grpc::StatusCode::NOT_FOUND, "no run with id '" + TextExcerpt(id) + "'"};
}

bool Active(RunState s) { return s == RunState::kRunning || s == RunState::kCheckpointing; }

// "<name>-<6 hex>": readable and unique enough for one coordinator (checked against the store).
std::string NewRunId(const std::string& name) {
  static thread_local std::mt19937_64 rng{std::random_device{}()};
  std::string base;
  for (char c : name)
    base += (std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_') ? c : '-';
  if (base.empty() || base.size() > 40) base = base.empty() ? "run" : base.substr(0, 40);
  char hex[8];
  std::snprintf(hex, sizeof hex, "%06x", unsigned(rng() & 0xffffff));
  return base + "-" + hex;
}

// The spec as the coordinator runs it: parsed strictly, outputs confined to the run dir,
// input data to the data roots.
StatusOr<RunConfig> ParseSpec(const std::string& yaml, const std::string& source,
                              const std::string& run_dir, const CoordinatorOptions& opt) {
  FORGE_ASSIGN_OR_RETURN(RunConfig cfg, ParseRunConfig(yaml, source));
  if (opt.local_process) return cfg;
  if (!cfg.data.dataset_dir.empty()) {
    FORGE_ASSIGN_OR_RETURN(cfg.data.dataset_dir,
                           ResolveUnderRoots(opt.data_roots, cfg.data.dataset_dir,
                                             source + ": data.dataset_dir"));
  }
  for (size_t i = 0; i < cfg.data.sources.size(); ++i) {
    FORGE_ASSIGN_OR_RETURN(
        cfg.data.sources[i].dir,
        ResolveUnderRoots(opt.data_roots, cfg.data.sources[i].dir,
                          source + ": data.sources[" + std::to_string(i) + "].dir"));
  }
  cfg.train.run_dir = run_dir;
  if (!cfg.checkpoint.dir.empty()) {
    FORGE_ASSIGN_OR_RETURN(cfg.checkpoint.dir,
                           ResolveInside(run_dir, cfg.checkpoint.dir, source + ": checkpoint.dir"));
  }
  // Where a run resumes from is the coordinator's decision (ResumeRun, restarts).
  FORGE_RETURN_IF_ERROR(
      ParseCheckpointName(cfg.checkpoint.resume, source + ": checkpoint.resume").status());
  cfg.checkpoint.resume.clear();
  const int64_t per_step = int64_t{cfg.batch.micro_batch} * cfg.train.workers;
  if (cfg.batch.global_batch % per_step != 0)
    return Status::Invalid(source + ": batch.global_batch: must be a multiple of "
                           "batch.micro_batch * train.workers (" + std::to_string(per_step) +
                           "), got " + std::to_string(cfg.batch.global_batch));
  // hsdp splits the world into shard groups: every world it runs on is a multiple of the
  // group size (elastic placements skip the others).
  if (cfg.parallel.mode == ParallelMode::kHsdp &&
      cfg.train.workers % cfg.parallel.shard_group_size != 0)
    return Status::Invalid(source + ": parallel.shard_group_size (" +
                           std::to_string(cfg.parallel.shard_group_size) +
                           ") must divide train.workers (" + std::to_string(cfg.train.workers) +
                           ")");
  const int64_t per_min_step = int64_t{cfg.batch.micro_batch} * MinWorkers(cfg.train);
  if (cfg.batch.global_batch % per_min_step != 0)
    return Status::Invalid(source + ": train.min_workers: " +
                           std::to_string(MinWorkers(cfg.train)) +
                           " workers cannot keep the global batch: batch.global_batch (" +
                           std::to_string(cfg.batch.global_batch) +
                           ") must be a multiple of batch.micro_batch * train.min_workers (" +
                           std::to_string(per_min_step) + ")");
  return cfg;
}

v1::StepMetrics ToProto(const MetricRecord& m) {
  v1::StepMetrics p;
  p.set_step(m.step);
  p.set_loss(m.loss);
  p.set_val_loss(m.val_loss);
  p.set_grad_norm(m.grad_norm);
  p.set_lr(m.lr);
  p.set_tokens_per_second(m.tokens_per_s);
  p.set_mfu(m.mfu);
  p.set_step_seconds(m.step_seconds);
  p.set_time_unix_ms(m.time_ms);
  p.set_gpu_allocated_bytes(m.gpu_allocated_bytes);
  p.set_gpu_reserved_bytes(m.gpu_reserved_bytes);
  p.set_gpu_peak_bytes(m.gpu_peak_bytes);
  p.set_initial_val_loss(m.initial_val_loss);
  return p;
}

v1::Checkpoint ToProto(const CheckpointRecord& c) {
  v1::Checkpoint p;
  p.set_step(c.step);
  p.set_dir(c.dir);
  p.set_world_size(c.world);
  p.set_bytes(c.bytes);
  p.set_committed_unix_ms(c.committed_ms);
  return p;
}

// The metrics label of a state (metric_catalog's RunStateNames()).
const char* StateLabel(RunState s) {
  switch (s) {
    case RunState::kPending: return "pending";
    case RunState::kRunning: return "running";
    case RunState::kCheckpointing: return "checkpointing";
    case RunState::kStopped: return "stopped";
    case RunState::kCompleted: return "completed";
    case RunState::kFailed: return "failed";
    case RunState::kRestarting: return "restarting";
  }
  return "failed";
}

// The run event of an eval.samples completion: the step, then prompt and completion as JSON
// strings (one line whatever the text, quotes and newlines escaped).
std::string SampleEventText(int64_t step, const std::string& prompt,
                            const std::string& completion) {
  auto quoted = [](const std::string& s) {
    return nlohmann::json(s).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  };
  return "sample at step " + std::to_string(step) + ": " + quoted(prompt) + " -> " +
         quoted(completion);
}

v1::RunEvent ToProto(const EventRecord& e) {
  v1::RunEvent p;
  p.set_id(e.id);
  p.set_time_unix_ms(e.time_ms);
  p.set_state(static_cast<v1::RunState>(e.state));
  p.set_message(e.message);
  return p;
}

}  // namespace

Coordinator::Coordinator(const CoordinatorOptions& options) : opt_(options) {}

StatusOr<std::unique_ptr<Coordinator>> Coordinator::Open(const CoordinatorOptions& options) {
  std::unique_ptr<Coordinator> c(new Coordinator(options));
  std::error_code ec;
  if (c->opt_.state_dir.empty()) return Status::Invalid("coordinator: --state-dir is required");
  fs::create_directories(c->opt_.state_dir, ec);
  if (ec) return Status::IoError("cannot create state dir " + c->opt_.state_dir + ": " + ec.message());
  if (c->opt_.runs_dir.empty()) c->opt_.runs_dir = c->opt_.state_dir + "/runs";
  c->opt_.runs_dir = fs::absolute(c->opt_.runs_dir).lexically_normal().string();
  fs::create_directories(c->opt_.runs_dir, ec);
  if (ec) return Status::IoError("cannot create runs dir " + c->opt_.runs_dir + ": " + ec.message());
  for (std::string& root : c->opt_.data_roots) {
    fs::path p = fs::weakly_canonical(fs::absolute(root), ec);
    if (ec || root.empty())
      return Status::Invalid("coordinator: --data-root '" + root + "': cannot be resolved");
    if (!p.has_filename() && p != p.root_path()) p = p.parent_path();  // no trailing '/'
    root = p.string();
  }
  FORGE_ASSIGN_OR_RETURN(c->store_, RunStore::Open(c->opt_.state_dir + "/coordinator.db"));
  FORGE_RETURN_IF_ERROR(c->Load());
  c->monitor_ = std::thread([p = c.get()] { p->MonitorLoop(); });
  return c;
}

Coordinator::~Coordinator() { Shutdown(); }

void Coordinator::Shutdown() {
  {
    std::lock_guard<std::mutex> l(mu_);
    shutdown_ = true;
  }
  changed_.notify_all();
  if (monitor_.joinable()) monitor_.join();
}

Status Coordinator::Load() {
  FORGE_ASSIGN_OR_RETURN(std::vector<RunRecord> runs, store_->ListRuns());
  for (RunRecord& r : runs) {
    const std::string id = r.id;
    run_order_.push_back(id);
    FORGE_ASSIGN_OR_RETURN(auto m, store_->LatestMetrics(id));
    if (m) latest_metrics_[id] = *m;
    if (opt_.aggregates) (void)opt_.aggregates->SetRunState(id, StateLabel(r.state));
    runs_[id] = std::move(r);
  }
  FORGE_ASSIGN_OR_RETURN(std::vector<WorkerRecord> workers, store_->Workers());
  if (opt_.local_process) {
    // Whatever an earlier `forge train` left placed or waiting died with that process.
    for (const WorkerRecord& w : workers) FORGE_RETURN_IF_ERROR(store_->DeleteWorker(w.id));
    workers.clear();
    for (auto& [id, r] : runs_)
      if (!IsTerminal(r.state))
        FORGE_RETURN_IF_ERROR(SetState(&r, RunState::kFailed,
                                       "the forge train process that ran it ended", ""));
  }
  // Known workers get two heartbeat timeouts from now (from Serving(), once called) to show up
  // again; ranks that already reported the end of their placement count as done.
  for (WorkerRecord& w : workers) {
    const std::string id = w.id;
    if (!w.run_id.empty() && w.done_phase != 0)
      done_[w.run_id][w.rank] = static_cast<v1::WorkerPhase>(w.done_phase);
    LiveWorker live{std::move(w), Clock::now()};
    live.from_state = true;
    workers_[id] = std::move(live);
  }
  return Status::Ok();
}

void Coordinator::Serving() {
  std::lock_guard<std::mutex> l(mu_);
  const auto now = Clock::now();
  for (auto& [id, w] : workers_)
    if (w.from_state) w.last_seen = w.progress_at = now;
}

RunRecord* Coordinator::FindRun(const std::string& id) {
  auto it = runs_.find(id);
  return it == runs_.end() ? nullptr : &it->second;
}

Status Coordinator::PersistWorker(const WorkerRecord& w) { return store_->PutWorker(w); }

Status Coordinator::SetState(RunRecord* run, RunState state, const std::string& reason,
                             const std::string& event) {
  run->state = state;
  run->reason = reason;
  run->updated_ms = NowMs();
  FORGE_RETURN_IF_ERROR(store_->UpdateRun(*run));
  EventRecord e;
  e.run_id = run->id;
  e.time_ms = run->updated_ms;
  e.state = state;
  e.message = event.empty() ? reason : event;
  FORGE_RETURN_IF_ERROR(store_->AppendEvent(e).status());
  // Early warnings belong to a placement: stragglers end with it (its ranks start over), the
  // newest spike rollback is kept until the next placement starts.
  if (state != RunState::kRunning) {
    for (int r : stragglers_.Straggling(run->id))
      if (opt_.aggregates) opt_.aggregates->SetStraggler(run->id, r, false);
    stragglers_.ForgetRun(run->id);
  } else {
    spike_warning_.erase(run->id);
  }
  if (opt_.aggregates) {
    (void)opt_.aggregates->SetRunState(run->id, StateLabel(state));
    // An ended run has no workers: its per-rank series go (a 0 would read as a worker down).
    if (IsTerminal(state))
      for (int r = 0; r < run->workers; ++r) opt_.aggregates->ForgetRank(run->id, r);
  }
  changed_.notify_all();
  return Status::Ok();
}

double Coordinator::RankMfu(const RunRecord& run, const WorkerRecord& w,
                            double run_tokens_per_s) {
  auto it = mfu_basis_.find(run.id);
  if (it == mfu_basis_.end()) {
    MfuBasis b;
    auto cfg = ParseRunConfig(run.spec_yaml, run.id + " spec");
    if (cfg.ok()) {
      b.flops_per_token = TrainFlopsPerToken(cfg->model);
      b.peak_tflops = cfg->metrics.peak_tflops;
      b.cpu = cfg->train.backend == Backend::kCpu;
    }
    it = mfu_basis_.emplace(run.id, b).first;
  }
  const MfuBasis& b = it->second;
  double peak = b.peak_tflops;
  if (peak <= 0 && !b.cpu && w.device.rfind("cuda", 0) == 0)
    peak = DenseBf16PeakTflops(w.device_name);
  if (peak <= 0 || b.flops_per_token <= 0) return -1.0;
  // Every rank of a data-parallel run sees the same global record (rank_sample.h): its GPU's
  // share of the throughput is 1/world.
  return ModelFlopsUtilization(run_tokens_per_s / std::max(1, run.workers), b.flops_per_token,
                               peak);
}

void Coordinator::ReportRankMetrics(const RunRecord& run, const WorkerRecord& w, int rank,
                                    const v1::StepMetrics& m) {
  if (opt_.aggregates == nullptr) return;
  RankStepSample s;
  s.step = m.step();
  s.tokens_per_s = m.tokens_per_second() / std::max(1, run.workers);
  s.step_seconds = m.step_seconds();
  s.mfu = RankMfu(run, w, m.tokens_per_second());
  opt_.aggregates->ReportRank(run.id, rank, s);
}

void Coordinator::MarkWorkerUp(const std::string& run_id, int rank, bool up) {
  if (opt_.aggregates) opt_.aggregates->SetWorkerUp(run_id, rank, up);
}

Status Coordinator::AppendRunEvent(RunRecord* run, const std::string& message) {
  EventRecord e;
  e.run_id = run->id;
  e.time_ms = NowMs();
  e.state = run->state;
  e.message = message;
  FORGE_RETURN_IF_ERROR(store_->AppendEvent(e).status());
  changed_.notify_all();
  return Status::Ok();
}

Status Coordinator::WatchStragglers(RunRecord* run, const WorkerRecord& w, int rank,
                                    const v1::StepMetrics& m) {
  auto it = straggler_cfg_.find(run->id);
  if (it == straggler_cfg_.end()) {
    StragglerConfig c;
    if (auto cfg = ParseRunConfig(run->spec_yaml, run->id + " spec"); cfg.ok()) {
      c.threshold = cfg->train.straggler_threshold;
      c.reports = cfg->train.straggler_reports;
    }
    it = straggler_cfg_.emplace(run->id, c).first;
  }
  const StragglerConfig& c = it->second;
  for (const StragglerChange& ch :
       stragglers_.Report(run->id, rank, m.step(), m.step_seconds(), m.comm_wait_seconds(),
                          c.threshold, c.reports)) {
    if (opt_.aggregates) opt_.aggregates->SetStraggler(run->id, ch.rank, ch.straggling);
    std::string msg = ch.message;
    if (ch.rank == rank) msg += " (worker " + w.id + ")";
    FORGE_RETURN_IF_ERROR(AppendRunEvent(run, msg));
  }
  return Status::Ok();
}

Status Coordinator::RecordWorkerEvents(RunRecord* run, const v1::HeartbeatRequest& req) {
  if (req.rank() != 0) return Status::Ok();
  for (const std::string& e : req.events()) {
    FORGE_RETURN_IF_ERROR(AppendRunEvent(run, e));
    // The trainer's rollback lines say "N loss spikes in a row (steps A-B): ..."
    if (e.find("loss spikes in a row") != std::string::npos) spike_warning_[run->id] = e;
  }
  return Status::Ok();
}

std::vector<std::string> Coordinator::PlacedWorkers(const RunRecord& run) const {
  std::vector<std::string> ids(std::max(0, run.workers));
  for (const auto& [id, w] : workers_)
    if (w.rec.run_id == run.id && w.rec.attempt == run.attempt && w.rec.rank >= 0 &&
        w.rec.rank < run.workers)
      ids[w.rec.rank] = id;
  return ids;
}

bool Coordinator::Placed(const RunRecord& run) const {
  for (const auto& [id, w] : workers_)
    if (w.rec.run_id == run.id && w.rec.attempt == run.attempt) return true;
  return false;
}

bool Coordinator::FullWorldBack(const RunRecord& run, const std::vector<PoolWorker>& idle,
                                int requested) const {
  if (!PlaceRun(idle, requested).worker_ids.empty()) return true;
  int have = 0;
  for (const auto& [id, w] : workers_) {
    if (w.rec.run_id != run.id || w.rec.attempt != run.attempt) continue;
    if (!StandaloneGpu(w.rec.device, w.rec.group_id, w.rec.group_size)) return false;
    ++have;
  }
  for (const PoolWorker& w : idle)
    if (StandaloneGpu(w.device, w.group_id, w.group_size)) ++have;
  return have >= requested;
}

void Coordinator::ReleaseWorkers(const std::string& run_id) {
  for (auto it = workers_.begin(); it != workers_.end();) {
    if (it->second.rec.run_id == run_id) {
      (void)store_->DeleteWorker(it->first);
      it = workers_.erase(it);
    } else {
      ++it;
    }
  }
  done_.erase(run_id);
}

std::vector<PoolWorker> Coordinator::IdlePool() const {
  std::vector<const LiveWorker*> idle;
  for (const auto& [wid, w] : workers_)
    if (w.rec.run_id.empty() && !w.from_state) idle.push_back(&w);  // heard from: alive
  std::sort(idle.begin(), idle.end(), [](const LiveWorker* a, const LiveWorker* b) {
    return a->rec.joined_ms != b->rec.joined_ms ? a->rec.joined_ms < b->rec.joined_ms
                                                : a->rec.id < b->rec.id;
  });
  std::vector<PoolWorker> pool;
  for (const LiveWorker* w : idle)
    pool.push_back({w->rec.id, w->rec.device, w->rec.group_id, w->rec.group_rank,
                    w->rec.group_size, w->rec.host});
  return pool;
}

void Coordinator::Schedule() {
  for (const std::string& id : run_order_) {
    RunRecord& run = runs_[id];
    if (run.state != RunState::kPending && run.state != RunState::kRestarting) continue;
    // Again for every run: placing one takes its workers out of the pool.
    const std::vector<PoolWorker> pool = IdlePool();
    const ElasticBasis& e = Elastic(run);
    Placement p = PlaceRun(pool, e.requested);
    std::string elastic_note;
    if (p.worker_ids.empty() && run.state == RunState::kRestarting && e.min < e.requested) {
      // After a loss the full world gets elastic_grace_s to come back; then the run goes on
      // with the largest world down to min_workers that keeps the global batch whole.
      auto since = short_since_.try_emplace(id, Clock::now()).first->second;
      if (Clock::now() - since < std::chrono::duration<double>(e.grace_s)) continue;
      for (int w = e.requested - 1; w >= e.min && p.worker_ids.empty(); --w)
        if (w % e.world_step == 0 && e.global_batch % (int64_t{e.micro_batch} * w) == 0)
          p = PlaceRun(pool, w);
      if (!p.worker_ids.empty()) {
        const int w = int(p.worker_ids.size());
        elastic_note = "elastic: " + std::to_string(e.requested) + " requested, " +
                       std::to_string(w) + " available past train.elastic_grace_s (" +
                       ShortNum(e.grace_s) + " s), train.min_workers " + std::to_string(e.min) +
                       "; global batch " + std::to_string(e.global_batch) + " kept as " +
                       std::to_string(e.global_batch / (int64_t{e.micro_batch} * w)) +
                       " accumulation step(s) of " + std::to_string(e.micro_batch) +
                       " per rank";
      }
    }
    if (p.worker_ids.empty()) continue;
    short_since_.erase(id);
    if (Status s = Place(&run, p.worker_ids, elastic_note); !s.ok())
      (void)SetState(&run, RunState::kFailed, "placement failed: " + s.ToString(), "");
  }
}

Status Coordinator::Place(RunRecord* run, const std::vector<std::string>& worker_ids,
                          const std::string& note) {
  // Resolve where this attempt starts.
  std::string from = "a fresh start";
  if (!run->resume.empty() && run->resume.front() != '/') {
    FORGE_ASSIGN_OR_RETURN(int64_t want, ParseCheckpointName(run->resume, "resume"));
    FORGE_ASSIGN_OR_RETURN(std::vector<CheckpointRecord> cks, store_->Checkpoints(run->id));
    const CheckpointRecord* pick = nullptr;
    for (const CheckpointRecord& c : cks)
      if (want < 0 || c.step == want) pick = &c;
    if (pick == nullptr && want >= 0)
      return Status::NotFound("checkpoint step_" + std::to_string(want) + " of run " + run->id);
    if (pick != nullptr) {
      // The workers move newer checkpoints aside (ResumeTraining); forget them here too.
      for (const CheckpointRecord& c : cks)
        if (c.step > pick->step) FORGE_RETURN_IF_ERROR(store_->DeleteCheckpoint(run->id, c.step));
      run->resume = fs::absolute(pick->dir).string();
      from = "step_" + std::to_string(pick->step);
    } else {
      run->resume.clear();
    }
  } else if (!run->resume.empty()) {
    from = run->resume;
  }
  const int before = run->workers;
  run->workers = int(worker_ids.size());
  run->grow_to = 0;
  run->attempt += 1;
  done_.erase(run->id);
  checkpoint_asks_.erase(run->id);
  for (auto it = comm_ids_.begin(); it != comm_ids_.end();)
    it = it->first.rfind(run->id + "#", 0) == 0 ? comm_ids_.erase(it) : std::next(it);
  std::string names;
  for (size_t r = 0; r < worker_ids.size(); ++r) {
    LiveWorker& w = workers_.at(worker_ids[r]);
    w.rec.run_id = run->id;
    w.rec.attempt = run->attempt;
    w.rec.rank = int(r);
    w.rec.done_phase = 0;
    w.last_seen = Clock::now();  // its heartbeat clock starts now
    w.progress_step = 0;
    w.progress_at = w.last_seen;  // and its hang clock
    FORGE_RETURN_IF_ERROR(PersistWorker(w.rec));
    names += (r ? ", " : "") + worker_ids[r];
  }
  std::string event = "attempt " + std::to_string(run->attempt) + " placed on " +
                      std::to_string(worker_ids.size()) + " worker(s) [" + names + "] from " +
                      from;
  if (before != run->workers)
    event += " (world " + std::to_string(before) + " -> " + std::to_string(run->workers) +
             (note.empty() ? std::string() : "; " + note) + ")";
  return SetState(run, RunState::kRunning, "", event);
}

const Coordinator::ElasticBasis& Coordinator::Elastic(const RunRecord& run) {
  auto it = elastic_.find(run.id);
  if (it != elastic_.end()) return it->second;
  ElasticBasis b;
  b.requested = b.min = run.workers;
  auto cfg = ParseRunConfig(run.spec_yaml, run.id + " spec");
  if (cfg.ok()) {
    b.requested = cfg->train.workers;
    b.min = std::min(MinWorkers(cfg->train), b.requested);
    b.micro_batch = std::max(1, cfg->batch.micro_batch);
    b.global_batch = cfg->batch.global_batch;
    b.grace_s = cfg->train.elastic_grace_s;
    if (cfg->parallel.mode == ParallelMode::kHsdp)
      b.world_step = std::max(1, cfg->parallel.shard_group_size);
  }
  return elastic_.emplace(run.id, b).first->second;
}

void Coordinator::GrowBack() {
  const std::vector<PoolWorker> pool = IdlePool();
  for (const std::string& id : run_order_) {
    RunRecord& run = runs_[id];
    if (run.state != RunState::kRunning || run.grow_to > 0 || !Placed(run)) continue;
    const ElasticBasis& e = Elastic(run);
    if (run.workers >= e.requested) continue;
    if (!FullWorldBack(run, pool, e.requested)) continue;
    // The full world is back: the shrunk placement saves a checkpoint and ends (STOP), then
    // the run is placed on the full world from it (FinishIfDone).
    run.grow_to = e.requested;
    run.updated_ms = NowMs();
    if (!store_->UpdateRun(run).ok()) continue;
    EventRecord ev;
    ev.run_id = id;
    ev.time_ms = run.updated_ms;
    ev.state = run.state;
    ev.message = std::to_string(e.requested) + " workers available again: world " +
                 std::to_string(run.workers) + " (at step " + std::to_string(run.step) +
                 ") saves a checkpoint and stops to grow back to " +
                 std::to_string(e.requested);
    (void)store_->AppendEvent(ev);
    changed_.notify_all();
    return;  // one at a time: the pool it saw is spoken for
  }
}

void Coordinator::FillAssignment(const RunRecord& run, const WorkerRecord& w,
                                 v1::Assignment* a) const {
  a->set_run_id(run.id);
  a->set_attempt(run.attempt);
  a->set_rank(w.rank);
  a->set_world(run.workers);
  a->set_spec_yaml(run.spec_yaml);
  a->set_resume_checkpoint(run.resume.empty() || run.resume.front() != '/' ? "" : run.resume);
  int64_t step = 0;
  if (!a->resume_checkpoint().empty()) {
    const std::string base = fs::path(a->resume_checkpoint()).filename().string();
    if (base.rfind("step_", 0) == 0) step = std::atoll(base.c_str() + 5);
  }
  a->set_resume_step(step);
  a->set_comm_id_from_coordinator(run.workers > 1 && (w.group_size <= 1 || w.group_id.empty()));
  a->set_heartbeat_interval_ms(opt_.heartbeat_interval_ms);
  // The data plan: the resumed checkpoint's recorded one, else the spec's start. A checkpoint
  // the store does not know (one the worker resolves itself) gets the start plan, which the
  // worker then rebases from the checkpoint's own record.
  StatusOr<v1::DataPlan> plan = StartPlan(run.id, run.spec_yaml);
  if (!a->resume_checkpoint().empty()) {
    auto cks = store_->Checkpoints(run.id);
    if (cks.ok())
      for (const CheckpointRecord& c : *cks)
        if (c.dir == a->resume_checkpoint()) plan = CheckpointPlan(run.id, run.spec_yaml, c);
  }
  if (plan.ok()) *a->mutable_data_plan() = std::move(plan).value();
}

Status Coordinator::LoseRun(RunRecord* run, const std::string& why) {
  ReleaseWorkers(run->id);
  run->grow_to = 0;
  short_since_[run->id] = Clock::now();  // elastic runs: the grace for the full world
  if (run->state == RunState::kCheckpointing) {
    run->resume = "latest";
    return SetState(run, RunState::kStopped,
                    "stop requested, but " + why + " before the checkpoint: resume continues "
                    "from the latest committed checkpoint", "");
  }
  if (run->restarts >= run->max_restarts)
    return SetState(run, RunState::kFailed,
                    why + "; gave up after " + std::to_string(run->restarts) +
                        " restart(s) (train.max_restarts " + std::to_string(run->max_restarts) +
                        ")",
                    "");
  run->restarts += 1;
  run->resume = "latest";
  const Status s = SetState(run, RunState::kRestarting, why,
                            why + "; restart " + std::to_string(run->restarts) + " of " +
                                std::to_string(run->max_restarts) +
                                " from the latest committed checkpoint");
  Schedule();
  return s;
}

Status Coordinator::FinishIfDone(RunRecord* run) {
  const auto& done = done_[run->id];
  if (int(done.size()) < run->workers) return Status::Ok();
  bool all_completed = true;
  for (const auto& [rank, phase] : done) all_completed &= phase == v1::DONE_COMPLETED;
  const int64_t step = run->step;
  done_.erase(run->id);
  // The placement's workers are idle again (they Join for more work).
  for (auto& [id, w] : workers_)
    if (w.rec.run_id == run->id) {
      w.rec.run_id.clear();
      w.rec.attempt = 0;
      w.rec.rank = 0;
      w.rec.done_phase = 0;
      FORGE_RETURN_IF_ERROR(PersistWorker(w.rec));
    }
  if (all_completed)
    return SetState(run, RunState::kCompleted, "", "completed at step " + std::to_string(step));
  run->resume = "latest";
  if (run->grow_to > 0 && run->state == RunState::kRunning) {
    // Stopped to grow back (GrowBack): placed again at once, not counted as a restart.
    const std::string why = "world " + std::to_string(run->workers) + " stopped at step " +
                            std::to_string(step) + " with a checkpoint to grow back to " +
                            std::to_string(run->grow_to) + " workers";
    short_since_[run->id] = Clock::now();
    const Status s = SetState(run, RunState::kRestarting, why, why);
    Schedule();
    return s;
  }
  run->grow_to = 0;
  return SetState(run, RunState::kStopped, "stopped on request",
                  "stopped at step " + std::to_string(step) + " after saving a checkpoint");
}

void Coordinator::FillRun(const RunRecord& r, v1::Run* out) {
  out->Clear();
  out->set_id(r.id);
  out->set_name(r.name);
  out->set_state(static_cast<v1::RunState>(r.state));
  out->set_state_reason(r.reason);
  out->set_spec_yaml(r.spec_yaml);
  out->set_workers(r.workers);
  out->set_attempt(r.attempt);
  out->set_restarts(r.restarts);
  out->set_max_restarts(r.max_restarts);
  out->set_step(r.step);
  out->set_total_steps(r.total_steps);
  if (auto it = latest_metrics_.find(r.id); it != latest_metrics_.end())
    *out->mutable_last_metrics() = ToProto(it->second);
  int64_t latest = -1;
  if (auto cks = store_->Checkpoints(r.id); cks.ok() && !cks->empty()) latest = cks->back().step;
  out->set_latest_checkpoint_step(latest);
  out->set_run_dir(r.run_dir);
  out->set_created_unix_ms(r.created_ms);
  out->set_updated_unix_ms(r.updated_ms);
  if (Active(r.state))
    for (const std::string& id : PlacedWorkers(r)) out->add_worker_ids(id);
  for (const std::string& w : stragglers_.Warnings(r.id)) out->add_warnings(w);
  if (auto it = spike_warning_.find(r.id); it != spike_warning_.end())
    out->add_warnings(it->second);
}

// ---------------------------------------------------------------------------------------------
// User API

grpc::Status Coordinator::SubmitRun(const v1::SubmitRunRequest& req, v1::Run* out) {
  const std::string source = req.source().empty() ? "<spec>" : TextExcerpt(req.source(), 256);
  std::lock_guard<std::mutex> l(mu_);
  // Validate with a placeholder run dir first: the id depends on the spec's name.
  auto probe = ParseSpec(req.spec_yaml(), source, opt_.runs_dir + "/probe", opt_);
  if (!probe.ok()) return ToGrpc(probe.status());
  std::string id;
  do id = NewRunId(probe->name);
  while (runs_.count(id));
  RunRecord r;
  r.id = id;
  r.name = probe->name;
  r.run_dir = opt_.runs_dir + "/" + id;
  auto cfg = ParseSpec(req.spec_yaml(), source, r.run_dir, opt_);
  if (!cfg.ok()) return ToGrpc(cfg.status());
  r.run_dir = cfg->train.run_dir;
  r.spec_yaml = RunConfigToYaml(*cfg);
  r.workers = cfg->train.workers;
  r.max_restarts = cfg->train.max_restarts;
  r.total_steps = cfg->schedule.total_steps;
  r.state = RunState::kPending;
  r.created_ms = r.updated_ms = NowMs();
  if (Status s = store_->InsertRun(&r); !s.ok()) return ToGrpc(s);
  runs_[id] = r;
  run_order_.push_back(id);
  RunRecord& run = runs_[id];
  if (Status s = SetState(&run, RunState::kPending, "",
                          "submitted: " + std::to_string(run.workers) + " worker(s), " +
                              std::to_string(run.total_steps) + " steps");
      !s.ok())
    return ToGrpc(s);
  Schedule();
  FillRun(run, out);
  return grpc::Status::OK;
}

grpc::Status Coordinator::StopRun(const v1::StopRunRequest& req, v1::Run* out) {
  std::lock_guard<std::mutex> l(mu_);
  RunRecord* run = FindRun(req.run_id());
  if (run == nullptr) return NotFoundRun(req.run_id());
  Status s;
  if (IsTerminal(run->state)) {
    return {grpc::StatusCode::FAILED_PRECONDITION,
            "run " + run->id + " is already " + RunStateName(run->state)};
  } else if (!Active(run->state) || !Placed(*run)) {
    run->resume = run->attempt > 0 ? "latest" : "";
    s = SetState(run, RunState::kStopped, "stopped on request before it was placed", "");
  } else if (req.immediate()) {
    ReleaseWorkers(run->id);  // their next heartbeat answers ABORT
    run->resume = "latest";
    s = SetState(run, RunState::kStopped, "stopped immediately on request (no checkpoint)", "");
  } else if (run->state == RunState::kRunning) {
    s = SetState(run, RunState::kCheckpointing, "stop requested: saving a checkpoint", "");
  }
  if (!s.ok()) return ToGrpc(s);
  FillRun(*run, out);
  return grpc::Status::OK;
}

grpc::Status Coordinator::ResumeRun(const v1::ResumeRunRequest& req, v1::Run* out) {
  std::lock_guard<std::mutex> l(mu_);
  RunRecord* run = FindRun(req.run_id());
  if (run == nullptr) return NotFoundRun(req.run_id());
  if (run->state != RunState::kStopped && run->state != RunState::kFailed)
    return {grpc::StatusCode::FAILED_PRECONDITION,
            "run " + run->id + " is " + RunStateName(run->state) +
                ": only STOPPED or FAILED runs can be resumed"};
  auto want = ParseCheckpointName(req.checkpoint(), "checkpoint");
  if (!want.ok()) return ToGrpc(want.status());
  auto cks = store_->Checkpoints(run->id);
  if (!cks.ok()) return ToGrpc(cks.status());
  if (*want >= 0) {
    bool found = false;
    for (const CheckpointRecord& c : *cks) found |= c.step == *want;
    if (!found)
      return {grpc::StatusCode::NOT_FOUND,
              "run " + run->id + " has no committed checkpoint step_" + std::to_string(*want)};
  }
  if (req.workers() < 0)
    return {grpc::StatusCode::INVALID_ARGUMENT, "workers: must be >= 0"};
  if (req.workers() > 0) {
    auto cfg = ParseRunConfig(run->spec_yaml, run->id + " spec");
    if (!cfg.ok()) return ToGrpc(cfg.status());
    const int64_t per_step = int64_t{cfg->batch.micro_batch} * req.workers();
    if (cfg->batch.global_batch % per_step != 0)
      return {grpc::StatusCode::INVALID_ARGUMENT,
              "workers: batch.global_batch (" + std::to_string(cfg->batch.global_batch) +
                  ") must be a multiple of batch.micro_batch * workers (" +
                  std::to_string(per_step) + ")"};
    if (cfg->parallel.mode == ParallelMode::kHsdp &&
        req.workers() % cfg->parallel.shard_group_size != 0)
      return {grpc::StatusCode::INVALID_ARGUMENT,
              "workers: parallel.shard_group_size (" +
                  std::to_string(cfg->parallel.shard_group_size) + ") must divide workers (" +
                  std::to_string(req.workers()) + ")"};
    cfg->train.workers = req.workers();
    cfg->train.min_workers = std::min(cfg->train.min_workers, req.workers());
    if (cfg->batch.global_batch % (int64_t{cfg->batch.micro_batch} * MinWorkers(cfg->train)) != 0)
      cfg->train.min_workers = 0;  // not elastic below a world that cannot keep the batch
    run->spec_yaml = RunConfigToYaml(*cfg);
    run->workers = req.workers();
    elastic_.erase(run->id);
  }
  run->resume = *want >= 0 ? "step_" + std::to_string(*want) : (cks->empty() ? "" : "latest");
  if (run->state == RunState::kFailed) run->restarts = 0;
  const std::string from = run->resume.empty() ? "the start (no checkpoint)" : run->resume;
  if (Status s = SetState(run, RunState::kPending, "",
                          "resume requested from " + from + " on " +
                              std::to_string(run->workers) + " worker(s)");
      !s.ok())
    return ToGrpc(s);
  Schedule();
  FillRun(*run, out);
  return grpc::Status::OK;
}

grpc::Status Coordinator::CheckpointRun(const v1::CheckpointRunRequest& req, v1::Run* out) {
  std::lock_guard<std::mutex> l(mu_);
  RunRecord* run = FindRun(req.run_id());
  if (run == nullptr) return NotFoundRun(req.run_id());
  if (run->state != RunState::kRunning || !Placed(*run))
    return {grpc::StatusCode::FAILED_PRECONDITION,
            "run " + run->id + " is " + RunStateName(run->state) + ": only a RUNNING run can "
            "checkpoint on request"};
  // Every rank hears it (the trainer needs only one to ask; all keep their flags in step).
  std::set<int>& ranks = checkpoint_asks_[run->id];
  for (int r = 0; r < run->workers; ++r) ranks.insert(r);
  EventRecord e;
  e.run_id = run->id;
  e.time_ms = NowMs();
  e.state = run->state;
  e.message = "checkpoint requested at step " + std::to_string(run->step);
  if (Status s = store_->AppendEvent(e).status(); !s.ok()) return ToGrpc(s);
  changed_.notify_all();
  FillRun(*run, out);
  return grpc::Status::OK;
}

grpc::Status Coordinator::GetRun(const v1::GetRunRequest& req, v1::Run* out) {
  std::lock_guard<std::mutex> l(mu_);
  RunRecord* run = FindRun(req.run_id());
  if (run == nullptr) return NotFoundRun(req.run_id());
  FillRun(*run, out);
  return grpc::Status::OK;
}

grpc::Status Coordinator::ListRuns(const v1::ListRunsRequest& req, v1::ListRunsResponse* out) {
  std::lock_guard<std::mutex> l(mu_);
  for (const std::string& id : run_order_) {
    const RunRecord& r = runs_[id];
    if (req.active_only() && IsTerminal(r.state)) continue;
    FillRun(r, out->add_runs());
  }
  return grpc::Status::OK;
}

grpc::Status Coordinator::ListCheckpoints(const v1::ListCheckpointsRequest& req,
                                          v1::ListCheckpointsResponse* out) {
  std::lock_guard<std::mutex> l(mu_);
  if (FindRun(req.run_id()) == nullptr) return NotFoundRun(req.run_id());
  auto cks = store_->Checkpoints(req.run_id());
  if (!cks.ok()) return ToGrpc(cks.status());
  for (const CheckpointRecord& c : *cks) {
    v1::Checkpoint* p = out->add_checkpoints();
    p->set_step(c.step);
    p->set_dir(c.dir);
    p->set_world_size(c.world);
    p->set_bytes(c.bytes);
    p->set_committed_unix_ms(c.committed_ms);
  }
  return grpc::Status::OK;
}

grpc::Status Coordinator::GetDataPlan(const v1::GetDataPlanRequest& req, v1::DataPlan* out) {
  std::lock_guard<std::mutex> l(mu_);
  RunRecord* run = FindRun(req.run_id());
  if (run == nullptr) return NotFoundRun(req.run_id());
  auto cks = store_->Checkpoints(run->id);
  if (!cks.ok()) return ToGrpc(cks.status());
  auto plan = cks->empty() ? StartPlan(run->id, run->spec_yaml)
                           : CheckpointPlan(run->id, run->spec_yaml, cks->back());
  if (!plan.ok()) return ToGrpc(plan.status());
  *out = std::move(plan).value();
  return grpc::Status::OK;
}

grpc::Status Coordinator::ExportCheckpoint(const v1::ExportCheckpointRequest& req,
                                           v1::ExportCheckpointResponse* out) {
  std::string dir, path;
  int64_t step = 0;
  {
    std::lock_guard<std::mutex> l(mu_);
    RunRecord* run = FindRun(req.run_id());
    if (run == nullptr) return NotFoundRun(req.run_id());
    auto want = ParseCheckpointName(req.checkpoint(), "checkpoint");
    if (!want.ok()) return ToGrpc(want.status());
    // A bad output name is refused whatever the run holds.
    if (!req.output().empty()) {
      auto checked = ResolveInside(run->run_dir + "/exports", req.output(), "output");
      if (!checked.ok()) return ToGrpc(checked.status());
    }
    auto cks = store_->Checkpoints(run->id);
    if (!cks.ok()) return ToGrpc(cks.status());
    for (const CheckpointRecord& c : *cks)
      if (*want < 0 || c.step == *want) {
        dir = c.dir;
        step = c.step;
      }
    if (dir.empty())
      return {grpc::StatusCode::NOT_FOUND,
              "run " + run->id + " has no committed checkpoint " +
                  (*want < 0 ? std::string("yet") : "step_" + std::to_string(*want))};
    if (!req.format().empty() && req.format() != "forge" && req.format() != "hf")
      return ToGrpc(
          Status::Invalid("format: expected forge or hf, got " + TextExcerpt(req.format())));
    const std::string name =
        !req.output().empty() ? req.output()
        : req.format() == "hf" ? "step_" + std::to_string(step) + "-hf"
                               : "step_" + std::to_string(step) + ".safetensors";
    auto resolved = ResolveInside(run->run_dir + "/exports", name, "output");
    if (!resolved.ok()) return ToGrpc(resolved.status());
    path = *resolved;
  }
  // The export reads the whole checkpoint: outside the lock.
  std::error_code ec;
  fs::create_directories(fs::path(path).parent_path(), ec);
  if (ec) return ToGrpc(Status::IoError("cannot create " + fs::path(path).parent_path().string()));
  const SafetensorsDtype dtype = req.bf16() ? SafetensorsDtype::kBF16 : SafetensorsDtype::kF32;
  if (req.format() == "hf") {
    auto sum = ExportModelHf(dir, path, dtype, "");
    if (!sum.ok()) return ToGrpc(sum.status());
    out->set_bytes(sum->tensor_bytes);
  } else {
    Status s = ExportCheckpointSafetensors(dir, path, dtype);
    if (!s.ok()) return ToGrpc(s);
    out->set_bytes(fs::file_size(path, ec));
  }
  out->set_path(path);
  out->set_step(step);
  return grpc::Status::OK;
}

grpc::Status Coordinator::GetRunHistory(const v1::GetRunHistoryRequest& req,
                                        v1::RunHistory* out) {
  std::lock_guard<std::mutex> l(mu_);
  RunRecord* run = FindRun(req.run_id());
  if (run == nullptr) return NotFoundRun(req.run_id());
  auto metrics = store_->MetricsAfter(run->id, 0);
  if (!metrics.ok()) return ToGrpc(metrics.status());
  auto events = store_->EventsAfter(run->id, 0);
  if (!events.ok()) return ToGrpc(events.status());
  auto cks = store_->Checkpoints(run->id);
  if (!cks.ok()) return ToGrpc(cks.status());
  FillRun(*run, out->mutable_run());
  // Stored in write order; a redone step replaced its row, so sort by step for the charts.
  std::vector<MetricRecord> steps = std::move(metrics).value();
  std::stable_sort(steps.begin(), steps.end(),
                   [](const MetricRecord& a, const MetricRecord& b) { return a.step < b.step; });
  for (const MetricRecord& m : steps) *out->add_steps() = ToProto(m);
  for (const EventRecord& e : *events) *out->add_events() = ToProto(e);
  for (const CheckpointRecord& c : *cks) *out->add_checkpoints() = ToProto(c);
  return grpc::Status::OK;
}

grpc::Status Coordinator::WatchRun(const v1::WatchRunRequest& req,
                                   const std::function<bool(const v1::RunUpdate&)>& send,
                                   const std::function<bool()>& cancelled) {
  int64_t last_event = 0, last_metric = 0;
  {
    std::lock_guard<std::mutex> l(mu_);
    if (FindRun(req.run_id()) == nullptr) return NotFoundRun(req.run_id());
    if (!req.history()) {
      // Start with the newest event, so a watcher sees how the run got where it is.
      auto events = store_->EventsAfter(req.run_id(), 0);
      if (events.ok() && events->size() >= 2) last_event = (*events)[events->size() - 2].id;
      auto metrics = store_->MetricsAfter(req.run_id(), 0);
      if (metrics.ok())
        for (const MetricRecord& m : *metrics) last_metric = std::max(last_metric, m.seq);
    }
  }
  bool first = true;
  for (;;) {
    v1::RunUpdate update;
    bool ended = false;
    {
      std::unique_lock<std::mutex> l(mu_);
      if (!first) changed_.wait_for(l, std::chrono::milliseconds(500));
      if (shutdown_) return {grpc::StatusCode::UNAVAILABLE, "coordinator shutting down"};
      RunRecord* run = FindRun(req.run_id());
      auto events = store_->EventsAfter(req.run_id(), last_event);
      auto metrics = store_->MetricsAfter(req.run_id(), last_metric);
      if (!events.ok()) return ToGrpc(events.status());
      if (!metrics.ok()) return ToGrpc(metrics.status());
      for (const EventRecord& e : *events) {
        *update.add_events() = ToProto(e);
        last_event = e.id;
      }
      for (const MetricRecord& m : *metrics) {
        *update.add_steps() = ToProto(m);
        last_metric = std::max(last_metric, m.seq);
      }
      if (!first && update.events().empty() && update.steps().empty()) {
        if (cancelled()) return grpc::Status::CANCELLED;
        continue;
      }
      FillRun(*run, update.mutable_run());
      ended = IsTerminal(run->state);
    }
    first = false;
    if (!send(update)) return grpc::Status::CANCELLED;
    if (ended) return grpc::Status::OK;
  }
}

// ---------------------------------------------------------------------------------------------
// Worker API

grpc::Status Coordinator::Join(const v1::JoinRequest& req, v1::JoinResponse* out) {
  if (req.worker_id().empty())
    return {grpc::StatusCode::INVALID_ARGUMENT, "worker_id: must not be empty"};
  std::lock_guard<std::mutex> l(mu_);
  out->set_heartbeat_timeout_ms(opt_.heartbeat_timeout_ms);
  auto it = workers_.find(req.worker_id());
  if (it == workers_.end()) {
    LiveWorker w;
    w.rec.id = req.worker_id();
    w.rec.host = req.host();
    w.rec.device = req.device().empty() ? "cpu" : req.device();
    w.rec.device_name = req.device_name();
    w.rec.group_id = req.group().id();
    w.rec.group_rank = req.group().rank();
    w.rec.group_size = std::max(1, req.group().size());
    w.rec.joined_ms = NowMs();
    w.last_seen = Clock::now();
    if (Status s = PersistWorker(w.rec); !s.ok()) return ToGrpc(s);
    it = workers_.emplace(w.rec.id, std::move(w)).first;
  }
  it->second.last_seen = Clock::now();
  it->second.from_state = false;
  if (!req.device_name().empty() && req.device_name() != it->second.rec.device_name) {
    it->second.rec.device_name = req.device_name();  // e.g. a store from before it was kept
    if (Status s = PersistWorker(it->second.rec); !s.ok()) return ToGrpc(s);
  }
  if (it->second.rec.run_id.empty()) Schedule();
  // Idempotent: a worker whose answer got lost asks again and gets the same placement.
  const WorkerRecord& w = it->second.rec;
  if (!w.run_id.empty()) {
    RunRecord* run = FindRun(w.run_id);
    const auto done = done_.find(w.run_id);
    const bool reported_done = done != done_.end() && done->second.count(w.rank) > 0;
    if (run != nullptr && Active(run->state) && run->attempt == w.attempt && !reported_done) {
      out->set_assigned(true);
      FillAssignment(*run, w, out->mutable_assignment());
      return grpc::Status::OK;
    }
  }
  out->set_assigned(false);
  out->set_retry_after_ms(opt_.join_retry_ms);
  return grpc::Status::OK;
}

template <typename WorkerRequest>
grpc::Status Coordinator::CheckPlacement(const WorkerRequest& req, LiveWorker** worker,
                                         RunRecord** run) {
  const std::string& worker_id = req.worker_id();
  const std::string& run_id = req.run_id();
  const int attempt = req.attempt(), rank = req.rank();
  auto it = workers_.find(worker_id);
  if (it == workers_.end())
    return {grpc::StatusCode::FAILED_PRECONDITION,
            "worker " + worker_id + " is not in the pool (its placement was dropped)"};
  *worker = &it->second;
  *run = FindRun(run_id);
  if (*run == nullptr) return NotFoundRun(run_id);
  const WorkerRecord& w = it->second.rec;
  if (w.run_id != run_id || w.attempt != attempt || w.rank != rank ||
      (*run)->attempt != attempt || !Active((*run)->state))
    return {grpc::StatusCode::FAILED_PRECONDITION,
            "placement " + run_id + " attempt " + std::to_string(attempt) + " rank " +
                std::to_string(rank) + " is no longer current (run is " +
                RunStateName((*run)->state) + ", attempt " + std::to_string((*run)->attempt) +
                ")"};
  it->second.last_seen = Clock::now();
  it->second.from_state = false;
  return grpc::Status::OK;
}

grpc::Status Coordinator::Heartbeat(const v1::HeartbeatRequest& req, v1::HeartbeatResponse* out) {
  std::lock_guard<std::mutex> l(mu_);
  auto it = workers_.find(req.worker_id());
  if (it != workers_.end()) {
    it->second.last_seen = Clock::now();
    it->second.from_state = false;
  }
  if (req.run_id().empty()) {  // an idle worker's ping
    out->set_command(it == workers_.end() ? v1::ABORT : v1::CONTINUE);
    return grpc::Status::OK;
  }
  LiveWorker* worker = nullptr;
  RunRecord* run = nullptr;
  grpc::Status placed = CheckPlacement(req, &worker, &run);
  if (!placed.ok()) {
    out->set_command(v1::ABORT);
    out->set_reason(placed.error_message());
    return grpc::Status::OK;
  }
  MarkWorkerUp(run->id, req.rank(), req.phase() != v1::DONE_FAILED);
  const int64_t progress = std::max<int64_t>(req.step_done(), req.metrics().step());
  if (progress > worker->progress_step) {
    worker->progress_step = progress;
    worker->progress_at = Clock::now();
  }
  if (req.has_metrics() && req.metrics().step() > 0) {
    ReportRankMetrics(*run, worker->rec, req.rank(), req.metrics());
    if (Status s = WatchStragglers(run, worker->rec, req.rank(), req.metrics()); !s.ok())
      return ToGrpc(s);
  }
  if (Status s = RecordWorkerEvents(run, req); !s.ok()) return ToGrpc(s);
  // Rank 0's records are the run's history: the ones logged since its last report, then the
  // newest.
  std::vector<const v1::StepMetrics*> records;
  if (req.rank() == 0) {
    for (const v1::StepMetrics& e : req.earlier_metrics()) records.push_back(&e);
    if (req.has_metrics()) records.push_back(&req.metrics());
  }
  bool stored = false;
  for (const v1::StepMetrics* p : records) {
    if (p->step() <= 0) continue;
    const v1::StepMetrics& rec = *p;
    MetricRecord m;
    m.run_id = run->id;
    m.step = rec.step();
    m.loss = rec.loss();
    m.val_loss = rec.val_loss();
    m.grad_norm = rec.grad_norm();
    m.lr = rec.lr();
    m.tokens_per_s = rec.tokens_per_second();
    m.mfu = std::max(0.0, RankMfu(*run, worker->rec, rec.tokens_per_second()));
    m.step_seconds = rec.step_seconds();
    m.gpu_allocated_bytes = rec.gpu_allocated_bytes();
    m.gpu_reserved_bytes = rec.gpu_reserved_bytes();
    m.gpu_peak_bytes = rec.gpu_peak_bytes();
    m.initial_val_loss = std::max(0.0f, rec.initial_val_loss());
    m.time_ms = NowMs();
    auto last = latest_metrics_.find(run->id);
    if (last == latest_metrics_.end() || last->second.step != m.step) {
      if (Status s = store_->PutMetrics(&m); !s.ok()) return ToGrpc(s);
      latest_metrics_[run->id] = m;
      run->step = m.step;
      run->updated_ms = m.time_ms;
      stored = true;
      for (const v1::EvalSample& sample : rec.samples()) {
        EventRecord e;
        e.run_id = run->id;
        e.time_ms = m.time_ms;
        e.state = run->state;
        e.message = SampleEventText(m.step, sample.prompt(), sample.completion());
        if (Status s = store_->AppendEvent(e).status(); !s.ok()) return ToGrpc(s);
      }
    }
  }
  if (stored) {
    if (Status s = store_->UpdateRun(*run); !s.ok()) return ToGrpc(s);
    changed_.notify_all();
  }
  const v1::WorkerPhase phase = req.phase();
  if (phase == v1::DONE_FAILED) {
    const std::string why = "rank " + std::to_string(req.rank()) + " (worker " + req.worker_id() +
                            ") failed: " + req.message();
    if (Status s = LoseRun(run, why); !s.ok()) return ToGrpc(s);
    out->set_command(v1::ABORT);
    out->set_reason(why);
    return grpc::Status::OK;
  }
  if (phase == v1::DONE_COMPLETED || phase == v1::DONE_STOPPED) {
    done_[run->id][req.rank()] = phase;
    worker->rec.done_phase = phase;  // survives a coordinator restart
    if (Status s = PersistWorker(worker->rec); !s.ok()) return ToGrpc(s);
    if (Status s = FinishIfDone(run); !s.ok()) return ToGrpc(s);
    out->set_command(v1::CONTINUE);
    return grpc::Status::OK;
  }
  if (run->state == RunState::kCheckpointing || run->grow_to > 0) {
    out->set_command(v1::STOP);
    if (run->grow_to > 0) out->set_reason("growing back to " + std::to_string(run->grow_to) +
                                          " workers from a checkpoint");
    return grpc::Status::OK;
  }
  auto ask = checkpoint_asks_.find(run->id);
  if (ask != checkpoint_asks_.end() && ask->second.erase(req.rank()) > 0) {
    if (ask->second.empty()) checkpoint_asks_.erase(ask);
    out->set_command(v1::CHECKPOINT);
    out->set_reason("checkpoint requested");
    return grpc::Status::OK;
  }
  out->set_command(v1::CONTINUE);
  return grpc::Status::OK;
}

grpc::Status Coordinator::CommitCheckpoint(const v1::CommitCheckpointRequest& req,
                                           v1::CommitCheckpointResponse* out) {
  std::lock_guard<std::mutex> l(mu_);
  LiveWorker* worker = nullptr;
  RunRecord* run = nullptr;
  grpc::Status placed = CheckPlacement(req, &worker, &run);
  if (!placed.ok()) return placed;
  auto report = DecodeShardReport(req.shard_report());
  if (!report.ok()) return ToGrpc(report.status().Annotate("shard_report"));
  if (report->rank != req.rank() || report->step != req.step() || report->world != run->workers)
    return {grpc::StatusCode::INVALID_ARGUMENT,
            "shard_report: rank/step/world (" + std::to_string(report->rank) + ", " +
                std::to_string(report->step) + ", " + std::to_string(report->world) +
                ") do not match the request (" + std::to_string(req.rank()) + ", " +
                std::to_string(req.step()) + ", " + std::to_string(run->workers) + ")"};
  if (Status s = store_->PutShardReport(run->id, run->attempt, req.step(), req.rank(),
                                        req.shard_report());
      !s.ok())
    return ToGrpc(s);
  auto texts = store_->ShardReports(run->id, run->attempt, req.step());
  if (!texts.ok()) return ToGrpc(texts.status());
  out->set_reported(int(texts->size()));
  if (int(texts->size()) < run->workers) return grpc::Status::OK;

  // Every rank reported: write the manifest (the checkpoint exists from now on).
  auto cfg = ParseRunConfig(run->spec_yaml, run->id + " spec");
  if (!cfg.ok()) return ToGrpc(cfg.status());
  std::vector<ShardReport> reports;
  uint64_t bytes = 0;
  for (const auto& [rank, text] : *texts) {
    auto d = DecodeShardReport(text);
    if (!d.ok()) return ToGrpc(d.status().Annotate("report of rank " + std::to_string(rank)));
    bytes += d->size;
    reports.push_back(std::move(d).value());
  }
  const std::string root = CheckpointRoot(*cfg);
  const std::string dir = StepDir(root, req.step());
  auto existing = ReadManifest(dir);  // a retried last report after a crash: already written
  std::optional<DataUsage> data = existing.ok() ? existing->data : std::nullopt;
  if (!existing.ok() || existing->step != req.step()) {
    auto m = forge::CommitCheckpoint(dir, *cfg, MakeParamLayout(cfg->model), reports);
    if (!m.ok()) return ToGrpc(m.status().Annotate("committing " + dir));
    data = m->data;
  }
  CheckpointRecord c;
  c.run_id = run->id;
  c.step = req.step();
  c.dir = fs::absolute(dir).string();
  c.world = run->workers;
  c.bytes = bytes;
  c.committed_ms = NowMs();
  if (data) c.data = EncodeDataUsage(*data);
  if (Status s = store_->PutCheckpoint(c); !s.ok()) return ToGrpc(s);
  (void)store_->DeleteShardReports(run->id, req.step());
  std::string removed_note;
  auto removed = ApplyRetention(root, cfg->checkpoint.keep_last, cfg->checkpoint.keep_every);
  if (removed.ok()) {
    auto cks = store_->Checkpoints(run->id);
    if (cks.ok())
      for (const CheckpointRecord& k : *cks)
        if (!fs::exists(fs::path(k.dir) / kManifestName)) {
          (void)store_->DeleteCheckpoint(run->id, k.step);
          removed_note = removed_note.empty() ? ", retention removed step_" + std::to_string(k.step)
                                              : removed_note + ", step_" + std::to_string(k.step);
        }
  } else {
    removed_note = " (retention failed: " + removed.status().ToString() + ")";
  }
  EventRecord e;
  e.run_id = run->id;
  e.time_ms = c.committed_ms;
  e.state = run->state;
  e.message = "checkpoint step_" + std::to_string(c.step) + " committed (" +
              std::to_string(reports.size()) + " shards, " + std::to_string(bytes) + " bytes)" +
              removed_note;
  (void)store_->AppendEvent(e);
  changed_.notify_all();
  out->set_committed(true);
  return grpc::Status::OK;
}

grpc::Status Coordinator::ExchangeCommId(const v1::ExchangeCommIdRequest& req,
                                         v1::ExchangeCommIdResponse* out) {
  std::lock_guard<std::mutex> l(mu_);
  LiveWorker* worker = nullptr;
  RunRecord* run = nullptr;
  grpc::Status placed = CheckPlacement(req, &worker, &run);
  if (!placed.ok()) return placed;
  const std::string key = run->id + "#" + std::to_string(run->attempt);
  if (req.rank() == 0) {
    if (req.comm_id().empty())
      return {grpc::StatusCode::INVALID_ARGUMENT, "comm_id: rank 0 must publish a non-empty id"};
    comm_ids_[key] = req.comm_id();
  }
  auto it = comm_ids_.find(key);
  out->set_ready(it != comm_ids_.end());
  if (it != comm_ids_.end()) out->set_comm_id(it->second);
  return grpc::Status::OK;
}

// ---------------------------------------------------------------------------------------------

double Coordinator::HangTimeout(const RunRecord& run) {
  auto it = hang_timeout_s_.find(run.id);
  if (it != hang_timeout_s_.end()) return it->second;
  auto cfg = ParseRunConfig(run.spec_yaml, run.id + " spec");
  const double t = cfg.ok() ? cfg->train.hang_timeout_s : RunConfig{}.train.hang_timeout_s;
  hang_timeout_s_[run.id] = t;
  return t;
}

void Coordinator::DetectHangs(Clock::time_point now) {
  std::vector<std::pair<std::string, std::string>> hung;  // run, why
  for (auto& [id, run] : runs_) {
    if (!Active(run.state)) continue;
    const double limit = HangTimeout(run);
    if (limit <= 0) continue;
    const auto timeout = std::chrono::duration<double>(limit);
    // The stalled ranks of the placement (those that reported their end are not waiting).
    std::vector<const LiveWorker*> stalled;
    for (const auto& [wid, w] : workers_)
      if (w.rec.run_id == id && w.rec.attempt == run.attempt && w.rec.done_phase == 0 &&
          !w.from_state && now - w.progress_at > timeout)
        stalled.push_back(&w);
    if (stalled.empty()) continue;
    // Name the likeliest culprit: the longest silent (a stopped process sends no heartbeats,
    // its peers blocked in a collective still do), then the one furthest behind.
    const LiveWorker* w = *std::min_element(
        stalled.begin(), stalled.end(), [](const LiveWorker* a, const LiveWorker* b) {
          if (a->last_seen != b->last_seen) return a->last_seen < b->last_seen;
          if (a->progress_step != b->progress_step) return a->progress_step < b->progress_step;
          return a->rec.rank < b->rec.rank;
        });
    auto secs = [](Clock::duration d) {
      char buf[32];
      std::snprintf(buf, sizeof buf, "%.1f", std::chrono::duration<double>(d).count());
      return std::string(buf);
    };
    char limit_text[32];
    std::snprintf(limit_text, sizeof limit_text, "%g", limit);
    std::string why = "hang: run " + id + " rank " + std::to_string(w->rec.rank) + " (worker " +
                      w->rec.id + ") made no step progress for " + secs(now - w->progress_at) +
                      " s after step " + std::to_string(w->progress_step) +
                      " (train.hang_timeout_s " + limit_text + ")";
    if (now - w->last_seen > std::chrono::seconds(1))
      why += ", no heartbeat for " + secs(now - w->last_seen) + " s";
    if (stalled.size() > 1)
      why += "; " + std::to_string(stalled.size() - 1) + " other rank(s) stalled with it";
    hung.emplace_back(id, why);
  }
  for (const auto& [run_id, why] : hung) {
    RunRecord* run = FindRun(run_id);
    if (run == nullptr || !Active(run->state)) continue;
    std::fprintf(stderr, "forge-coordinator: %s\n", why.c_str());
    if (opt_.aggregates) opt_.aggregates->CountHang(run_id);
    (void)LoseRun(run, why);
  }
}

Status Coordinator::WorkersExited(const std::string& run_id, int attempt, const std::string& why) {
  std::lock_guard<std::mutex> l(mu_);
  RunRecord* run = FindRun(run_id);
  if (run == nullptr) return Status::NotFound("run " + run_id);
  if (!Active(run->state) || run->attempt != attempt) return Status::Ok();
  return LoseRun(run, why);
}

std::chrono::milliseconds Coordinator::MonitorPeriod() const {
  return std::chrono::milliseconds(std::clamp(opt_.heartbeat_timeout_ms / 4, 20, 500));
}

void Coordinator::ExcuseOwnAbsence(Clock::duration late) {
  if (late <= MonitorPeriod()) return;
  // The monitor woke more than a tick late: the whole process was not running (SIGSTOP, a VM
  // freeze, swapping) or could not take the lock. The heartbeats workers sent meanwhile are
  // still queued behind it, so the silence it would measure now is its own: that time does
  // not count against any worker (a worker silent before the gap keeps what it had used).
  const auto now = Clock::now();
  for (auto& [id, w] : workers_) {
    w.last_seen = std::min(now, w.last_seen + late);
    w.progress_at = std::min(now, w.progress_at + late);
  }
  // Said where it would have cost a worker (scheduling hiccups of a busy machine are not news).
  if (late < std::chrono::milliseconds(opt_.heartbeat_timeout_ms / 2)) return;
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.1f", std::chrono::duration<double>(late).count());
  const std::string what = std::string("the coordinator did not run for ") + buf +
                           " s (paused or starved); heartbeat deadlines moved by as much";
  std::fprintf(stderr, "forge-coordinator: %s\n", what.c_str());
  for (auto& [id, run] : runs_) {
    if (!Active(run.state)) continue;
    EventRecord e;
    e.run_id = id;
    e.time_ms = NowMs();
    e.state = run.state;
    e.message = what;
    (void)store_->AppendEvent(e);
  }
  changed_.notify_all();
}

void Coordinator::MonitorLoop() {
  const auto period = MonitorPeriod();
  std::unique_lock<std::mutex> l(mu_);
  auto last_tick = Clock::now();
  while (!shutdown_) {
    changed_.wait_for(l, period);
    if (shutdown_) break;
    const auto now = Clock::now();
    ExcuseOwnAbsence(now - last_tick - period);
    last_tick = now;
    const auto timeout = std::chrono::milliseconds(opt_.heartbeat_timeout_ms);
    struct Lost {
      std::string run_id, why;
      int attempt;
    };
    std::vector<Lost> lost;
    std::vector<std::string> gone;  // idle workers
    for (const auto& [id, w] : workers_) {
      if (now - w.last_seen <= (w.from_state ? 2 * timeout : timeout)) continue;
      const double silent = std::chrono::duration<double>(now - w.last_seen).count();
      RunRecord* run = w.rec.run_id.empty() ? nullptr : FindRun(w.rec.run_id);
      if (run != nullptr && Active(run->state) && run->attempt == w.rec.attempt) {
        char buf[64];
        std::snprintf(buf, sizeof buf, "%.1f", silent);
        MarkWorkerUp(run->id, w.rec.rank, false);  // before LoseRun releases the placement
        lost.push_back({run->id,
                        "worker " + id + " (rank " + std::to_string(w.rec.rank) +
                            ") sent no heartbeat for " + buf + " s",
                        w.rec.attempt});
      } else {
        gone.push_back(id);
      }
    }
    for (const std::string& id : gone) {
      (void)store_->DeleteWorker(id);
      workers_.erase(id);
    }
    // Several silent workers of one placement cost it one restart: once the first LoseRun
    // placed the run again, the others' silence is not the new attempt's.
    for (const Lost& l : lost) {
      RunRecord* run = FindRun(l.run_id);
      if (run != nullptr && Active(run->state) && run->attempt == l.attempt)
        (void)LoseRun(run, l.why);
    }
    DetectHangs(now);
    Schedule();
    GrowBack();
  }
}

}  // namespace forge::coord
