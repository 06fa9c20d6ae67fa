// Checkpoints inside the training loop: resuming before the first step, and saving at step
// boundaries with the background writer of worker/checkpoint (checkpoint.h has the recipe).
// Everything here is collective over the data-parallel Comm (null: one process): every rank
// calls the same functions at the same step boundaries.
//
// Save at step N: every rank downloads the full state (TrainBackend::GetParams/GetMoments,
// themselves collective in sharded modes), keeps its ShardOf slice and hands it to an
// AsyncCheckpointer; training goes on while the shard is written. Commit (at a later boundary,
// once every rank's write finished, or forced before the next save and at the end of the run):
// every rank collects its ShardReport, the reports are all-gathered, rank 0 writes the
// manifest (CommitCheckpoint) and applies retention, and its status is broadcast so every rank
// returns the same error. The manifest therefore appears only after every rank wrote.
//
// Snapshot buffers on a CUDA backend (CudaTrainBackend): the stall of a save is the
// device->host download, fast only into page-locked memory. The host state (master, m, v: full
// unit buffers) is one set of vectors that circulates without reallocation: filled by Save,
// moved into the AsyncCheckpointer, handed back by TakeSpare for the next save. The
// TrainCheckpointer pins exactly those vectors (CudaTrainBackend::PinHostRange) and owns the
// pins; it unpins before any of them can be freed (in its destructor, before the
// AsyncCheckpointer holding them goes), so a registration never outlives its memory. With
// checkpoint.every_steps > 0 the set is allocated, touched and pinned in the constructor
// (start-up time), so the first save pays no page faults either. Other backends (CPU) are
// unchanged: buffers are allocated by the first save and reused.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/config.h"
#include "common/status.h"
#include "worker/data/data_plan.h"
#include "worker/model/param_layout.h"
#include "worker/train/backend.h"

namespace forge {

class AsyncCheckpointer;
class Comm;
class CudaTrainBackend;
struct ShardReport;

// Set under a coordinator (TrainOptions::report_shard): the commit hands each rank's report
// here instead of rank 0 writing the manifest.
using ShardReportHook = std::function<Status(const ShardReport&)>;

// Where training starts.
struct ResumePoint {
  std::string dir;  // the checkpoint loaded; empty: a fresh start
  int64_t step = 0, data_cursor = 0;
  std::optional<DataUsage> data;  // the checkpoint's data record, if it has one
  // Its trainer-state blobs (the backend's and the trainer's own, e.g. kSpikeGuardBlob).
  std::map<std::string, std::string> extra;
  int source_world = 0;     // the world size and parallel mode that saved it
  std::string source_mode;
  std::vector<std::string> warnings;  // on rank 0: damaged checkpoints skipped, dirs moved aside
};

// Collective. Rank 0 resolves cfg.checkpoint.resume under CheckpointRoot(cfg) (ResolveResume:
// "latest" falls back past damaged checkpoints) and broadcasts its choice, so every rank loads
// the same checkpoint; every rank then loads it in full (verified) and sets the backend's
// weights and moments. Committed checkpoints newer than the one chosen (damaged ones skipped
// by "latest", or a later continuation when resuming an older step) would collide with this
// run's saves: rank 0 moves them to <root>/superseded/ and says so in the warnings.
// With `may_save` and no resume, a root that already holds checkpoints is an error (they
// belong to another run; resume it or pick another run_dir / checkpoint.dir).
StatusOr<ResumePoint> ResumeTraining(const RunConfig& cfg, const ParamLayout& layout,
                                     TrainBackend* backend, Comm* comm, bool may_save);

// One committed checkpoint, summed over ranks.
struct CheckpointCommit {
  int64_t step = 0;
  std::string dir;
  double blocked_s = 0.0;  // the longest stall of any rank's training loop for this save
  double write_s = 0.0;    // the slowest rank's background write (+ checksum, fsync, rename)
  uint64_t bytes = 0;      // all shard files
  double bytes_per_s() const { return write_s > 0 ? double(bytes) / write_s : 0.0; }
  std::vector<std::string> removed;   // by retention (rank 0)
  std::vector<std::string> warnings;  // rank 0: a retention failure (the commit stands)
};

class TrainCheckpointer {
 public:
  // The backend must outlive this object (pins made through it do not need it).
  TrainCheckpointer(const RunConfig& cfg, const ParamLayout& layout, TrainBackend* backend,
                    Comm* comm, ShardReportHook report_shard = nullptr);
  ~TrainCheckpointer();
  TrainCheckpointer(const TrainCheckpointer&) = delete;
  TrainCheckpointer& operator=(const TrainCheckpointer&) = delete;

  // A save was started and not yet committed (the same on every rank).
  bool pending() const { return pending_step_ >= 0; }
  // This rank's background write is still running (differs between ranks).
  bool writing() const;

  // Collective: starts saving the state after `step`. A pending save is committed first
  // (waiting for its write counts as stall). Returns once the shard is handed to the writer.
  // `data`: the data record at data_cursor (into the manifest), if the run keeps one.
  // `trainer_blobs`: the trainer's own state blobs, saved beside the backend's.
  Status Save(int64_t step, int64_t data_cursor, std::optional<DataUsage> data = std::nullopt,
              std::map<std::string, std::string> trainer_blobs = {});
  // Collective: waits for this rank's write, gathers the reports and commits (see above).
  Status Commit();
  // Commits since the last call, oldest first.
  std::vector<CheckpointCommit> TakeCommits();

  // Bytes of snapshot buffers currently page-locked (0 unless the backend is CUDA).
  uint64_t pinned_bytes() const;

 private:
  struct Pin;  // one pinned snapshot vector (trainer_checkpoint.cc)
  // Full-size host buffers for every unit (layout sizes, zero-filled: pages touched).
  void AllocateHostState(UnitBuffers* master, UnitBuffers* m, UnitBuffers* v) const;
  // Makes `pins_` cover exactly these buffers (see the file comment).
  void PinHostState(const UnitBuffers& master, const UnitBuffers& m, const UnitBuffers& v);

  RunConfig cfg_;
  ParamLayout layout_;
  TrainBackend* backend_;
  Comm* comm_;
  ShardReportHook report_shard_;  // null: rank 0 commits
  std::unique_ptr<Comm> own_comm_;  // world 1 when no comm was given
  std::string root_;
  std::unique_ptr<AsyncCheckpointer> async_;
  int64_t pending_step_ = -1;
  double pending_blocked_s_ = 0.0;
  std::vector<CheckpointCommit> commits_;
  CudaTrainBackend* cuda_ = nullptr;  // non-null: pin the snapshot buffers
  UnitBuffers ready_master_, ready_m_, ready_v_;  // allocated up front, for the first save
  // Declared last, so destroyed first even without the destructor's explicit unpinning.
  std::vector<Pin> pins_;
};

}  // namespace forge
