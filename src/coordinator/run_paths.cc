#include "coordinator/run_paths.h"

#include <cctype>
#include <filesystem>

#include "common/text_excerpt.h"

namespace forge::coord {

StatusOr<std::string> ResolveInside(const std::string& root, std::string_view relative,
                                    std::string_view what) {
  const std::string shown = std::string(what) + " '" + TextExcerpt(relative) + "'";
  if (relative.empty()) return Status::Invalid(shown + ": must not be empty");
  if (relative.front() == '/')
    return Status::Invalid(shown + ": must be a path relative to the run directory");
  size_t start = 0;
  while (start <= relative.size()) {
    size_t end = relative.find('/', start);
    if (end == std::string_view::npos) end = relative.size();
    const std::string_view part = relative.substr(start, end - start);
    if (part.empty() || part == "." || part == "..")
      return Status::Invalid(shown + ": must stay inside the run directory (no '..', '.' or "
                                     "empty components)");
    for (char c : part)
      if (c == '\0' || c == '\\')
        return Status::Invalid(shown + ": contains a forbidden character");
    start = end + 1;
  }
  return root + "/" + std::string(relative);
}

StatusOr<std::string> ResolveUnderRoots(const std::vector<std::string>& roots,
                                        std::string_view path, std::string_view what) {
  namespace fs = std::filesystem;
  const std::string shown = std::string(what) + " '" + TextExcerpt(path) + "'";
  std::string allowed;
  for (const std::string& r : roots) allowed += (allowed.empty() ? "" : ", ") + r;
  if (roots.empty())
    return Status::Invalid(shown + ": this coordinator takes no input paths (it was started "
                                   "without --data-root); leave it empty for the workers' own "
                                   "dataset ($FORGE_DATA_DIR/dataset)");
  if (path.empty() || path.find('\0') != std::string_view::npos)
    return Status::Invalid(shown + ": must be a path under " + allowed);
  std::error_code ec;
  fs::path p(path);
  if (p.is_relative()) p = fs::path(roots.front()) / p;
  const fs::path resolved = fs::weakly_canonical(p, ec);
  if (ec) return Status::Invalid(shown + ": cannot be resolved: " + ec.message());
  for (const std::string& r : roots) {
    const fs::path root = fs::weakly_canonical(r, ec);
    if (ec) continue;
    const fs::path rel = resolved.lexically_relative(root);
    // Inside: an absolute path is kept as written (workers and data records name it so), a
    // relative one becomes the root's.
    if (!rel.empty() && *rel.begin() != "..")
      return fs::path(path).is_absolute() ? std::string(path) : p.lexically_normal().string();
  }
  return Status::Invalid(shown + ": resolves to " + TextExcerpt(resolved.string(), 200) +
                         ", outside the data roots of this coordinator (" + allowed + ")");
}

StatusOr<int64_t> ParseCheckpointName(std::string_view name, std::string_view what) {
  if (name.empty() || name == "latest") return int64_t{-1};
  constexpr std::string_view kPrefix = "step_";
  if (name.substr(0, kPrefix.size()) == kPrefix && name.size() > kPrefix.size() &&
      name.size() <= kPrefix.size() + 18) {
    int64_t step = 0;
    bool digits = true;
    for (char c : name.substr(kPrefix.size())) {
      if (!std::isdigit(static_cast<unsigned char>(c))) digits = false;
      else step = step * 10 + (c - '0');
    }
    if (digits) return step;
  }
  return Status::Invalid(std::string(what) + " '" + TextExcerpt(name) +
                         "': expected latest or step_<N> (checkpoint paths are not accepted)");
}

}  // namespace forge::coord
