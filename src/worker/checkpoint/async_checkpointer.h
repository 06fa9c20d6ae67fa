// Asynchronous shard saving: Save() takes a snapshot of the rank's state in host memory and
// returns; a background thread writes, checksums, fsyncs and renames it (WriteShard). The
// training step is blocked only for the snapshot copy (or not at all when the caller moves a
// state it already copied, e.g. the host buffers filled by TrainBackend::GetParams).
//
//   AsyncCheckpointer ckpt;
//   FORGE_RETURN_IF_ERROR(ckpt.Save(StepDir(root, step), state));  // copy, returns quickly
//   ... train on ...
//   if (ckpt.Done()) ...                        // poll
//   FORGE_ASSIGN_OR_RETURN(ShardReport rep, ckpt.Wait());  // then gather reports + commit
//
// Lowest stall (a device backend): download straight into host buffers kept from the previous
// save and hand them over without a copy:
//   if (auto spare = ckpt.TakeSpare()) TakeFullBuffers(std::move(*spare), &master, &m, &v);
//   backend->GetParams(&master); backend->GetMoments(&m, &v);     // the only stall
//   ckpt.Save(dir, ShardStateFromFull(layout, rank, world, std::move(master), std::move(m),
//                                     std::move(v), trainer));
//
// Every save's report must be collected with Wait() (and committed) before the next Save(). A
// failed background write surfaces on the next call: Wait() returns it, or, if nobody waited,
// the next Save() returns it (and does not start that save).
#pragma once

#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "common/status.h"
#include "worker/checkpoint/checkpoint_state.h"
#include "worker/checkpoint/checkpoint_writer.h"

namespace forge {

struct SaveStats {
  int64_t step = 0;
  double blocked_s = 0.0;  // time inside Save(): waiting for the previous write + snapshot
  double write_s = 0.0;    // background: write + checksum + fsync + rename
  uint64_t bytes = 0;      // shard file size
  double bytes_per_s() const { return write_s > 0 ? static_cast<double>(bytes) / write_s : 0; }
};

class AsyncCheckpointer {
 public:
  AsyncCheckpointer() = default;
  AsyncCheckpointer(const AsyncCheckpointer&) = delete;
  AsyncCheckpointer& operator=(const AsyncCheckpointer&) = delete;
  ~AsyncCheckpointer();  // waits for a write in flight (its result is dropped)

  // Snapshots `state` (a copy) and starts writing it to step_dir. Waits first for a previous
  // write still in flight (that wait counts as blocked time); FailedPrecondition when the
  // previous save's report was not collected by Wait(), its error when it failed.
  Status Save(const std::string& step_dir, const ShardState& state);
  // Same, taking ownership instead of copying.
  Status Save(const std::string& step_dir, ShardState&& state);

  // True when no write is in flight.
  bool Done() const;
  // Waits for the last save and returns its report (or its error). FailedPrecondition when
  // there is no save whose result was not yet returned.
  StatusOr<ShardReport> Wait();

  // Stats of the most recent finished save (blocked_s of the most recent Save()).
  SaveStats last_stats() const;

  // The state of the last finished save, buffers intact (nullopt if none, or already taken).
  // Refilling it for the next snapshot (e.g. with TakeFullBuffers + GetParams) avoids
  // page-faulting gigabytes of fresh host memory on every save; Save(const&) reuses it itself.
  std::optional<ShardState> TakeSpare();

 private:
  Status FinishPrevious();
  Status Start(const std::string& step_dir, ShardState state, double blocked_s);
  void Join();

  mutable std::mutex mu_;
  std::thread worker_;
  bool running_ = false;
  std::optional<StatusOr<ShardReport>> result_;  // finished, not yet returned
  std::optional<ShardState> spare_;               // buffers of the last finished save
  SaveStats stats_, pending_stats_;
};

}  // namespace forge
