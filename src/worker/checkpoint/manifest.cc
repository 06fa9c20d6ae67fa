#include "worker/checkpoint/manifest.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>

#include <nlohmann/json.hpp>

#include "common/checksum.h"
#include "common/file_io.h"

namespace forge {
namespace {

using json = nlohmann::json;

Status Bad(const std::string& source, const std::string& what) {
  return Status::DataLoss(source + ": " + what);
}

// Checks that the ranks' slices of every unit tile [0, numel) with no gap or overlap.
Status CheckTiling(const Manifest& m, const std::string& source) {
  for (size_t u = 0; u < m.units.size(); ++u) {
    std::vector<ShardRange> r;
    for (const ManifestShard& s : m.shards) {
      if (s.ranges.size() != m.units.size()) {
        return Bad(source, "shard " + s.file + " lists " + std::to_string(s.ranges.size()) +
                               " unit ranges, the manifest has " +
                               std::to_string(m.units.size()) + " units");
      }
      if (s.ranges[u].begin < 0 || s.ranges[u].end < s.ranges[u].begin) {
        return Bad(source, "shard " + s.file + ": unit " + m.units[u].name +
                               " has a negative range");
      }
      if (s.ranges[u].size() > 0) r.push_back(s.ranges[u]);
    }
    std::sort(r.begin(), r.end(), [](const ShardRange& a, const ShardRange& b) {
      return a.begin < b.begin;
    });
    int64_t next = 0;
    for (const ShardRange& x : r) {
      if (x.begin != next) {
        return Bad(source, "unit " + m.units[u].name + ": shard ranges do not tile it (" +
                               (x.begin > next ? "gap" : "overlap") + " at element " +
                               std::to_string(std::min(next, x.begin)) + ")");
      }
      next = x.end;
    }
    if (next != m.units[u].numel) {
      return Bad(source, "unit " + m.units[u].name + ": shard ranges cover " +
                             std::to_string(next) + " of " + std::to_string(m.units[u].numel) +
                             " elements");
    }
  }
  return Status::Ok();
}

}  // namespace

std::string ManifestToJson(const Manifest& m) {
  json j;
  j["format"] = kManifestFormat;
  j["version"] = m.version;
  j["step"] = m.step;
  j["world_size"] = m.world_size;
  j["parallel_mode"] = m.parallel_mode;
  j["created"] = m.created;
  j["trainer"] = {{"step", m.step}, {"data_cursor", m.data_cursor}};
  if (m.data) j["data"] = json::parse(EncodeDataUsage(*m.data));
  json units = json::array();
  for (const UnitLayout& u : m.units) {
    json tensors = json::array();
    for (const TensorSlot& t : u.tensors) {
      tensors.push_back({{"name", t.name}, {"shape", t.shape}, {"offset", t.offset}});
    }
    units.push_back({{"name", u.name}, {"numel", u.numel}, {"tensors", tensors}});
  }
  j["units"] = units;
  json shards = json::array();
  for (const ManifestShard& s : m.shards) {
    json ranges = json::array();
    for (const ShardRange& r : s.ranges) ranges.push_back({r.begin, r.end});
    shards.push_back({{"rank", s.rank},
                      {"file", s.file},
                      {"size", s.size},
                      {"crc32c", Crc32cHex(s.crc32c)},
                      {"ranges", ranges}});
  }
  j["shards"] = shards;
  j["config_yaml"] = m.config_yaml;
  return j.dump(1) + "\n";
}

StatusOr<Manifest> ParseManifest(const std::string& text, const std::string& source) {
  Manifest m;
  try {
    const json j = json::parse(text);
    if (j.value("format", "") != kManifestFormat) {
      return Bad(source, "not a Forge checkpoint manifest (format is not \"forge-checkpoint\")");
    }
    m.version = j.at("version").get<int>();
    if (m.version != kManifestVersion) {
      return Bad(source, "unsupported manifest version " + std::to_string(m.version));
    }
    m.step = j.at("step").get<int64_t>();
    m.world_size = j.at("world_size").get<int>();
    m.parallel_mode = j.at("parallel_mode").get<std::string>();
    m.created = j.value("created", "");
    m.data_cursor = j.at("trainer").at("data_cursor").get<int64_t>();
    if (j.at("trainer").at("step").get<int64_t>() != m.step) {
      return Bad(source, "trainer.step differs from step");
    }
    m.config_yaml = j.value("config_yaml", "");
    if (j.contains("data")) {
      auto data = DecodeDataUsage(j.at("data").dump(), source);
      if (!data.ok()) return data.status();
      if (data->cursor != m.data_cursor) return Bad(source, "data.cursor differs from trainer.data_cursor");
      m.data = std::move(data).value();
    }
    for (const json& ju : j.at("units")) {
      UnitLayout u;
      u.name = ju.at("name").get<std::string>();
      u.numel = ju.at("numel").get<int64_t>();
      for (const json& jt : ju.at("tensors")) {
        TensorSlot t;
        t.name = jt.at("name").get<std::string>();
        t.shape = jt.at("shape").get<std::vector<int64_t>>();
        t.offset = jt.at("offset").get<int64_t>();
        t.numel = 1;
        for (int64_t s : t.shape) t.numel *= s;
        if (t.offset < 0 || t.numel < 0 || t.offset + t.numel > u.numel) {
          return Bad(source, "tensor " + t.name + " lies outside unit " + u.name);
        }
        u.tensors.push_back(std::move(t));
      }
      m.units.push_back(std::move(u));
    }
    for (const json& js : j.at("shards")) {
      ManifestShard s;
      s.rank = js.at("rank").get<int>();
      s.file = js.at("file").get<std::string>();
      s.size = js.at("size").get<uint64_t>();
      const std::string crc = js.at("crc32c").get<std::string>();
      unsigned value = 0;
      if (crc.size() != 10 || std::sscanf(crc.c_str(), "0x%8x", &value) != 1) {
        return Bad(source, "shard " + s.file + ": bad crc32c \"" + crc + "\"");
      }
      s.crc32c = value;
      for (const json& jr : js.at("ranges")) {
        const auto r = jr.get<std::vector<int64_t>>();
        if (r.size() != 2) return Bad(source, "shard " + s.file + ": a range is not [begin, end]");
        s.ranges.push_back({r[0], r[1]});
      }
      if (s.file.empty() || s.file.find('/') != std::string::npos) {
        return Bad(source, "shard file name \"" + s.file + "\" is not a plain file name");
      }
      m.shards.push_back(std::move(s));
    }
  } catch (const json::exception& e) {
    return Bad(source, std::string("malformed manifest: ") + e.what());
  }
  if (m.world_size < 1 || static_cast<int>(m.shards.size()) != m.world_size) {
    return Bad(source, "world_size " + std::to_string(m.world_size) + " but " +
                           std::to_string(m.shards.size()) + " shards listed");
  }
  std::sort(m.shards.begin(), m.shards.end(),
            [](const ManifestShard& a, const ManifestShard& b) { return a.rank < b.rank; });
  for (int r = 0; r < m.world_size; ++r) {
    if (m.shards[r].rank != r) {
      return Bad(source, "shard ranks are not 0.." + std::to_string(m.world_size - 1) +
                             " each once (rank " + std::to_string(r) + " missing)");
    }
  }
  FORGE_RETURN_IF_ERROR(CheckTiling(m, source));
  return m;
}

StatusOr<Manifest> ReadManifest(const std::string& step_dir) {
  const std::string path = (std::filesystem::path(step_dir) / kManifestName).string();
  auto text = ReadSmallFile(path);
  if (!text.ok()) {
    if (text.status().code() == Code::kNotFound) {
      return Status::NotFound(path + ": no manifest (not a complete checkpoint)");
    }
    return text.status();
  }
  return ParseManifest(*text, path);
}

Status CheckSameShapes(const Manifest& m, const ParamLayout& layout) {
  if (m.units.size() != layout.units.size()) {
    return Status::Invalid("checkpoint has " + std::to_string(m.units.size()) +
                           " units, the model " + std::to_string(layout.units.size()) +
                           " (different n_layer?)");
  }
  for (size_t u = 0; u < m.units.size(); ++u) {
    const UnitLayout& a = m.units[u];
    const UnitLayout& b = layout.units[u];
    if (a.name != b.name || a.numel != b.numel || a.tensors.size() != b.tensors.size()) {
      return Status::Invalid("checkpoint unit " + a.name + " (" + std::to_string(a.numel) +
                             " elements) differs from the model's " + b.name + " (" +
                             std::to_string(b.numel) + ")");
    }
    for (size_t t = 0; t < a.tensors.size(); ++t) {
      const TensorSlot& x = a.tensors[t];
      const TensorSlot& y = b.tensors[t];
      if (x.name != y.name || x.shape != y.shape || x.offset != y.offset) {
        return Status::Invalid("checkpoint tensor " + x.name + " differs from the model's " +
                               y.name + " (name, shape or offset)");
      }
    }
  }
  return Status::Ok();
}

}  // namespace forge
