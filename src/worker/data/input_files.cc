// Input discovery: patterns -> sorted, de-duplicated input files (see input_files.h).
#include "worker/data/input_files.h"

#include <glob.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <set>
#include <string_view>
#include <utility>

#include "common/named_values.h"

namespace fs = std::filesystem;

namespace forge {
namespace {

constexpr std::array<NamedValue<InputFormat>, 3> kInputFormatNames{
    {{"auto", InputFormat::kAuto}, {"text", InputFormat::kText}, {"jsonl", InputFormat::kJsonl}}};
constexpr std::array<NamedValue<Compression>, 3> kCompressionNames{
    {{"none", Compression::kNone}, {"gzip", Compression::kGzip}, {"zstd", Compression::kZstd}}};

bool EndsWith(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

std::string Lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

bool HasGlobChars(const std::string& s) { return s.find_first_of("*?[{") != std::string::npos; }

struct Collector {
  InputFormat format;
  bool val;
  std::vector<InputFile> files;
  std::set<std::pair<dev_t, ino_t>> seen;
  int64_t skipped = 0;
  std::vector<std::string> skipped_examples;
  int64_t reached = 0;  // regular files reached, kept or not

  // Adds one regular file (after following links); `named` when the user named it directly.
  Status AddFile(const std::string& path, const struct stat& st, bool named) {
    ++reached;
    InputFile f;
    f.path = fs::absolute(path).lexically_normal().string();
    InputFormat by_name = InputFormat::kAuto;
    ClassifyName(fs::path(path).filename().string(), &by_name, &f.compression);
    f.format = format == InputFormat::kAuto ? by_name : format;
    if (f.format == InputFormat::kAuto) {
      if (named) {
        return Status::Invalid(path + ": unknown format (name a .txt, .md, .jsonl or .ndjson "
                               "file, optionally .gz or .zst, or give --format text|jsonl)");
      }
      ++skipped;
      if (skipped_examples.size() < 5) skipped_examples.push_back(f.path);
      return Status::Ok();
    }
    if (!seen.insert({st.st_dev, st.st_ino}).second) return Status::Ok();
    f.size = static_cast<uint64_t>(st.st_size);
    f.mtime_ns = static_cast<int64_t>(st.st_mtim.tv_sec) * 1'000'000'000 + st.st_mtim.tv_nsec;
    f.val = val;
    files.push_back(std::move(f));
    return Status::Ok();
  }

  Status Walk(const std::string& dir) {
    std::error_code ec;
    auto it = fs::recursive_directory_iterator(dir, fs::directory_options::none, ec);
    if (ec) return Status::IoError(dir + ": cannot list: " + ec.message());
    for (; it != fs::recursive_directory_iterator(); it.increment(ec)) {
      if (ec) return Status::IoError(dir + ": listing failed: " + ec.message());
      const std::string name = it->path().filename().string();
      if (!name.empty() && name[0] == '.') {  // hidden: .git, .DS_Store, editor files
        if (it->is_directory(ec)) it.disable_recursion_pending();
        continue;
      }
      const std::string p = it->path().string();
      struct stat lst;
      if (::lstat(p.c_str(), &lst) != 0) {
        return Status::IoError(p + ": cannot stat: " + std::strerror(errno));
      }
      if (S_ISDIR(lst.st_mode)) continue;  // the iterator walks into it
      struct stat st;
      if (::stat(p.c_str(), &st) != 0) {
        if (S_ISLNK(lst.st_mode)) continue;  // a dangling link
        return Status::IoError(p + ": cannot stat: " + std::strerror(errno));
      }
      if (!S_ISREG(st.st_mode)) continue;  // links to directories, devices, sockets
      FORGE_RETURN_IF_ERROR(AddFile(p, st, /*named=*/false));
    }
    if (ec) return Status::IoError(dir + ": listing failed: " + ec.message());
    return Status::Ok();
  }

  // One path from the user or from a glob.
  Status AddPath(const std::string& path) {
    struct stat st;
    if (::stat(path.c_str(), &st) != 0) {
      if (errno == ENOENT) return Status::NotFound(path + ": no such file or directory");
      return Status::IoError(path + ": cannot stat: " + std::strerror(errno));
    }
    if (S_ISDIR(st.st_mode)) return Walk(path);
    if (!S_ISREG(st.st_mode)) return Status::Invalid(path + ": not a regular file");
    return AddFile(path, st, /*named=*/true);
  }
};

}  // namespace

const char* InputFormatName(InputFormat f) { return NameOf(kInputFormatNames, f); }
StatusOr<InputFormat> ParseInputFormat(const std::string& name) {
  return ValueOf(kInputFormatNames, name, "--format");
}
const char* CompressionName(Compression c) { return NameOf(kCompressionNames, c); }

void ClassifyName(const std::string& name, InputFormat* format, Compression* compression) {
  std::string n = Lower(name);
  *compression = Compression::kNone;
  if (EndsWith(n, ".gz")) {
    *compression = Compression::kGzip;
    n.resize(n.size() - 3);
  } else if (EndsWith(n, ".zst")) {
    *compression = Compression::kZstd;
    n.resize(n.size() - 4);
  }
  *format = InputFormat::kAuto;
  for (const char* ext : {".txt", ".md", ".text", ".markdown"}) {
    if (EndsWith(n, ext)) *format = InputFormat::kText;
  }
  for (const char* ext : {".jsonl", ".ndjson"}) {
    if (EndsWith(n, ext)) *format = InputFormat::kJsonl;
  }
}

StatusOr<InputList> DiscoverInputs(const std::vector<std::string>& patterns, InputFormat format,
                                   bool val) {
  Collector c{format, val, {}, {}, 0, {}, 0};
  for (const std::string& pattern : patterns) {
    const int64_t reached_before = c.reached;
    if (HasGlobChars(pattern) && !fs::exists(pattern)) {
      glob_t g{};
      const int rc = ::glob(pattern.c_str(), GLOB_BRACE | GLOB_TILDE, nullptr, &g);
      if (rc == GLOB_NOMATCH) {
        ::globfree(&g);
        return Status::NotFound("--input " + pattern + ": no file matches");
      }
      if (rc != 0) {
        ::globfree(&g);
        return Status::IoError("--input " + pattern + ": glob failed (error " +
                               std::to_string(rc) + ")");
      }
      std::vector<std::string> matches(g.gl_pathv, g.gl_pathv + g.gl_pathc);
      ::globfree(&g);
      for (const std::string& m : matches) FORGE_RETURN_IF_ERROR(c.AddPath(m));
    } else {
      FORGE_RETURN_IF_ERROR(c.AddPath(pattern));
    }
    if (c.reached == reached_before) {
      return Status::NotFound(pattern + ": no files found there");
    }
  }
  std::sort(c.files.begin(), c.files.end(),
            [](const InputFile& a, const InputFile& b) { return a.path < b.path; });
  InputList out;
  out.files = std::move(c.files);
  out.skipped = c.skipped;
  out.skipped_examples = std::move(c.skipped_examples);
  return out;
}

Status StatInput(const std::string& path, uint64_t* size, int64_t* mtime_ns) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) return Status::NotFound(path + ": no such file");
    return Status::IoError(path + ": cannot stat: " + std::strerror(errno));
  }
  *size = static_cast<uint64_t>(st.st_size);
  *mtime_ns = static_cast<int64_t>(st.st_mtim.tv_sec) * 1'000'000'000 + st.st_mtim.tv_nsec;
  return Status::Ok();
}

}  // namespace forge
