// What one rank saves and loads: its slice of every unit's FP32 master weights and AdamW
// moments, plus the trainer state needed to continue exactly (optimizer step, data cursor,
// RNG bytes and opaque extras such as FP8 scale history).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "worker/data/data_plan.h"

namespace forge {

struct TrainerState {
  int64_t step = 0;          // optimizer steps completed; the checkpoint is step_<step>
  int64_t data_cursor = 0;   // global sequence index of the next batch
  std::string rng;           // opaque RNG state of this rank
  std::map<std::string, std::string> extra;  // opaque named blobs of this rank (e.g. "fp8")
  // What each data source has given at data_cursor (the same on every rank). It travels in the
  // shard report to the manifest, not in the shard file.
  std::optional<DataUsage> data;
};

// One unit's slice [begin, end) of its flat buffer (param_layout.h). The three vectors hold
// either exactly end - begin floats (the slice itself, as ZeRO/FSDP ranks own it) or the whole
// unit_numel floats (a DDP rank's full replica: the writer takes [begin, end) from it, so the
// trainer can move its full buffers in without copying slices). Loaded states always hold
// just the slice.
struct UnitSlice {
  int64_t unit_numel = 0;
  int64_t begin = 0, end = 0;
  std::vector<float> master, m, v;

  int64_t size() const { return end - begin; }
  // Offset of element `begin` inside the vectors (0 for a slice, begin for a whole unit).
  int64_t data_offset() const {
    return static_cast<int64_t>(master.size()) == size() ? 0 : begin;
  }
};

struct ShardState {
  int rank = 0, world = 1;
  std::vector<UnitSlice> units;  // one per unit of the ParamLayout, in order
  TrainerState trainer;
};

}  // namespace forge
