#include "worker/train/trainer_checkpoint.h"

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <utility>

#include "common/file_io.h"
#include "worker/checkpoint/checkpoint.h"
#include "worker/parallel/comm.h"
#include "worker/train/cuda_backend.h"

namespace forge {
namespace {

namespace fs = std::filesystem;

// Smaller buffers (norm weights) are not worth a registration: their pageable copy is
// negligible, and they share heap pages with other objects.
constexpr size_t kMinPinBytes = size_t{64} << 10;

double SecondsSince(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Strings travel as 16-bit elements (DType::kBF16 is only ever moved, never summed), padded to
// an even number of bytes.
Status BroadcastString(Comm* comm, std::string* s, std::string_view what) {
  double len = comm->rank() == 0 ? double(s->size()) : 0.0;
  FORGE_RETURN_IF_ERROR(BroadcastBlocking(comm, &len, 1, DType::kF64, 0, what));
  const size_t n = static_cast<size_t>(len);
  std::string buf = comm->rank() == 0 ? *s : std::string();
  buf.resize((n + 1) / 2 * 2, '\0');
  if (n > 0)
    FORGE_RETURN_IF_ERROR(
        BroadcastBlocking(comm, buf.data(), int64_t(buf.size() / 2), DType::kBF16, 0, what));
  buf.resize(n);
  *s = std::move(buf);
  return Status::Ok();
}

StatusOr<std::vector<std::string>> AllGatherStrings(Comm* comm, const std::string& mine,
                                                    std::string_view what) {
  const int world = comm->world();
  std::vector<double> lens(world);
  const double my_len = double(mine.size());
  FORGE_RETURN_IF_ERROR(AllGatherBlocking(comm, &my_len, lens.data(), 1, DType::kF64, what));
  size_t longest = 0;
  for (double l : lens) longest = std::max(longest, static_cast<size_t>(l));
  const size_t words = (longest + 1) / 2;
  std::vector<std::string> out(world);
  if (words == 0) return out;
  std::string send(words * 2, '\0');
  std::copy(mine.begin(), mine.end(), send.begin());
  std::string recv(words * 2 * world, '\0');
  FORGE_RETURN_IF_ERROR(
      AllGatherBlocking(comm, send.data(), recv.data(), int64_t(words), DType::kBF16, what));
  for (int r = 0; r < world; ++r)
    out[r] = recv.substr(size_t(r) * words * 2, static_cast<size_t>(lens[r]));
  return out;
}

// Rank 0's status, on every rank (same code and message).
Status ShareStatus(Comm* comm, const Status& on_root, std::string_view what) {
  double code = comm->rank() == 0 ? double(static_cast<int>(on_root.code())) : 0.0;
  FORGE_RETURN_IF_ERROR(BroadcastBlocking(comm, &code, 1, DType::kF64, 0, what));
  if (code == 0.0) return Status::Ok();
  std::string msg = comm->rank() == 0 ? on_root.message() : std::string();
  FORGE_RETURN_IF_ERROR(BroadcastString(comm, &msg, what));
  return Status(static_cast<Code>(static_cast<int>(code)), msg);
}

// Every rank's `local` status: Ok when all are; else the first failing rank's error (on every
// rank, so they all stop together instead of some entering the next collective alone).
Status AgreeStatus(Comm* comm, const Status& local, std::string_view what) {
  const std::string mine = local.ok() ? std::string() : local.ToString();
  FORGE_ASSIGN_OR_RETURN(std::vector<std::string> all, AllGatherStrings(comm, mine, what));
  for (size_t r = 0; r < all.size(); ++r)
    if (!all[r].empty())
      return local.ok() ? Status::Unavailable("rank " + std::to_string(r) + ": " + all[r])
                        : local;
  return Status::Ok();
}

// Moves a committed checkpoint out of the way of this run's saves, keeping it for inspection.
StatusOr<std::string> MoveAside(const std::string& root, const CheckpointEntry& e) {
  const fs::path aside = fs::path(root) / "superseded";
  std::error_code ec;
  fs::create_directories(aside, ec);
  if (ec) return Status::IoError(aside.string() + ": cannot create: " + ec.message());
  const std::string name = fs::path(e.dir).filename().string();
  fs::path to = aside / name;
  for (int i = 1; fs::exists(to, ec); ++i) to = aside / (name + "." + std::to_string(i));
  fs::rename(e.dir, to, ec);
  if (ec) return Status::IoError("cannot move " + e.dir + " to " + to.string() + ": " + ec.message());
  FORGE_RETURN_IF_ERROR(SyncDirectory(root));
  return to.string();
}

// Rank 0's part of ResumeTraining: which checkpoint, and clearing the way for this run's saves.
Status ChooseResume(const RunConfig& cfg, const std::string& root, bool may_save,
                    ResumePoint* rp) {
  const std::string& spec = cfg.checkpoint.resume;
  if (spec.empty()) {
    const std::vector<CheckpointEntry> existing = ListCheckpoints(root);
    if (may_save && !existing.empty())
      return Status::Precondition(
          root + " already holds checkpoints of an earlier run (newest " + existing.back().dir +
          "): resume it (checkpoint.resume: latest, or forge train --resume latest) or choose "
          "another train.run_dir or checkpoint.dir");
    return Status::Ok();
  }
  FORGE_ASSIGN_OR_RETURN(ResumeChoice c, ResolveResume(spec, root));
  rp->warnings = std::move(c.warnings);
  rp->dir = c.dir;
  if (c.dir.empty()) return Status::Ok();
  for (const CheckpointEntry& e : ListCheckpoints(root)) {
    if (e.step <= c.step) continue;
    FORGE_ASSIGN_OR_RETURN(std::string to, MoveAside(root, e));
    rp->warnings.push_back("resume: moved " + e.dir + " (newer than the checkpoint resumed) to " +
                           to + ", so this run's own step_" + std::to_string(e.step) +
                           " can take its place");
  }
  return Status::Ok();
}

}  // namespace

StatusOr<ResumePoint> ResumeTraining(const RunConfig& cfg, const ParamLayout& layout,
                                     TrainBackend* backend, Comm* comm, bool may_save) {
  std::unique_ptr<Comm> local;
  if (comm == nullptr) {
    local = MakeLocalComm();
    comm = local.get();
  }
  const std::string root = CheckpointRoot(cfg);
  ResumePoint rp;
  Status chosen;
  if (comm->rank() == 0) chosen = ChooseResume(cfg, root, may_save, &rp);
  FORGE_RETURN_IF_ERROR(ShareStatus(comm, chosen, "resume decision"));
  std::string dir = rp.dir;
  FORGE_RETURN_IF_ERROR(BroadcastString(comm, &dir, "resume dir"));
  rp.dir = dir;
  if (dir.empty()) return rp;

  // Every rank loads the whole checkpoint: the backends take full buffers and keep their slice.
  StatusOr<FullCheckpoint> full = LoadFullCheckpoint(dir, &layout);
  Status loaded = full.status();
  if (loaded.ok()) loaded = backend->SetParams(full->master);
  if (loaded.ok()) loaded = backend->SetMoments(full->m, full->v);
  FORGE_RETURN_IF_ERROR(AgreeStatus(comm, loaded.Annotate("resume from " + dir), "resume load"));
  // State beyond weights and moments (FP8 scaling): a blob this run cannot take (another model
  // or amax window) is not fatal; the run goes on with fresh state and says so.
  if (Status extra = backend->SetExtraState(full->trainer.extra); !extra.ok() && comm->rank() == 0) {
    rp.warnings.push_back("resume from " + dir + ": " + extra.ToString() +
                          "; continuing without it");
  }
  rp.step = full->trainer.step;
  rp.data_cursor = full->trainer.data_cursor;
  rp.data = full->manifest.data;
  rp.extra = full->trainer.extra;
  rp.source_world = full->manifest.world_size;
  rp.source_mode = full->manifest.parallel_mode;
  return rp;
}

// A registration lives as long as its entry; `handle` is null where the driver refused (the
// copy into that buffer is pageable; not retried every save).
struct TrainCheckpointer::Pin {
  const float* data = nullptr;
  size_t bytes = 0;
  std::unique_ptr<PinnedHostRange> handle;
};

TrainCheckpointer::TrainCheckpointer(const RunConfig& cfg, const ParamLayout& layout,
                                     TrainBackend* backend, Comm* comm,
                                     ShardReportHook report_shard)
    : cfg_(cfg),
      layout_(layout),
      backend_(backend),
      comm_(comm),
      report_shard_(std::move(report_shard)),
      root_(CheckpointRoot(cfg)),
      async_(std::make_unique<AsyncCheckpointer>()),
      cuda_(dynamic_cast<CudaTrainBackend*>(backend)) {
  if (comm_ == nullptr) {
    own_comm_ = MakeLocalComm();
    comm_ = own_comm_.get();
  }
  // Periodic saves: pay for allocating, touching and pinning the host state now rather than
  // inside the first save's stall.
  if (cuda_ != nullptr && cfg_.checkpoint.every_steps > 0) {
    AllocateHostState(&ready_master_, &ready_m_, &ready_v_);
    PinHostState(ready_master_, ready_m_, ready_v_);
  }
}

TrainCheckpointer::~TrainCheckpointer() {
  // Unpin while every pinned vector is still alive (in ready_* or in async_, destroyed next).
  pins_.clear();
}

void TrainCheckpointer::AllocateHostState(UnitBuffers* master, UnitBuffers* m,
                                          UnitBuffers* v) const {
  for (UnitBuffers* b : {master, m, v}) {
    b->resize(layout_.units.size());
    for (size_t u = 0; u < layout_.units.size(); ++u)
      (*b)[u].assign(static_cast<size_t>(layout_.units[u].numel), 0.0f);
  }
}

void TrainCheckpointer::PinHostState(const UnitBuffers& master, const UnitBuffers& m,
                                     const UnitBuffers& v) {
  std::vector<std::pair<const float*, size_t>> want;
  for (const UnitBuffers* b : {&master, &m, &v})
    for (const std::vector<float>& x : *b)
      if (x.size() * sizeof(float) >= kMinPinBytes)
        want.emplace_back(x.data(), x.size() * sizeof(float));
  bool same = want.size() == pins_.size();
  for (size_t i = 0; same && i < want.size(); ++i)
    same = pins_[i].data == want[i].first && pins_[i].bytes == want[i].second;
  if (same) return;  // the usual case: the same vectors came back from the writer
  // Different buffers (the first save, or the circulating set was replaced): drop the old
  // registrations before making new ones, so no stale range can cover a reused address.
  pins_.clear();
  for (const auto& [data, bytes] : want) {
    Pin p;
    p.data = data;
    p.bytes = bytes;
    p.handle = cuda_->PinHostRange(const_cast<float*>(data), bytes);
    pins_.push_back(std::move(p));
  }
}

uint64_t TrainCheckpointer::pinned_bytes() const {
  uint64_t n = 0;
  for (const Pin& p : pins_)
    if (p.handle) n += p.bytes;
  return n;
}

bool TrainCheckpointer::writing() const { return !async_->Done(); }

Status TrainCheckpointer::Save(int64_t step, int64_t data_cursor, std::optional<DataUsage> data,
                               std::map<std::string, std::string> trainer_blobs) {
  const auto t0 = std::chrono::steady_clock::now();
  if (pending()) FORGE_RETURN_IF_ERROR(Commit());
  UnitBuffers master, m, v;
  ShardState state;
  // Until the buffers are handed to the writer, an early return frees them: unpin first
  // (declared after them, so destroyed before them).
  struct UnpinOnError {
    std::vector<Pin>* pins;
    ~UnpinOnError() {
      if (pins) pins->clear();
    }
  } unpin_on_error{&pins_};
  // Refill the previous save's host buffers instead of faulting in fresh memory each time.
  if (auto spare = async_->TakeSpare()) {
    TakeFullBuffers(std::move(*spare), &master, &m, &v);
  } else if (!ready_master_.empty()) {  // the first save, into the buffers pinned up front
    master = std::move(ready_master_);
    m = std::move(ready_m_);
    v = std::move(ready_v_);
    ready_master_.clear();
    ready_m_.clear();
    ready_v_.clear();
  }
  if (cuda_ != nullptr) {
    // Sized as the download leaves them (no reallocation there), then pinned; a no-op from
    // the second save on.
    if (master.empty()) AllocateHostState(&master, &m, &v);
    PinHostState(master, m, v);
  }
  FORGE_RETURN_IF_ERROR(backend_->GetParams(&master).Annotate("checkpoint: weights"));
  FORGE_RETURN_IF_ERROR(backend_->GetMoments(&m, &v).Annotate("checkpoint: moments"));
  TrainerState trainer;
  trainer.step = step;
  trainer.data_cursor = data_cursor;
  trainer.data = std::move(data);
  FORGE_RETURN_IF_ERROR(
      backend_->GetExtraState(&trainer.extra).Annotate("checkpoint: backend state"));
  for (auto& [name, blob] : trainer_blobs) trainer.extra[name] = std::move(blob);
  state = ShardStateFromFull(layout_, comm_->rank(), comm_->world(), std::move(master),
                             std::move(m), std::move(v), std::move(trainer));
  FORGE_RETURN_IF_ERROR(async_->Save(StepDir(root_, step), std::move(state)));
  unpin_on_error.pins = nullptr;  // the writer holds them; they come back by TakeSpare
  pending_step_ = step;
  pending_blocked_s_ = SecondsSince(t0);
  return Status::Ok();
}

Status TrainCheckpointer::Commit() {
  if (!pending()) return Status::Precondition("TrainCheckpointer::Commit: no save to commit");
  CheckpointCommit c;
  c.step = pending_step_;
  c.dir = StepDir(root_, c.step);
  pending_step_ = -1;
  const std::string what = "checkpoint step_" + std::to_string(c.step);

  StatusOr<ShardReport> rep = async_->Wait();
  const SaveStats stats = async_->last_stats();
  // A failed write travels as "!" + its error, so every rank learns which rank failed.
  std::string mine = "!";
  if (rep.ok())
    mine = EncodeShardReport(*rep);
  else
    mine += rep.status().ToString();
  FORGE_ASSIGN_OR_RETURN(std::vector<std::string> texts, AllGatherStrings(comm_, mine, what));
  const int world = comm_->world();
  std::vector<double> nums(3 * size_t(world));
  const double my_nums[3] = {pending_blocked_s_, stats.write_s, double(stats.bytes)};
  FORGE_RETURN_IF_ERROR(AllGatherBlocking(comm_, my_nums, nums.data(), 3, DType::kF64, what));

  std::vector<ShardReport> reports;
  for (int r = 0; r < world; ++r) {
    if (!texts[r].empty() && texts[r][0] == '!')
      return Status::IoError(what + ": rank " + std::to_string(r) + " could not write its shard: " +
                             texts[r].substr(1));
    auto d = DecodeShardReport(texts[r]);
    if (!d.ok()) return d.status().Annotate(what + ": report of rank " + std::to_string(r));
    reports.push_back(std::move(d).value());
    c.blocked_s = std::max(c.blocked_s, nums[3 * r]);
    c.write_s = std::max(c.write_s, nums[3 * r + 1]);
    c.bytes += static_cast<uint64_t>(nums[3 * r + 2]);
  }

  if (report_shard_) {
    // Under a coordinator: each rank reports its own shard; the coordinator writes the
    // manifest when the last one arrives (before answering it), so once every rank's call
    // succeeded the checkpoint is committed. Retention is the coordinator's too.
    const Status mine_reported = report_shard_(reports[size_t(comm_->rank())]);
    FORGE_RETURN_IF_ERROR(AgreeStatus(comm_, mine_reported.Annotate(what), what + " report"));
    commits_.push_back(std::move(c));
    return Status::Ok();
  }
  Status committed;
  if (comm_->rank() == 0) {
    committed = CommitCheckpoint(c.dir, cfg_, layout_, reports).status();
    if (committed.ok()) {
      auto removed = ApplyRetention(root_, cfg_.checkpoint.keep_last, cfg_.checkpoint.keep_every);
      if (removed.ok())
        c.removed = std::move(removed).value();
      else  // the new checkpoint is committed; a failed clean-up must not end the run
        c.warnings.push_back("checkpoint retention: " + removed.status().ToString());
    }
  }
  FORGE_RETURN_IF_ERROR(ShareStatus(comm_, committed.Annotate(what), what + " commit"));
  commits_.push_back(std::move(c));
  return Status::Ok();
}

std::vector<CheckpointCommit> TrainCheckpointer::TakeCommits() {
  std::vector<CheckpointCommit> out = std::move(commits_);
  commits_.clear();
  return out;
}

}  // namespace forge
