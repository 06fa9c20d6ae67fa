#include "worker/checkpoint/checkpoint_dir.h"

#include <algorithm>
#include <cctype>
#include <filesystem>

#include "common/file_io.h"
#include "worker/checkpoint/checkpoint_loader.h"
#include "worker/checkpoint/checkpoint_writer.h"
#include "worker/checkpoint/manifest.h"

namespace forge {
namespace {

namespace fs = std::filesystem;

// "step_<digits>" -> step; -1 otherwise.
int64_t ParseStepName(const std::string& name) {
  if (name.rfind("step_", 0) != 0 || name.size() == 5 || name.size() > 5 + 18) return -1;
  int64_t step = 0;
  for (size_t i = 5; i < name.size(); ++i) {
    if (!std::isdigit(static_cast<unsigned char>(name[i]))) return -1;
    step = step * 10 + (name[i] - '0');
  }
  return step;
}

}  // namespace

std::vector<CheckpointEntry> ListStepDirs(const std::string& root) {
  std::vector<CheckpointEntry> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(root, ec)) {
    if (!e.is_directory(ec)) continue;
    const int64_t step = ParseStepName(e.path().filename().string());
    if (step < 0) continue;
    out.push_back({step, e.path().string(), fs::exists(e.path() / kManifestName, ec)});
  }
  std::sort(out.begin(), out.end(),
            [](const CheckpointEntry& a, const CheckpointEntry& b) { return a.step < b.step; });
  return out;
}

std::vector<CheckpointEntry> ListCheckpoints(const std::string& root) {
  std::vector<CheckpointEntry> all = ListStepDirs(root);
  std::erase_if(all, [](const CheckpointEntry& e) { return !e.complete; });
  return all;
}

StatusOr<ResumeChoice> ResolveResume(const std::string& spec, const std::string& root) {
  ResumeChoice c;
  if (spec.empty()) return c;
  if (spec == "latest") {
    const std::vector<CheckpointEntry> list = ListCheckpoints(root);
    if (list.empty()) {
      c.warnings.push_back("resume: latest: no checkpoint under " + root + "; starting fresh");
      return c;
    }
    std::string failures;
    for (auto it = list.rbegin(); it != list.rend(); ++it) {
      const Status st = VerifyCheckpoint(it->dir);
      if (st.ok()) {
        if (!c.warnings.empty()) {
          c.warnings.push_back("resume: latest: falling back to " + it->dir +
                               ", the newest intact checkpoint");
        }
        c.dir = it->dir;
        c.step = it->step;
        return c;
      }
      c.warnings.push_back("resume: latest: skipping damaged checkpoint " + it->dir + ": " +
                           st.message());
      failures += "\n  " + st.message();
    }
    return Status::DataLoss("resume: latest: every checkpoint under " + root +
                            " is damaged:" + failures);
  }
  std::string dir;
  if (ParseStepName(spec) >= 0) {
    dir = (fs::path(root) / spec).string();
  } else {
    dir = CheckpointDirOf(spec);
  }
  auto m = ReadManifest(dir);
  if (!m.ok()) return m.status().Annotate("resume: " + spec);
  FORGE_RETURN_IF_ERROR(VerifyCheckpoint(dir).Annotate("resume: " + spec));
  c.dir = dir;
  c.step = m->step;
  return c;
}

StatusOr<std::vector<std::string>> ApplyRetention(const std::string& root, int keep_last,
                                                  int64_t keep_every) {
  const std::vector<CheckpointEntry> all = ListStepDirs(root);
  int64_t newest_complete = -1;
  std::vector<const CheckpointEntry*> complete;
  for (const CheckpointEntry& e : all) {
    if (e.complete) {
      complete.push_back(&e);
      newest_complete = e.step;
    }
  }
  const size_t keep_n = static_cast<size_t>(std::max(keep_last, 1));
  std::vector<std::string> doomed;
  for (size_t i = 0; i < complete.size(); ++i) {
    const CheckpointEntry& e = *complete[i];
    const bool recent = i + keep_n >= complete.size();
    const bool milestone = keep_every > 0 && e.step % keep_every == 0;
    if (!recent && !milestone && e.step != newest_complete) doomed.push_back(e.dir);
  }
  for (const CheckpointEntry& e : all) {
    if (!e.complete && e.step < newest_complete) doomed.push_back(e.dir);
  }
  std::vector<std::string> removed;
  for (const std::string& dir : doomed) {
    // The manifest goes first: a half-deleted directory is then no longer a checkpoint.
    std::error_code ec;
    fs::remove(fs::path(dir) / kManifestName, ec);
    if (ec) return Status::IoError(dir + ": cannot remove manifest: " + ec.message());
    fs::remove_all(dir, ec);
    if (ec) return Status::IoError(dir + ": cannot remove: " + ec.message());
    removed.push_back(dir);
  }
  if (!removed.empty()) FORGE_RETURN_IF_ERROR(SyncDirectory(root));
  return removed;
}

}  // namespace forge
