// Journal of finished work units (see prepare_journal.h).
#include "worker/data/prepare_journal.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <sstream>

#include <nlohmann/json.hpp>

#include "common/checksum.h"
#include "common/file_io.h"

namespace fs = std::filesystem;

namespace forge {
namespace {

using nlohmann::json;

json ToJson(const UnitRecord& r) {
  json j;
  j["id"] = r.id;
  j["key"] = r.key_hash;
  json shards = json::array();
  for (const ShardRecord& s : r.shards) {
    shards.push_back({SplitName(s.split), s.file, s.tokens, Crc32cHex(s.crc32c)});
  }
  j["shards"] = shards;
  json files = json::array();
  for (const UnitFileStats& f : r.files) {
    files.push_back({{"begin", f.read.begin},
                     {"end", f.read.end},
                     {"crc", Crc32cHex(f.read.crc)},
                     {"skipped", f.read.skipped_empty},
                     {"lines", f.read.lines},
                     {"docs", {f.docs[0], f.docs[1]}},
                     {"tokens", {f.tokens[0], f.tokens[1]}},
                     {"bytes", {f.text_bytes[0], f.text_bytes[1]}},
                     {"repaired", f.repaired},
                     {"first", {f.first_shard[0], f.first_shard[1]}},
                     {"last", {f.last_shard[0], f.last_shard[1]}}});
  }
  j["files"] = files;
  return j;
}

uint32_t ParseCrc(const json& v) {
  return static_cast<uint32_t>(std::stoul(v.get<std::string>().substr(2), nullptr, 16));
}

UnitRecord FromJson(const json& j) {
  UnitRecord r;
  r.id = j.at("id").get<int64_t>();
  r.key_hash = j.at("key").get<std::string>();
  for (const json& s : j.at("shards")) {
    ShardRecord rec;
    rec.split = s.at(0).get<std::string>() == "val" ? Split::kVal : Split::kTrain;
    rec.file = s.at(1).get<std::string>();
    rec.tokens = s.at(2).get<int64_t>();
    rec.crc32c = ParseCrc(s.at(3));
    r.shards.push_back(std::move(rec));
  }
  for (const json& f : j.at("files")) {
    UnitFileStats st;
    st.read.begin = f.at("begin").get<uint64_t>();
    st.read.end = f.at("end").get<uint64_t>();
    st.read.crc = ParseCrc(f.at("crc"));
    st.read.skipped_empty = f.at("skipped").get<int64_t>();
    st.read.lines = f.at("lines").get<int64_t>();
    for (int s = 0; s < 2; ++s) {
      st.docs[s] = f.at("docs").at(s).get<int64_t>();
      st.tokens[s] = f.at("tokens").at(s).get<int64_t>();
      st.text_bytes[s] = f.at("bytes").at(s).get<int64_t>();
      st.first_shard[s] = f.at("first").at(s).get<int>();
      st.last_shard[s] = f.at("last").at(s).get<int>();
    }
    st.repaired = f.at("repaired").get<int64_t>();
    r.files.push_back(st);
  }
  return r;
}

}  // namespace

std::string UnitKeyHash(const std::string& key) {
  char buf[24];
  std::snprintf(buf, sizeof(buf), "%08x%08x", Crc32c(key),
                Crc32cExtend(0x5bd1e995u, key.data(), key.size()));
  return buf;
}

bool PrepareJournal::Exists(const std::string& dir) {
  std::error_code ec;
  return fs::exists(fs::path(dir) / kDir, ec);
}

StatusOr<PrepareJournal> PrepareJournal::Open(const std::string& dir,
                                              const std::string& fingerprint, bool discard) {
  PrepareJournal jr;
  jr.dir_ = dir + "/" + kDir;
  const std::string run = jr.dir_ + "/run.json";
  std::error_code ec;
  if (discard) fs::remove_all(jr.dir_, ec);
  if (fs::exists(run, ec)) {
    FORGE_ASSIGN_OR_RETURN(std::string text, ReadSmallFile(run));
    json j = json::parse(text, nullptr, false);
    const std::string theirs =
        j.is_object() && j.contains("run") && j["run"].is_string() ? j["run"].get<std::string>() : "";
    if (theirs != fingerprint) {
      return Status::Precondition(
          dir + " holds an unfinished prepare with other settings (" + run + ": " + theirs +
          "; this run: " + fingerprint + "). Rerun it with its settings to finish it, or "
          "add --force to discard it and start over");
    }
    // Finished units, one JSON object a line. A torn last line (no newline: the append was
    // cut short) is dropped from the file, so that the next append starts a line of its own.
    const std::string done = jr.dir_ + "/done.jsonl";
    std::string data;
    if (fs::exists(done, ec)) {
      FORGE_ASSIGN_OR_RETURN(data, ReadSmallFile(done));
    }
    const size_t whole = data.rfind('\n') == std::string::npos ? 0 : data.rfind('\n') + 1;
    if (whole < data.size()) {
      fs::resize_file(done, whole, ec);
      if (ec) return Status::IoError(done + ": cannot truncate a torn line: " + ec.message());
    }
    size_t pos = 0;
    int64_t n = 0;
    while (pos < whole) {
      const size_t eol = data.find('\n', pos);
      ++n;
      json r = json::parse(std::string_view(data).substr(pos, eol - pos), nullptr, false);
      pos = eol + 1;
      if (r.is_discarded()) {
        return Status::DataLoss(done + ":" + std::to_string(n) + ": not valid JSON");
      }
      try {
        UnitRecord rec = FromJson(r);
        jr.done_[rec.id] = std::move(rec);
      } catch (const std::exception& e) {
        return Status::DataLoss(done + ":" + std::to_string(n) + ": " + e.what());
      }
    }
    return jr;
  }
  fs::create_directories(jr.dir_, ec);
  if (ec) return Status::IoError(jr.dir_ + ": cannot create: " + ec.message());
  fs::remove(jr.dir_ + "/done.jsonl", ec);
  FORGE_RETURN_IF_ERROR(WriteFileAtomic(run, json{{"run", fingerprint}}.dump() + "\n"));
  return jr;
}

Status PrepareJournal::Append(const UnitRecord& record) {
  const std::string path = dir_ + "/done.jsonl";
  const std::string line = ToJson(record).dump() + "\n";
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) return Status::IoError(path + ": cannot open: " + std::strerror(errno));
  Status st;
  size_t off = 0;
  while (off < line.size() && st.ok()) {
    const ssize_t n = ::write(fd, line.data() + off, line.size() - off);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) st = Status::IoError(path + ": write failed: " + std::strerror(errno));
    else off += static_cast<size_t>(n);
  }
  if (st.ok() && ::fsync(fd) != 0) st = Status::IoError(path + ": fsync failed: " + std::strerror(errno));
  ::close(fd);
  FORGE_RETURN_IF_ERROR(st);
  done_[record.id] = record;
  return Status::Ok();
}

Status PrepareJournal::Remove() {
  std::error_code ec;
  fs::remove_all(dir_, ec);
  if (ec) return Status::IoError(dir_ + ": cannot remove: " + ec.message());
  return SyncDirectory(fs::path(dir_).parent_path().string());
}

}  // namespace forge
