// Corpus assembly from the installed text packages (see corpus.h for the sources and splits).
#include "worker/data/corpus.h"

#include <zlib.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string_view>
#include <unordered_map>

#include "common/file_io.h"

namespace fs = std::filesystem;

namespace forge {
namespace {

// Reads a gzip (or dictzip, which is gzip-compatible) file through zlib.
StatusOr<std::string> ReadGzipFile(const std::string& path) {
  gzFile gz = gzopen(path.c_str(), "rb");
  if (gz == nullptr) return Status::NotFound(path + ": cannot open");
  gzbuffer(gz, 1 << 17);
  std::string out;
  char buf[1 << 16];
  for (;;) {
    const int n = gzread(gz, buf, sizeof(buf));
    if (n < 0) {
      int errnum = 0;
      const std::string msg = gzerror(gz, &errnum);
      gzclose(gz);
      return Status::DataLoss(path + ": gzip read failed: " + msg);
    }
    if (n == 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  gzclose(gz);
  return out;
}

bool EndsWith(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

// Regular files (not symlinks, so linked duplicates are read once) under `dir` whose path
// passes `keep`, sorted by path.
template <typename Pred>
StatusOr<std::vector<std::string>> ListFiles(const std::string& dir, Pred keep) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return Status::NotFound(dir + ": no such directory");
  std::vector<std::string> out;
  for (auto it = fs::recursive_directory_iterator(dir, ec); !ec && it != fs::end(it);
       it.increment(ec)) {
    if (!it->is_regular_file(ec) || it->is_symlink(ec)) continue;
    const std::string p = it->path().string();
    if (keep(p)) out.push_back(p);
  }
  if (ec) return Status::IoError(dir + ": listing failed: " + ec.message());
  std::sort(out.begin(), out.end());
  return out;
}

void AddDoc(Corpus* c, std::string source, std::string name, Split split, std::string text) {
  SourceStats& st = c->stats[source];
  const int s = static_cast<int>(split);
  st.docs[s] += 1;
  st.bytes[s] += static_cast<int64_t>(text.size());
  c->docs_in[s] += 1;
  c->bytes[s] += static_cast<int64_t>(text.size());
  c->docs.push_back(Document{std::move(source), std::move(name), split, std::move(text)});
}

Status LoadSotu(const std::string& dir, int val_docs, Corpus* c) {
  // <year>_<president>_<party>.txt: name order is chronological order.
  FORGE_ASSIGN_OR_RETURN(auto files, ListFiles(dir, [](const std::string& p) {
                           const std::string name = fs::path(p).filename().string();
                           return EndsWith(name, ".txt") && !name.empty() &&
                                  name[0] >= '0' && name[0] <= '9';
                         }));
  if (files.empty()) return Status::NotFound(dir + ": no SOTU <year>_*.txt files");
  const size_t first_val = files.size() > static_cast<size_t>(val_docs)
                               ? files.size() - static_cast<size_t>(val_docs) : 0;
  for (size_t i = 0; i < files.size(); ++i) {
    FORGE_ASSIGN_OR_RETURN(std::string text, ReadSmallFile(files[i]));
    AddDoc(c, "sotu", files[i], i >= first_val ? Split::kVal : Split::kTrain,
           SanitizeUtf8(text));
  }
  return Status::Ok();
}

Status LoadMobyDick(const std::string& dir, int val_chapters, Corpus* c) {
  // Front matter first, then chapters by number (not by name: chapter_10 < chapter_2).
  std::vector<std::pair<int, std::string>> chapters;
  FORGE_ASSIGN_OR_RETURN(auto files, ListFiles(dir, [](const std::string& p) {
                           return EndsWith(p, ".txt");
                         }));
  std::vector<std::string> front;
  for (const std::string& p : files) {
    const std::string name = fs::path(p).filename().string();
    if (name.rfind("chapter_", 0) == 0) {
      chapters.emplace_back(std::atoi(name.c_str() + 8), p);
    } else if (name == "etymology.txt" || name == "extracts.txt" || name == "epilogue.txt") {
      front.push_back(p);  // epilogue goes to train: the held-out part is the last chapters
    }
  }
  if (chapters.empty()) return Status::NotFound(dir + ": no Moby-Dick chapter_*.txt files");
  std::sort(chapters.begin(), chapters.end());
  for (const std::string& p : front) {
    FORGE_ASSIGN_OR_RETURN(std::string text, ReadSmallFile(p));
    AddDoc(c, "moby_dick", p, Split::kTrain, SanitizeUtf8(text));
  }
  const size_t first_val = chapters.size() > static_cast<size_t>(val_chapters)
                               ? chapters.size() - static_cast<size_t>(val_chapters) : 0;
  for (size_t i = 0; i < chapters.size(); ++i) {
    FORGE_ASSIGN_OR_RETURN(std::string text, ReadSmallFile(chapters[i].second));
    AddDoc(c, "moby_dick", chapters[i].second, i >= first_val ? Split::kVal : Split::kTrain,
           SanitizeUtf8(text));
  }
  return Status::Ok();
}

// A headword line: starts at column 0 and carries a \pro*nun"ci*a`tion\ mark.
bool IsHeadwordLine(std::string_view line) {
  if (line.empty() || line[0] == ' ' || line[0] == '\t') return false;
  const size_t a = line.find(" \\");
  return a != std::string_view::npos && line.find('\\', a + 2) != std::string_view::npos;
}

Status LoadGcide(const std::string& path, int64_t doc_bytes, Corpus* c) {
  FORGE_ASSIGN_OR_RETURN(std::string raw, ReadGzipFile(path));
  // Skip the database header and licence text: start at the first headword line.
  size_t pos = 0;
  while (pos < raw.size()) {
    const size_t eol = std::min(raw.find('\n', pos), raw.size());
    if (IsHeadwordLine(std::string_view(raw).substr(pos, eol - pos))) break;
    pos = eol + 1;
  }
  if (pos >= raw.size()) return Status::DataLoss(path + ": no dictionary entries found");
  // Cut into documents at entry starts (a line at column 0) once a chunk is big enough.
  size_t chunk_start = pos;
  while (chunk_start < raw.size()) {
    size_t cut = std::min(chunk_start + static_cast<size_t>(doc_bytes), raw.size());
    while (cut < raw.size()) {
      const size_t nl = raw.find('\n', cut);
      if (nl == std::string::npos || nl + 1 >= raw.size()) {
        cut = raw.size();
        break;
      }
      cut = nl + 1;
      if (raw[cut] != ' ' && raw[cut] != '\n' && raw[cut] != '\t') break;
    }
    const std::string_view chunk = std::string_view(raw).substr(chunk_start, cut - chunk_start);
    const std::string name = "gcide:" + std::string(chunk.substr(0, chunk.find(' ')));
    std::string text = CleanGcideText(chunk);
    if (!text.empty()) AddDoc(c, "gcide", name, Split::kTrain, SanitizeUtf8(text));
    chunk_start = cut;
  }
  return Status::Ok();
}

Status LoadLinuxDocs(const std::string& dir, Corpus* c) {
  FORGE_ASSIGN_OR_RETURN(auto files, ListFiles(dir, [&](const std::string& p) {
                           return EndsWith(p, ".rst.gz") &&
                                  p.find("/translations/", dir.size()) == std::string::npos;
                         }));
  if (files.empty()) return Status::NotFound(dir + ": no *.rst.gz files");
  for (const std::string& p : files) {
    FORGE_ASSIGN_OR_RETURN(std::string text, ReadGzipFile(p));
    AddDoc(c, "linux_doc", p, Split::kTrain, SanitizeUtf8(text));
  }
  return Status::Ok();
}

Status LoadPythonDocs(const std::string& dir, Corpus* c) {
  FORGE_ASSIGN_OR_RETURN(auto files, ListFiles(dir, [](const std::string& p) {
                           return EndsWith(p, ".txt");
                         }));
  if (files.empty()) return Status::NotFound(dir + ": no *.txt files");
  for (const std::string& p : files) {
    FORGE_ASSIGN_OR_RETURN(std::string text, ReadSmallFile(p));
    AddDoc(c, "python_doc", p, Split::kTrain, SanitizeUtf8(text));
  }
  return Status::Ok();
}

// GCIDE's bracketed character escapes -> UTF-8. Vowel marks: ['x] acute, [`x] grave,
// ["x] diaeresis, [^x] circumflex, [x^] breve, [=x]/[-x] macron, [.x] dot, [~x] tilde.
const std::unordered_map<std::string_view, std::string_view>& GcideEscapes() {
  static const auto* map = new std::unordered_map<std::string_view, std::string_view>{
      {"'a", "á"}, {"'e", "é"}, {"'i", "í"}, {"'o", "ó"}, {"'u", "ú"}, {"'y", "ý"},
      {"'E", "É"}, {"'A", "Á"}, {"`a", "à"}, {"`e", "è"}, {"`i", "ì"}, {"`o", "ò"},
      {"`u", "ù"}, {"\"a", "ä"}, {"\"e", "ë"}, {"\"i", "ï"}, {"\"o", "ö"}, {"\"u", "ü"},
      {"\"y", "ÿ"}, {"^a", "â"}, {"^e", "ê"}, {"^i", "î"}, {"^o", "ô"}, {"^u", "û"},
      {"a^", "ă"}, {"e^", "ĕ"}, {"i^", "ĭ"}, {"o^", "ŏ"}, {"u^", "ŭ"}, {"y^", "y"},
      {"oo^", "oo"}, {"=a", "ā"}, {"=e", "ē"}, {"=i", "ī"}, {"imac", "ī"}, {"=o", "ō"},
      {"=u", "ū"}, {"=y", "ȳ"}, {"=ae", "ǣ"}, {"=oo", "ōō"}, {"-a", "ā"}, {"-e", "ē"},
      {"-i", "ī"}, {"-o", "ō"}, {"-u", "ū"}, {".a", "ȧ"}, {".e", "ė"}, {".u", "u"},
      {".r", "ṛ"}, {".t", "ṭ"}, {".n", "ṇ"}, {"~a", "ã"}, {"~e", "ẽ"}, {"~n", "ñ"},
      {"~l", "l"}, {",c", "ç"}, {"ae", "æ"}, {"AE", "Æ"}, {"oe", "œ"}, {"OE", "Œ"},
      {"aum", "ä"}, {"asl", "a"}, {"add", "a"}, {"udd", "u"}, {"*a", "a"}, {"*u", "u"},
      {"eth", "ð"}, {"thorn", "þ"}, {"th", "th"}, {"ng", "ng"}, {"yogh", "ȝ"},
      {"zdot", "ż"}, {"dsdot", "ḍ"}, {"root", "√"}, {"deg", "°"}, {"sect", "§"},
      {"pounds", "£"}, {"middot", "·"}, {"para", "¶"}, {"dagger", "†"}, {"dag", "†"},
      {"times", "×"}, {"div", "÷"}, {"divby", "÷"}, {"nbsp", " "}, {"ldqo", "“"},
      {"rdqo", "”"}, {"rarr", "→"}, {"flat", "♭"}, {"sharp", "♯"}, {"min", "′"},
      {"sec", "″"}, {"bprime", "″"}, {"hand", "☞"}, {"filig", "fi"}, {"ffllig", "ffl"},
      {"alpha", "α"}, {"beta", "β"}, {"gamma", "γ"}, {"Gamma", "Γ"}, {"delta", "δ"},
      {"Delta", "Δ"}, {"eta", "η"}, {"theta", "θ"}, {"iota", "ι"}, {"kappa", "κ"},
      {"lambda", "λ"}, {"Lambda", "Λ"}, {"mu", "μ"}, {"nu", "ν"}, {"xi", "ξ"},
      {"pi", "π"}, {"Pi", "Π"}, {"rho", "ρ"}, {"sigma", "σ"}, {"tau", "τ"}, {"phi", "φ"},
      {"chi", "χ"}, {"Chi", "Χ"}};
  return *map;
}

// [1913 Webster], [WordNet 1.5 +PJC], [Webster 1913 Suppl.], [RHUD], ...: who wrote the
// entry, not part of it. True when every word is a source word or a number and at least one
// names a source.
bool IsSourceTag(std::string_view content) {
  static const std::unordered_map<std::string_view, bool> words = {
      {"Webster", true}, {"WordNet", true}, {"PJC", true}, {"PJC.", true}, {"Century", true},
      {"RDH", true},     {"RHUD", true},    {"MI11", true}, {"MW10", true}, {"wn1", true},
      {"WE1", true},     {"GG", true},      {"RP", true},   {"Suppl.", false}, {"Dict.", false},
      {"sense", false},  {"AS", false},     {"+", false}};
  bool names_source = false;
  size_t i = 0;
  while (i < content.size()) {
    while (i < content.size() && content[i] == ' ') ++i;
    size_t j = i;
    while (j < content.size() && content[j] != ' ') ++j;
    if (j == i) break;
    std::string_view w = content.substr(i, j - i);
    if (w.size() > 1 && w[0] == '+') w.remove_prefix(1);
    if (auto it = words.find(w); it != words.end()) {
      names_source |= it->second;
    } else if (w.find_first_not_of("0123456789.") != std::string_view::npos) {
      return false;
    }
    i = j;
  }
  return names_source;
}

}  // namespace

const char* SplitName(Split s) { return s == Split::kTrain ? "train" : "val"; }

std::string DefaultDataDir() {
  if (const char* env = std::getenv("FORGE_DATA_DIR"); env != nullptr && *env != '\0') {
    return env;
  }
  std::error_code ec;
  for (fs::path p = fs::current_path(ec); !ec && !p.empty(); p = p.parent_path()) {
    if (fs::is_directory(p / ".forge-data", ec)) return (p / ".forge-data").string();
    if (p == p.parent_path()) break;
  }
  return ".forge-data";
}

CorpusSources DefaultCorpusSources(const std::string& data_dir) {
  CorpusSources s;
  const std::string npm = data_dir + "/npm/node_modules/@stdlib";
  s.sotu_dir = npm + "/datasets-sotu/data";
  s.moby_dick_dir = npm + "/datasets-moby-dick/data";
  s.gcide_dict = "/usr/share/dictd/gcide.dict.dz";
  s.linux_doc_dir = "/usr/share/doc/linux-doc-6.1/Documentation";
  s.python_doc_dir = "/usr/share/doc/python3.11/html/_sources";
  return s;
}


std::string CleanGcideText(std::string_view raw) {
  const auto& escapes = GcideEscapes();
  std::string out;
  out.reserve(raw.size());
  bool last_blank = true;  // no blank lines at the start
  size_t pos = 0;
  while (pos < raw.size()) {
    size_t eol = raw.find('\n', pos);
    if (eol == std::string_view::npos) eol = raw.size();
    const std::string_view line = raw.substr(pos, eol - pos);
    pos = eol + 1;

    std::string clean;
    size_t i = line.find_first_not_of(" \t");  // indentation goes
    if (i == std::string_view::npos) i = line.size();
    const bool was_blank = i == line.size();
    while (i < line.size()) {
      const char ch = line[i];
      if (ch == '\\') {  // \pro*nun"ci*a`tion\ : drop, with the space before it
        const size_t close = line.find('\\', i + 1);
        if (close != std::string_view::npos) {
          while (!clean.empty() && clean.back() == ' ') clean.pop_back();
          i = close + 1;
          // "\fox"trot`\n." -> "n." must not stick to the word before it.
          if (i < line.size() && std::isalnum(static_cast<unsigned char>(line[i]))) {
            clean.push_back(' ');
          }
          continue;
        }
      } else if (ch == '[') {
        const size_t close = line.find_first_of("[]", i + 1);
        if (close != std::string_view::npos && line[close] == ']') {
          const std::string_view content = line.substr(i + 1, close - i - 1);
          if (auto it = escapes.find(content); it != escapes.end()) {
            clean.append(it->second);
            i = close + 1;
            continue;
          }
          if (IsSourceTag(content)) {
            while (!clean.empty() && clean.back() == ' ') clean.pop_back();
            i = close + 1;
            continue;
          }
        }
      } else if (ch == '{' || ch == '}') {  // cross-reference braces
        ++i;
        continue;
      } else if (ch == ' ' || ch == '\t') {  // runs of spaces (column alignment) -> one
        if (!clean.empty() && clean.back() != ' ') clean.push_back(' ');
        ++i;
        continue;
      }
      clean.push_back(ch);
      ++i;
    }
    while (!clean.empty() && clean.back() == ' ') clean.pop_back();
    if (clean.empty()) {
      // A blank line stays (once); a line that only held a source tag disappears.
      if (was_blank && !last_blank) {
        out.push_back('\n');
        last_blank = true;
      }
      continue;
    }
    out.append(clean);
    out.push_back('\n');
    last_blank = false;
  }
  return out;
}

std::string Corpus::Summary() const {
  std::string s;
  char buf[160];
  for (const auto& [name, st] : stats) {
    std::snprintf(buf, sizeof(buf), "%s%s %.1f MB (%lld docs, val %lld)", s.empty() ? "" : ", ",
                  name.c_str(), (st.bytes[0] + st.bytes[1]) / 1e6,
                  static_cast<long long>(st.docs[0] + st.docs[1]),
                  static_cast<long long>(st.docs[1]));
    s += buf;
  }
  std::snprintf(buf, sizeof(buf), "; total train %.1f MB / %lld docs, val %.2f MB / %lld docs",
                bytes[0] / 1e6, static_cast<long long>(docs_in[0]), bytes[1] / 1e6,
                static_cast<long long>(docs_in[1]));
  return s + buf;
}

StatusOr<Corpus> LoadCorpus(const CorpusSources& src) {
  Corpus c;
  if (!src.sotu_dir.empty()) {
    FORGE_RETURN_IF_ERROR(LoadSotu(src.sotu_dir, src.sotu_val_docs, &c).Annotate("sotu"));
  }
  if (!src.moby_dick_dir.empty()) {
    FORGE_RETURN_IF_ERROR(
        LoadMobyDick(src.moby_dick_dir, src.moby_val_chapters, &c).Annotate("moby_dick"));
  }
  if (!src.gcide_dict.empty()) {
    if (src.gcide_doc_bytes <= 0) return Status::Invalid("gcide_doc_bytes must be > 0");
    FORGE_RETURN_IF_ERROR(LoadGcide(src.gcide_dict, src.gcide_doc_bytes, &c).Annotate("gcide"));
  }
  if (!src.linux_doc_dir.empty()) {
    FORGE_RETURN_IF_ERROR(LoadLinuxDocs(src.linux_doc_dir, &c).Annotate("linux_doc"));
  }
  if (!src.python_doc_dir.empty()) {
    FORGE_RETURN_IF_ERROR(LoadPythonDocs(src.python_doc_dir, &c).Annotate("python_doc"));
  }
  if (c.docs.empty()) return Status::Invalid("corpus: no sources configured");
  return c;
}

}  // namespace forge
