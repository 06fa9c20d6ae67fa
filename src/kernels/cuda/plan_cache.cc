// PlanCache: one JSON file, read whole on every Get (runners ask once per new plan), written
// under an flock by temporary file + rename (common/file_io).
#include "kernels/cuda/plan_cache.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <map>

#include <nlohmann/json.hpp>

#include "common/file_io.h"

namespace forge::cuda {

namespace {

constexpr const char* kFormat = "forge-plan-cache-v1";

using Entries = std::map<std::string, std::string>;

// Every entry of the file; a missing file reads as no entries.
StatusOr<Entries> ReadEntries(const std::string& path) {
  StatusOr<std::string> read = ReadSmallFile(path);
  if (!read.ok()) {
    if (read.status().code() == Code::kNotFound) return Entries{};
    return read.status().Annotate("plan cache");
  }
  const std::string& s = read.value();
  if (s.empty()) return Entries{};  // e.g. created by hand with touch
  const nlohmann::json j = nlohmann::json::parse(s, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return Status::DataLoss("plan cache " + path + ": not valid JSON");
  if (!j.is_object() || !j.contains("format") || j["format"] != kFormat || !j.contains("plans") ||
      !j["plans"].is_object()) {
    return Status::DataLoss("plan cache " + path + ": not a " + kFormat +
                            " file (want {\"format\": \"" + kFormat + "\", \"plans\": {...}})");
  }
  Entries entries;
  for (const auto& [key, value] : j["plans"].items()) {
    if (!value.is_string()) {
      return Status::DataLoss("plan cache " + path + ": plan \"" + key + "\" is not a string");
    }
    entries[key] = value.get<std::string>();
  }
  return entries;
}

std::string Render(const Entries& entries) {
  nlohmann::ordered_json j;
  j["format"] = kFormat;
  j["plans"] = nlohmann::ordered_json::object();
  for (const auto& [key, value] : entries) j["plans"][key] = value;
  return j.dump(2) + "\n";
}

// Replaces path atomically (common/file_io): readers see the old file or the new one, and a
// crash leaves no partial plan cache. The temporary's name is unique per process and call
// because writers race where the file system has no flock.
Status WriteAtomically(const std::string& path, const std::string& text) {
  static std::atomic<unsigned> counter{0};
  const std::string tmp = path + ".tmp." + std::to_string(getpid()) + "." +
                          std::to_string(counter.fetch_add(1));
  return WriteFileAtomic(path, text, tmp).Annotate("plan cache");
}

// An exclusive flock on "<path>.lock" for the lifetime of the object. Where the file system
// has no flock the lock is skipped (held() false) and concurrent writers race: last wins.
class FileLock {
 public:
  explicit FileLock(const std::string& path) {
    fd_ = open((path + ".lock").c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd_ < 0) return;
    while (flock(fd_, LOCK_EX) != 0) {
      if (errno != EINTR) {
        close(fd_);
        fd_ = -1;
        return;
      }
    }
  }
  ~FileLock() {
    if (fd_ >= 0) close(fd_);  // releases the lock
  }
  FileLock(const FileLock&) = delete;
  FileLock& operator=(const FileLock&) = delete;

 private:
  int fd_ = -1;
};

}  // namespace

bool ProfilerAttached() {
  // What each tool puts into its target's environment (seen: ncu 2025.3 sets the Nsight
  // injection transport and PerfWorks directory, not CUDA_INJECTION64_PATH; compute-sanitizer
  // its own transport).
  for (const char* name : {"CUDA_INJECTION64_PATH", "NV_NSIGHT_INJECTION_TRANSPORT_TYPE",
                           "NV_COMPUTE_PROFILER_PERFWORKS_DIR",
                           "NV_SANITIZER_INJECTION_TRANSPORT_TYPE"}) {
    const char* v = std::getenv(name);
    if (v != nullptr && *v != '\0') return true;
  }
  return false;
}

PlanCache PlanCache::FromEnv() {
  const char* env = std::getenv("FORGE_PLAN_CACHE");
  if (env && *env) {
    const std::string v = env;
    if (v == "off" || v == "OFF" || v == "Off") return PlanCache();
    return PlanCache(v);
  }
  const char* xdg = std::getenv("XDG_CACHE_HOME");
  if (xdg && xdg[0] == '/') return PlanCache(std::string(xdg) + "/forge/plans.json");
  const char* home = std::getenv("HOME");
  if (home && *home) return PlanCache(std::string(home) + "/.cache/forge/plans.json");
  return PlanCache();
}

StatusOr<std::optional<std::string>> PlanCache::Get(const std::string& key) const {
  if (!enabled()) return std::optional<std::string>();
  FORGE_ASSIGN_OR_RETURN(const Entries entries, ReadEntries(path_));
  const auto it = entries.find(key);
  if (it == entries.end()) return std::optional<std::string>();
  return std::optional<std::string>(it->second);
}

Status PlanCache::Put(const std::string& key, const std::string& value) const {
  return Update(key, value, /*replace=*/true).status();
}

StatusOr<std::string> PlanCache::PutIfAbsent(const std::string& key,
                                             const std::string& value) const {
  return Update(key, value, /*replace=*/false);
}

StatusOr<std::string> PlanCache::Update(const std::string& key, const std::string& value,
                                        bool replace) const {
  if (!enabled()) return Status::Precondition("plan cache disabled: cannot record " + key);
  const std::filesystem::path parent = std::filesystem::path(path_).parent_path();
  if (!parent.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(parent, ec);
    if (ec) {
      return Status::IoError("plan cache " + path_ + ": cannot create " + parent.string() +
                             ": " + ec.message());
    }
  }
  FileLock lock(path_);
  FORGE_ASSIGN_OR_RETURN(Entries entries, ReadEntries(path_));
  const auto it = entries.find(key);
  if (it != entries.end() && (!replace || it->second == value)) return it->second;
  entries[key] = value;
  FORGE_RETURN_IF_ERROR(WriteAtomically(path_, Render(entries)));
  return value;
}

}  // namespace forge::cuda
