// The checkpoint root directory: listing, choosing where to resume, and retention.
// Only step_<N> directories with a manifest.json are checkpoints; the rest (a save in
// progress, or one cut short by a crash) are ignored by listing and resume, and cleaned up
// by retention once a newer checkpoint is complete.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"

namespace forge {

struct CheckpointEntry {
  int64_t step = 0;
  std::string dir;
  bool complete = false;  // has manifest.json
};

// Every step_<N> directory under root, by ascending step (root missing: empty list).
std::vector<CheckpointEntry> ListStepDirs(const std::string& root);
// Only the complete ones.
std::vector<CheckpointEntry> ListCheckpoints(const std::string& root);

struct ResumeChoice {
  std::string dir;                    // step directory to load; empty: start fresh
  int64_t step = 0;
  std::vector<std::string> warnings;  // damaged checkpoints skipped, each naming the file
};

// `spec` is checkpoint.resume:
//   ""        no resume (empty dir).
//   "latest"  the newest complete checkpoint under root that verifies in full
//             (VerifyCheckpoint); a damaged one is skipped with a warning naming the file and
//             the next newest tried. None complete: start fresh (empty dir, no error).
//             Complete ones exist but all damaged: DataLoss listing every failure.
//   "step_N"  <root>/step_N, verified; damage is an error (no fallback).
//   PATH      a step directory or its manifest.json, verified; damage is an error.
// Every rank may call this (it reads the same files and decides alike) or rank 0 alone.
StatusOr<ResumeChoice> ResolveResume(const std::string& spec, const std::string& root);

// Retention, run by the process that commits (after a commit): keeps the newest `keep_last`
// complete checkpoints (at least 1) and every one whose step is a multiple of `keep_every`
// (0: none); deletes the other complete ones and every incomplete directory older than the
// newest complete checkpoint (newer ones may be saves in progress). The newest complete
// checkpoint is never deleted. Returns the directories removed.
StatusOr<std::vector<std::string>> ApplyRetention(const std::string& root, int keep_last,
                                                  int64_t keep_every);

}  // namespace forge
