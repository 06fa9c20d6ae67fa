// Grouping and chunking of input files into work units (see prepare_plan.h).
#include "worker/data/prepare_plan.h"

#include <algorithm>

namespace forge {
namespace {

constexpr size_t kMaxFilesPerUnit = 4096;

std::string FileKey(const InputFile& f) {
  return f.path + "|" + std::to_string(f.size) + "|" + std::to_string(f.mtime_ns) +
         (f.val ? "|val" : "") + "\n";
}

}  // namespace

std::vector<PlannedUnit> PlanUnits(const std::vector<InputFile>& files, uint64_t chunk_bytes) {
  std::vector<PlannedUnit> units;
  PlannedUnit group;
  uint64_t weight = 0;
  auto flush = [&] {
    if (group.files.empty()) return;
    units.push_back(std::move(group));
    group = PlannedUnit{};
    weight = 0;
  };
  for (size_t i = 0; i < files.size(); ++i) {
    const InputFile& f = files[i];
    const bool chunked = chunk_bytes > 0 && f.format == InputFormat::kJsonl &&
                         f.compression == Compression::kNone && f.size > chunk_bytes;
    if (chunked) {
      flush();
      const uint64_t n = (f.size + chunk_bytes - 1) / chunk_bytes;
      for (uint64_t k = 0; k < n; ++k) {
        PlannedUnit u;
        u.files = {static_cast<int>(i)};
        u.chunk = k;
        u.chunk_bytes = chunk_bytes;
        u.bytes = std::min(chunk_bytes, f.size - k * chunk_bytes);
        u.key = FileKey(f) + "chunk " + std::to_string(k) + " of " + std::to_string(chunk_bytes) +
                "\n";
        units.push_back(std::move(u));
      }
      continue;
    }
    const uint64_t w = f.compression == Compression::kNone ? f.size : 4 * f.size;
    if (!group.files.empty() &&
        (weight + w > chunk_bytes || group.files.size() >= kMaxFilesPerUnit)) {
      flush();
    }
    group.files.push_back(static_cast<int>(i));
    group.bytes += f.size;
    group.key += FileKey(f);
    weight += w;
  }
  flush();
  return units;
}

}  // namespace forge
