#include "worker/checkpoint/checkpoint_writer.h"

#include <unistd.h>

#include <ctime>
#include <filesystem>
#include <set>
#include <utility>

#include <nlohmann/json.hpp>

#include "common/file_io.h"
#include "worker/checkpoint/shard_file.h"

namespace forge {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

std::string UtcNow() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

Status MakeDirs(const std::string& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) return Status::IoError(dir + ": cannot create directory: " + ec.message());
  return Status::Ok();
}

std::string Parent(const std::string& dir) {
  const std::string p = fs::path(dir).lexically_normal().parent_path().string();
  return p.empty() ? "." : p;
}

}  // namespace

std::string StepDir(const std::string& root, int64_t step) {
  return (fs::path(root) / ("step_" + std::to_string(step))).string();
}

std::string ShardFileName(int rank, int world) {
  return "rank_" + std::to_string(rank) + "_of_" + std::to_string(world) + ".shard";
}

std::string CheckpointRoot(const RunConfig& cfg) {
  if (!cfg.checkpoint.dir.empty()) return cfg.checkpoint.dir;
  return (fs::path(cfg.train.run_dir) / "checkpoints").string();
}

ShardState ShardStateFromFull(const ParamLayout& layout, int rank, int world, UnitBuffers master,
                              UnitBuffers m, UnitBuffers v, TrainerState trainer) {
  ShardState s;
  s.rank = rank;
  s.world = world;
  s.trainer = std::move(trainer);
  s.units.resize(layout.units.size());
  for (size_t u = 0; u < layout.units.size(); ++u) {
    UnitSlice& x = s.units[u];
    x.unit_numel = layout.units[u].numel;
    const ShardRange r = ShardOf(x.unit_numel, rank, world);
    x.begin = r.begin;
    x.end = r.end;
    if (u < master.size()) x.master = std::move(master[u]);
    if (u < m.size()) x.m = std::move(m[u]);
    if (u < v.size()) x.v = std::move(v[u]);
  }
  return s;
}

void TakeFullBuffers(ShardState&& state, UnitBuffers* master, UnitBuffers* m, UnitBuffers* v) {
  master->resize(state.units.size());
  m->resize(state.units.size());
  v->resize(state.units.size());
  for (size_t u = 0; u < state.units.size(); ++u) {
    (*master)[u] = std::move(state.units[u].master);
    (*m)[u] = std::move(state.units[u].m);
    (*v)[u] = std::move(state.units[u].v);
  }
  state.units.clear();
}

StatusOr<ShardReport> WriteShard(const std::string& step_dir, const ShardState& state) {
  const std::string manifest = (fs::path(step_dir) / kManifestName).string();
  if (fs::exists(manifest)) {
    return Status::Precondition(step_dir + ": already a committed checkpoint; not overwriting");
  }
  FORGE_RETURN_IF_ERROR(MakeDirs(step_dir));
  ShardReport rep;
  rep.rank = state.rank;
  rep.world = state.world;
  rep.step = state.trainer.step;
  rep.data_cursor = state.trainer.data_cursor;
  rep.data = state.trainer.data;
  rep.file = ShardFileName(state.rank, state.world);
  const std::string path = (fs::path(step_dir) / rep.file).string();
  const std::string tmp = path + ".tmp";
  auto info = WriteShardFile(tmp, state);
  Status st = info.status();
  if (st.ok()) st = CommitRename(tmp, path);
  if (!st.ok()) {
    ::unlink(tmp.c_str());
    return st;
  }
  // The step directory's own entry must be durable before the manifest can vouch for it.
  FORGE_RETURN_IF_ERROR(SyncDirectory(Parent(step_dir)));
  rep.size = info->size;
  rep.crc32c = info->crc32c;
  for (const UnitSlice& x : state.units) rep.ranges.push_back({x.begin, x.end});
  return rep;
}

std::string EncodeShardReport(const ShardReport& r) {
  json ranges = json::array();
  for (const ShardRange& x : r.ranges) ranges.push_back({x.begin, x.end});
  json j{{"rank", r.rank},   {"world", r.world}, {"step", r.step},
         {"data_cursor", r.data_cursor}, {"file", r.file}, {"size", r.size},
         {"crc32c", r.crc32c}, {"ranges", ranges}};
  if (r.data) j["data"] = json::parse(EncodeDataUsage(*r.data));
  return j.dump();
}

StatusOr<ShardReport> DecodeShardReport(const std::string& text) {
  ShardReport r;
  try {
    const json j = json::parse(text);
    r.rank = j.at("rank").get<int>();
    r.world = j.at("world").get<int>();
    r.step = j.at("step").get<int64_t>();
    r.data_cursor = j.at("data_cursor").get<int64_t>();
    r.file = j.at("file").get<std::string>();
    r.size = j.at("size").get<uint64_t>();
    r.crc32c = j.at("crc32c").get<uint32_t>();
    for (const json& x : j.at("ranges")) {
      const auto v = x.get<std::vector<int64_t>>();
      if (v.size() != 2) return Status::Invalid("shard report: a range is not [begin, end]");
      r.ranges.push_back({v[0], v[1]});
    }
    if (j.contains("data")) {
      FORGE_ASSIGN_OR_RETURN(r.data, DecodeDataUsage(j.at("data").dump(), "shard report"));
    }
  } catch (const json::exception& e) {
    return Status::Invalid(std::string("malformed shard report: ") + e.what());
  }
  return r;
}

StatusOr<Manifest> CommitCheckpoint(const std::string& step_dir, const RunConfig& cfg,
                                    const ParamLayout& layout,
                                    const std::vector<ShardReport>& reports) {
  const std::string where = "committing " + step_dir;
  if (reports.empty()) return Status::Invalid(where + ": no shard reports");
  Manifest m;
  m.world_size = reports[0].world;
  m.step = reports[0].step;
  m.data_cursor = reports[0].data_cursor;
  m.data = reports[0].data;
  m.parallel_mode = ParallelModeName(cfg.parallel.mode);
  m.created = UtcNow();
  m.units = layout.units;
  m.config_yaml = RunConfigToYaml(cfg);
  if (static_cast<int>(reports.size()) != m.world_size) {
    return Status::Invalid(where + ": " + std::to_string(reports.size()) + " reports for world " +
                           std::to_string(m.world_size));
  }
  m.shards.resize(m.world_size);
  std::vector<bool> seen(m.world_size, false);
  for (const ShardReport& r : reports) {
    const std::string who = where + ": rank " + std::to_string(r.rank) + " report";
    if (r.world != m.world_size || r.rank < 0 || r.rank >= m.world_size || seen[r.rank]) {
      return Status::Invalid(who + ": rank/world " + std::to_string(r.rank) + "/" +
                             std::to_string(r.world) + " duplicated or inconsistent");
    }
    if (r.step != m.step || r.data_cursor != m.data_cursor) {
      return Status::Invalid(who + ": step/cursor " + std::to_string(r.step) + "/" +
                             std::to_string(r.data_cursor) + " differ from rank " +
                             std::to_string(reports[0].rank) + "'s " + std::to_string(m.step) +
                             "/" + std::to_string(m.data_cursor));
    }
    const std::string data = r.data ? EncodeDataUsage(*r.data) : "";
    if (data != (m.data ? EncodeDataUsage(*m.data) : "")) {
      return Status::Invalid(who + ": its data record differs from rank " +
                             std::to_string(reports[0].rank) + "'s");
    }
    if (r.ranges.size() != layout.units.size()) {
      return Status::Invalid(who + ": " + std::to_string(r.ranges.size()) +
                             " unit ranges, the model has " +
                             std::to_string(layout.units.size()) + " units");
    }
    const std::string path = (fs::path(step_dir) / r.file).string();
    std::error_code ec;
    const uint64_t size = fs::file_size(path, ec);
    if (ec) return Status::DataLoss(who + ": " + path + ": " + ec.message());
    if (size != r.size) {
      return Status::DataLoss(who + ": " + path + " is " + std::to_string(size) +
                              " bytes, the rank reported " + std::to_string(r.size));
    }
    seen[r.rank] = true;
    m.shards[r.rank] = {r.rank, r.file, r.size, r.crc32c, r.ranges};
  }
  // Round-trip through the parser: the same checks (tiling, ranks) a loader will apply.
  const std::string manifest_path = (fs::path(step_dir) / kManifestName).string();
  const std::string text = ManifestToJson(m);
  FORGE_RETURN_IF_ERROR(ParseManifest(text, manifest_path).status().Annotate(where));
  FORGE_RETURN_IF_ERROR(SyncDirectory(Parent(step_dir)));
  FORGE_RETURN_IF_ERROR(WriteFileAtomic(manifest_path, text));

  // Leftovers: temp files and shards of an earlier attempt at this step.
  std::set<std::string> keep = {kManifestName};
  for (const ManifestShard& s : m.shards) keep.insert(s.file);
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(step_dir, ec)) {
    if (!keep.count(e.path().filename().string())) fs::remove_all(e.path(), ec);
  }
  return m;
}

}  // namespace forge
