#include "worker/checkpoint/checkpoint_loader.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <map>
#include <utility>

#include "common/checksum.h"
#include "worker/checkpoint/shard_file.h"
#include "worker/model/shard_layout.h"

namespace forge {
namespace {

namespace fs = std::filesystem;

std::string RangeText(ShardRange r, int64_t numel) {
  std::string t = "[";
  t += std::to_string(r.begin);
  t += ", ";
  t += std::to_string(r.end);
  t += ") of ";
  t += std::to_string(numel);
  return t;
}

// Opens shard `s` of the manifest and checks it against the manifest.
StatusOr<ShardFileContents> OpenShard(const std::string& dir, const Manifest& m,
                                      const ManifestShard& s) {
  const std::string path = (fs::path(dir) / s.file).string();
  FORGE_ASSIGN_OR_RETURN(ShardFileContents c, ReadShardFile(path));
  auto mismatch = [&](const std::string& what, const std::string& file_value,
                      const std::string& manifest_value) {
    return Status::DataLoss(path + ": " + what + " " + file_value +
                            " does not match the manifest's " + manifest_value);
  };
  if (c.info.size != s.size) {
    return mismatch("size", std::to_string(c.info.size), std::to_string(s.size));
  }
  if (c.info.crc32c != s.crc32c) {
    return mismatch("checksum", Crc32cHex(c.info.crc32c), Crc32cHex(s.crc32c));
  }
  if (c.rank != s.rank || c.world != m.world_size) {
    return mismatch("rank/world", std::to_string(c.rank) + "/" + std::to_string(c.world),
                    std::to_string(s.rank) + "/" + std::to_string(m.world_size));
  }
  if (c.step != m.step || c.data_cursor != m.data_cursor) {
    return mismatch("step/cursor", std::to_string(c.step) + "/" + std::to_string(c.data_cursor),
                    std::to_string(m.step) + "/" + std::to_string(m.data_cursor));
  }
  if (c.ranges.size() != m.units.size()) {
    return mismatch("unit count", std::to_string(c.ranges.size()),
                    std::to_string(m.units.size()));
  }
  for (size_t u = 0; u < m.units.size(); ++u) {
    const ShardRange a = c.ranges[u], b = s.ranges[u];
    if (c.unit_numel[u] != m.units[u].numel || a.begin != b.begin || a.end != b.end) {
      return mismatch("unit " + m.units[u].name + " slice", RangeText(a, c.unit_numel[u]),
                      RangeText(b, m.units[u].numel));
    }
  }
  return c;
}

// Where each tensor of `want`'s units lies in the checkpoint's: a checkpoint whose units group
// the same tensors (by name and shape) another way, as before the untied LM head moved from the
// embedding unit to the final one. A piece: `numel` elements at `at` of the wanted unit come
// from `from_offset` of checkpoint unit `from_unit`.
struct Piece {
  int64_t at = 0, numel = 0;
  size_t from_unit = 0;
  int64_t from_offset = 0;
};
StatusOr<std::vector<std::vector<Piece>>> PlaceByName(const Manifest& m,
                                                      const std::vector<UnitLayout>& want) {
  std::map<std::string, std::pair<size_t, const TensorSlot*>> have;
  for (size_t u = 0; u < m.units.size(); ++u)
    for (const TensorSlot& t : m.units[u].tensors) have[t.name] = {u, &t};
  std::vector<std::vector<Piece>> out(want.size());
  size_t found = 0;
  for (size_t u = 0; u < want.size(); ++u) {
    for (const TensorSlot& t : want[u].tensors) {
      auto it = have.find(t.name);
      if (it == have.end() || it->second.second->shape != t.shape)
        return Status::Invalid("tensor " + t.name + " is not in the checkpoint in that shape");
      out[u].push_back({t.offset, t.numel, it->second.first, it->second.second->offset});
      ++found;
    }
  }
  if (found != have.size())
    return Status::Invalid("the checkpoint holds tensors the model does not have");
  return out;
}

}  // namespace

std::string CheckpointDirOf(const std::string& path) {
  const fs::path p(path);
  if (p.filename() == kManifestName) return p.parent_path().string();
  return path;
}

Status VerifyCheckpoint(const std::string& path) {
  const std::string dir = CheckpointDirOf(path);
  FORGE_ASSIGN_OR_RETURN(Manifest m, ReadManifest(dir));
  for (const ManifestShard& s : m.shards) {
    FORGE_RETURN_IF_ERROR(OpenShard(dir, m, s).status());
  }
  return Status::Ok();
}

StatusOr<LoadedShard> LoadCheckpointRanges(const std::string& path,
                                           const std::vector<ShardRange>& ranges, int blob_rank,
                                           const ParamLayout* expect) {
  LoadedShard out;
  out.dir = CheckpointDirOf(path);
  FORGE_ASSIGN_OR_RETURN(out.manifest, ReadManifest(out.dir));
  const Manifest& m = out.manifest;
  // The units asked for: the checkpoint's, or `expect`'s where the checkpoint holds the same
  // tensors in other units (placed by name).
  const std::vector<UnitLayout>& units = expect != nullptr ? expect->units : m.units;
  std::vector<std::vector<Piece>> placed;
  if (expect != nullptr) {
    if (Status same = CheckSameShapes(m, *expect); !same.ok()) {
      StatusOr<std::vector<std::vector<Piece>>> by_name = PlaceByName(m, units);
      if (!by_name.ok()) return same.Annotate(out.dir);
      placed = std::move(by_name).value();
    }
  }
  if (ranges.size() != units.size()) {
    return Status::Invalid(out.dir + ": asked for " + std::to_string(ranges.size()) +
                           " unit ranges, the checkpoint has " + std::to_string(units.size()) +
                           " units");
  }
  blob_rank = std::clamp(blob_rank, 0, m.world_size - 1);

  // Source shards needed: those overlapping a wanted range, plus the blob rank.
  std::map<int, ShardFileContents> open;
  auto get = [&](int r) -> StatusOr<const ShardFileContents*> {
    auto it = open.find(r);
    if (it == open.end()) {
      FORGE_ASSIGN_OR_RETURN(ShardFileContents c, OpenShard(out.dir, m, m.shards[r]));
      it = open.emplace(r, std::move(c)).first;
    }
    return &it->second;
  };

  ShardState& st = out.state;
  st.units.resize(units.size());
  // Checkpoint unit `from`'s elements [lo, hi) into x at `dst`, from every shard holding part.
  auto copy = [&](UnitSlice& x, size_t from, int64_t lo, int64_t hi, int64_t dst) -> Status {
    for (const ManifestShard& s : m.shards) {
      const ShardRange have = s.ranges[from];
      const int64_t a = std::max(have.begin, lo), b = std::min(have.end, hi);
      if (a >= b) continue;
      FORGE_ASSIGN_OR_RETURN(const ShardFileContents* c, get(s.rank));
      const size_t src = 4 * static_cast<size_t>(a - have.begin);
      const size_t bytes = 4 * static_cast<size_t>(b - a);
      const size_t to = static_cast<size_t>(dst + (a - lo));
      std::memcpy(x.master.data() + to, c->master[from] + src, bytes);
      std::memcpy(x.m.data() + to, c->m[from] + src, bytes);
      std::memcpy(x.v.data() + to, c->v[from] + src, bytes);
    }
    return Status::Ok();
  };
  for (size_t u = 0; u < units.size(); ++u) {
    const ShardRange want = ranges[u];
    if (want.begin < 0 || want.begin > want.end || want.end > units[u].numel) {
      return Status::Invalid(out.dir + ": range [" + std::to_string(want.begin) + ", " +
                             std::to_string(want.end) + ") outside unit " + units[u].name);
    }
    UnitSlice& x = st.units[u];
    x.unit_numel = units[u].numel;
    x.begin = want.begin;
    x.end = want.end;
    x.master.resize(want.size());
    x.m.resize(want.size());
    x.v.resize(want.size());
    if (placed.empty()) {
      FORGE_RETURN_IF_ERROR(copy(x, u, want.begin, want.end, 0));
      continue;
    }
    for (const Piece& p : placed[u]) {
      const int64_t lo = std::max(want.begin, p.at), hi = std::min(want.end, p.at + p.numel);
      if (lo >= hi) continue;
      FORGE_RETURN_IF_ERROR(copy(x, p.from_unit, p.from_offset + (lo - p.at),
                                 p.from_offset + (hi - p.at), lo - want.begin));
    }
  }
  FORGE_ASSIGN_OR_RETURN(const ShardFileContents* blobs, get(blob_rank));
  st.trainer.step = m.step;
  st.trainer.data_cursor = m.data_cursor;
  st.trainer.rng = blobs->rng;
  st.trainer.extra = blobs->extra;
  return out;
}

StatusOr<LoadedShard> LoadCheckpoint(const std::string& path, int rank, int world,
                                     const ParamLayout* expect) {
  if (world < 1 || rank < 0 || rank >= world) {
    return Status::Invalid("LoadCheckpoint: rank " + std::to_string(rank) + " of world " +
                           std::to_string(world));
  }
  const std::string dir = CheckpointDirOf(path);
  FORGE_ASSIGN_OR_RETURN(Manifest m, ReadManifest(dir));
  std::vector<ShardRange> ranges;
  for (const UnitLayout& u : expect != nullptr ? expect->units : m.units)
    ranges.push_back(ShardOf(u.numel, rank, world));
  const bool same_world = world == m.world_size;
  FORGE_ASSIGN_OR_RETURN(LoadedShard out,
                         LoadCheckpointRanges(dir, ranges, same_world ? rank : 0, expect));
  out.state.rank = rank;
  out.state.world = world;
  out.blobs_from_same_rank = same_world;
  return out;
}

StatusOr<FullCheckpoint> LoadFullCheckpoint(const std::string& path, const ParamLayout* expect) {
  FORGE_ASSIGN_OR_RETURN(LoadedShard s, LoadCheckpoint(path, 0, 1, expect));
  FullCheckpoint f;
  f.dir = std::move(s.dir);
  f.manifest = std::move(s.manifest);
  f.trainer = std::move(s.state.trainer);
  for (UnitSlice& x : s.state.units) {
    f.master.push_back(std::move(x.master));
    f.m.push_back(std::move(x.m));
    f.v.push_back(std::move(x.v));
  }
  return f;
}

}  // namespace forge
