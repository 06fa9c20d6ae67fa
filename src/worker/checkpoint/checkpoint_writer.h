// Saving a checkpoint, in two phases so that a checkpoint exists only once every rank wrote:
//
//   1. every rank:  WriteShard(step_dir, state) -> ShardReport
//        writes <step_dir>/rank_<r>_of_<W>.shard.tmp, fsyncs, renames it to its final name,
//        fsyncs the directory and reports (file, size, CRC32C, ranges, step, cursor).
//   2. one process, after all ranks reported (rank 0 after a barrier + gather of the encoded
//      reports; later the coordinator):
//        CommitCheckpoint(step_dir, cfg, layout, reports)
//        checks the reports against each other and the files on disk, then writes
//        manifest.json (temp + fsync + rename + directory fsync). A step directory without a
//        manifest is not a checkpoint: a crash anywhere before that rename leaves nothing
//        that a resume could pick up.
//
// Every parallel mode writes the same layout: rank r of W holds ShardOf(numel, r, W) of every
// unit (model/shard_layout.h, the ZeRO/FSDP rule). ZeRO/FSDP ranks own exactly that slice; a
// DDP rank holds a full replica but writes only its slice too (ShardStateFromFull), so a DDP
// checkpoint costs 1/W per rank instead of W full copies, and all modes reshard alike. (The
// format itself records each shard's ranges, so a loader accepts any tiling.)
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/config.h"
#include "common/status.h"
#include "worker/checkpoint/checkpoint_state.h"
#include "worker/checkpoint/manifest.h"
#include "worker/model/param_layout.h"
#include "worker/model/unit_buffers.h"

namespace forge {

// "<root>/step_<step>"
std::string StepDir(const std::string& root, int64_t step);
// "rank_<r>_of_<W>.shard"
std::string ShardFileName(int rank, int world);
// cfg.checkpoint.dir, or <train.run_dir>/checkpoints when empty.
std::string CheckpointRoot(const RunConfig& cfg);

// A rank's state from full per-unit buffers (DDP replicas, or W = 1): moves them in and marks
// this rank's ShardOf of every unit, without copying.
ShardState ShardStateFromFull(const ParamLayout& layout, int rank, int world,
                              UnitBuffers master, UnitBuffers m, UnitBuffers v,
                              TrainerState trainer);

// The inverse: moves the unit buffers back out (e.g. a spare state from
// AsyncCheckpointer::TakeSpare, to refill with GetParams/GetMoments for the next save).
void TakeFullBuffers(ShardState&& state, UnitBuffers* master, UnitBuffers* m, UnitBuffers* v);

struct ShardReport {
  int rank = 0, world = 1;
  int64_t step = 0, data_cursor = 0;
  std::string file;        // name inside the step directory
  uint64_t size = 0;
  uint32_t crc32c = 0;     // whole file
  std::vector<ShardRange> ranges;  // per unit
  std::optional<DataUsage> data;   // the trainer's data record at data_cursor, if it keeps one
};

// Writes this rank's shard durably (see above). FailedPrecondition when step_dir already
// holds a manifest (a committed checkpoint is never overwritten).
StatusOr<ShardReport> WriteShard(const std::string& step_dir, const ShardState& state);

// A report as one line of JSON, for a gather over Comm or an RPC; and back.
std::string EncodeShardReport(const ShardReport& r);
StatusOr<ShardReport> DecodeShardReport(const std::string& text);

// Writes manifest.json after checking: one report per rank 0..W-1, same step, cursor and data
// record (which goes into the manifest),
// units matching `layout`, ranges tiling every unit, each file present with its reported size.
// Then removes leftovers in step_dir that the manifest does not list (temp files, shards of
// an earlier attempt with another world size). Returns the manifest written.
StatusOr<Manifest> CommitCheckpoint(const std::string& step_dir, const RunConfig& cfg,
                                    const ParamLayout& layout,
                                    const std::vector<ShardReport>& reports);

}  // namespace forge
