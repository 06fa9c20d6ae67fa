// Loading a checkpoint on any world size. A checkpoint written by W ranks is a set of slices
// of every unit; a rank of W' asks for its own ShardOf(numel, rank, W') of every unit (the
// slice a ZeRO/FSDP rank owns) and the loader copies each piece from whichever source shards hold it (resharding is just slicing, so the
// result is bitwise the saved state). Every shard file read is verified in full: size and
// whole-file CRC32C against the manifest, header fields against the manifest, and every
// section's CRC. Any mismatch is DataLoss naming the file.
#pragma once

#include <string>
#include <vector>

#include "common/status.h"
#include "worker/checkpoint/checkpoint_state.h"
#include "worker/checkpoint/manifest.h"
#include "worker/model/param_layout.h"
#include "worker/model/unit_buffers.h"

namespace forge {

struct LoadedShard {
  std::string dir;      // the step directory it came from
  Manifest manifest;    // of the source checkpoint (its world size, mode, config, ...)
  // This rank's slices (vectors hold exactly end - begin floats) and the trainer state:
  // step and data cursor are global; rng and extra are per rank and come from source rank
  // `rank` when the world size is unchanged, else from source rank 0 (blobs_from_same_rank
  // tells which).
  ShardState state;
  bool blobs_from_same_rank = true;
};

// `path`: a step directory or its manifest.json. With `expect` set, the checkpoint's tensors
// must be expect's (InvalidArgument otherwise: a checkpoint of another model) and the slices
// are expect's units: a checkpoint that groups the same tensors (name and shape) into units
// another way is read tensor by tensor into expect's (checkpoints written before the untied LM
// head moved from the embedding unit to the final one).
StatusOr<LoadedShard> LoadCheckpoint(const std::string& path, int rank, int world,
                                     const ParamLayout* expect = nullptr);

// The general form: `ranges[u]` of every unit (any ranges inside the units), RNG/extra blobs
// from source rank `blob_rank` (clamped to the source world).
StatusOr<LoadedShard> LoadCheckpointRanges(const std::string& path,
                                           const std::vector<ShardRange>& ranges, int blob_rank,
                                           const ParamLayout* expect = nullptr);

// Whole units (W' = 1): for a DDP replica, export and tests.
struct FullCheckpoint {
  std::string dir;
  Manifest manifest;
  UnitBuffers master, m, v;
  TrainerState trainer;  // blobs of source rank 0
};
StatusOr<FullCheckpoint> LoadFullCheckpoint(const std::string& path,
                                            const ParamLayout* expect = nullptr);

// Reads and verifies every shard of the checkpoint (what LoadCheckpoint checks, for all files).
Status VerifyCheckpoint(const std::string& path);

// A step directory from a step directory or a manifest.json path.
std::string CheckpointDirOf(const std::string& path);

}  // namespace forge
