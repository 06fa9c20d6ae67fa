// manifest.json of a checkpoint: what makes a step_<N> directory a checkpoint. It holds the
// format version, step, world size, parallel mode, the run config (YAML), the global shapes
// of every unit, the shard layout (per shard file: rank, per-unit [begin, end), size and
// CRC32C of the whole file), the trainer state (step, data cursor) and, from runs that keep
// one, the data record: what each data source had given at that cursor (data_plan.h).
//
//   {"format": "forge-checkpoint", "version": 1, "step": 200, "world_size": 2,
//    "parallel_mode": "zero1", "created": "2025-01-01T12:00:00Z",
//    "trainer": {"step": 200, "data_cursor": 6400},
//    "data": {"cursor": 6400, "origin": 0, "sources": [{"dir": "/data/web", "weight": 0.7,
//             "stream": 0, "base": 0, "sequences": 4480, "tokens": 4587520, "epoch": 0,
//             "epoch_sequences": 91000}, ...]},
//    "units": [{"name": "embedding", "numel": 6553600,
//               "tensors": [{"name": "wte", "shape": [51200, 128], "offset": 0}]}, ...],
//    "shards": [{"rank": 0, "file": "rank_0_of_2.shard", "size": 123, "crc32c": "0x1a2b3c4d",
//                "ranges": [[0, 3276800], ...]}, ...],
//    "config_yaml": "name: run\n..."}
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"
#include "worker/model/shard_layout.h"
#include "worker/data/data_plan.h"
#include "worker/model/param_layout.h"

namespace forge {

inline constexpr const char* kManifestFormat = "forge-checkpoint";
inline constexpr int kManifestVersion = 1;
inline constexpr const char* kManifestName = "manifest.json";

struct ManifestShard {
  int rank = 0;
  std::string file;        // relative to the step directory
  uint64_t size = 0;
  uint32_t crc32c = 0;     // whole file
  std::vector<ShardRange> ranges;  // per unit
};

struct Manifest {
  int version = kManifestVersion;
  int64_t step = 0;
  int world_size = 1;
  std::string parallel_mode;  // ParallelModeName(): ddp, zero1, zero2, fsdp
  std::string created;        // UTC, ISO 8601
  int64_t data_cursor = 0;
  std::optional<DataUsage> data;  // absent in checkpoints of runs that kept none
  std::vector<UnitLayout> units;  // names, numel, tensors (name, shape, offset, numel)
  std::vector<ManifestShard> shards;  // sorted by rank
  std::string config_yaml;
};

std::string ManifestToJson(const Manifest& m);
// `source` names the file in errors. Checks structure and consistency (ranks 0..W-1 once
// each, per-unit ranges that tile [0, numel) exactly, tensors inside their unit).
StatusOr<Manifest> ParseManifest(const std::string& json_text, const std::string& source);
StatusOr<Manifest> ReadManifest(const std::string& step_dir);

// InvalidArgument naming the first unit/tensor whose name or shape differs (a checkpoint of
// another model).
Status CheckSameShapes(const Manifest& m, const ParamLayout& layout);

}  // namespace forge
