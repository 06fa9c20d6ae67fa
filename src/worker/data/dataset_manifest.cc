// manifest.json and its tables (see dataset_manifest.h).
#include "worker/data/dataset_manifest.h"

#include <cstdio>
#include <cstring>
#include <string_view>

#include <nlohmann/json.hpp>

#include "common/checksum.h"
#include "common/file_io.h"

namespace forge {
namespace {

using nlohmann::json;

constexpr char kUnigramMagic[8] = {'F', 'R', 'G', 'U', 'N', 'I', 'G', '\0'};
constexpr std::string_view kShardsHeader = "# split\tfile\ttokens\tcrc32c\n";

StatusOr<uint32_t> ParseHex32(const std::string& s, const std::string& where) {
  if (s.size() != 10 || s.rfind("0x", 0) != 0 ||
      s.find_first_not_of("0123456789abcdefABCDEF", 2) != std::string::npos) {
    return Status::DataLoss(where + ": bad checksum '" + s + "' (want 0x + 8 hex digits)");
  }
  return static_cast<uint32_t>(std::stoul(s.substr(2), nullptr, 16));
}

bool GoodShardName(const std::string& f) {
  return !f.empty() && f.find('/') == std::string::npos && f != "." && f != "..";
}

json TableJson(const TableRef& t) {
  return {{"file", t.file}, {"rows", t.rows}, {"crc32c", Crc32cHex(t.crc32c)}};
}

Status ReadTableRef(const json& j, const std::string& where, TableRef* t) {
  t->file = j.at("file").get<std::string>();
  t->rows = j.at("rows").get<int64_t>();
  FORGE_ASSIGN_OR_RETURN(t->crc32c, ParseHex32(j.at("crc32c").get<std::string>(), where));
  if (!GoodShardName(t->file)) return Status::DataLoss(where + ": bad table name '" + t->file + "'");
  return Status::Ok();
}

// Reads a table file and checks it against its reference.
StatusOr<std::string> ReadTable(const std::string& dir, const TableRef& t) {
  const std::string path = dir + "/" + t.file;
  FORGE_ASSIGN_OR_RETURN(std::string data, ReadSmallFile(path));
  const uint32_t crc = Crc32c(data);
  if (crc != t.crc32c) {
    return Status::DataLoss(path + ": checksum mismatch: CRC32C " + Crc32cHex(crc) +
                            ", manifest says " + Crc32cHex(t.crc32c));
  }
  return data;
}

std::string ShardsTable(const DatasetManifest& m) {
  std::string out(kShardsHeader);
  for (Split s : {Split::kTrain, Split::kVal}) {
    for (const ShardEntry& e : m.splits[static_cast<int>(s)].shards) {
      out += SplitName(s);
      out += '\t';
      out += e.file;
      out += '\t';
      out += std::to_string(e.tokens);
      out += '\t';
      out += Crc32cHex(e.crc32c);
      out += '\n';
    }
  }
  return out;
}

Status ParseShardsTable(const std::string& path, std::string_view data, DatasetManifest* m) {
  if (data.substr(0, kShardsHeader.size()) != kShardsHeader) {
    return Status::DataLoss(path + ": not a shards table (bad header line)");
  }
  size_t pos = kShardsHeader.size();
  int64_t line = 1;
  while (pos < data.size()) {
    ++line;
    size_t eol = data.find('\n', pos);
    if (eol == std::string_view::npos) eol = data.size();
    const std::string_view row = data.substr(pos, eol - pos);
    pos = eol + 1;
    std::string_view f[4];
    size_t a = 0;
    int n = 0;
    for (; n < 4; ++n) {
      const size_t tab = n < 3 ? row.find('\t', a) : row.size();
      if (tab == std::string_view::npos) break;
      f[n] = row.substr(a, tab - a);
      a = tab + 1;
    }
    const std::string where = path + ":" + std::to_string(line);
    if (n != 4) return Status::DataLoss(where + ": expected 4 tab-separated fields");
    ShardEntry e;
    e.file = std::string(f[1]);
    if (!GoodShardName(e.file)) return Status::DataLoss(where + ": bad shard name");
    char* end = nullptr;
    const std::string tokens(f[2]);
    e.tokens = std::strtoll(tokens.c_str(), &end, 10);
    if (tokens.empty() || *end != '\0' || e.tokens < 0) {
      return Status::DataLoss(where + ": bad token count '" + tokens + "'");
    }
    FORGE_ASSIGN_OR_RETURN(e.crc32c, ParseHex32(std::string(f[3]), where));
    Split s;
    if (f[0] == "train") s = Split::kTrain;
    else if (f[0] == "val") s = Split::kVal;
    else return Status::DataLoss(where + ": bad split '" + std::string(f[0]) + "'");
    m->splits[static_cast<int>(s)].shards.push_back(std::move(e));
  }
  return Status::Ok();
}

Status CheckSplitSums(const std::string& path, const DatasetManifest& m) {
  for (Split s : {Split::kTrain, Split::kVal}) {
    const SplitManifest& sm = m.splits[static_cast<int>(s)];
    int64_t sum = 0;
    for (const ShardEntry& e : sm.shards) sum += e.tokens;
    if (sum != sm.tokens) {
      return Status::DataLoss(path + ": split " + SplitName(s) + " says " +
                              std::to_string(sm.tokens) + " tokens but its shards hold " +
                              std::to_string(sum));
    }
  }
  return Status::Ok();
}

// Version 1: everything inline.
Status ReadVersion1(const json& j, const std::string& path, DatasetManifest* m) {
  // Version 1 datasets were all GPT-2 ("gpt2-bpe"), made before identities were recorded.
  m->tokenizer = j.at("tokenizer").get<std::string>();
  if (m->tokenizer == "gpt2-bpe") m->tokenizer = "gpt2";
  m->tokenizer_spec = m->tokenizer;
  m->vocab_size = j.at("vocab_size").get<int32_t>();
  m->eot_token = j.at("eot_token").get<int32_t>();
  auto dtype = ParseTokenDtype(j.at("dtype").get<std::string>());
  if (!dtype.ok()) return dtype.status().Annotate(path);
  m->dtype = dtype.value();
  m->options_hash = j.value("options_hash", "");
  m->settings.source = "bundled";
  for (Split s : {Split::kTrain, Split::kVal}) {
    const json& js = j.at("splits").at(SplitName(s));
    SplitManifest& sm = m->splits[static_cast<int>(s)];
    sm.tokens = js.at("tokens").get<int64_t>();
    sm.docs = js.value("docs", int64_t{0});
    sm.text_bytes = js.value("text_bytes", int64_t{0});
    for (const json& e : js.at("shards")) {
      ShardEntry se;
      se.file = e.at("file").get<std::string>();
      se.tokens = e.at("tokens").get<int64_t>();
      FORGE_ASSIGN_OR_RETURN(se.crc32c,
                             ParseHex32(e.at("crc32c").get<std::string>(), path + ": " + se.file));
      if (!GoodShardName(se.file) || se.tokens < 0) {
        return Status::DataLoss(path + ": bad shard entry '" + se.file + "'");
      }
      sm.shards.push_back(std::move(se));
    }
  }
  return Status::Ok();
}

void ReadSources(const json& j, DatasetManifest* m) {
  if (!j.contains("sources")) return;
  for (const auto& [name, v] : j["sources"].items()) {
    SourceStats st;
    st.docs[0] = v.value("train_docs", int64_t{0});
    st.docs[1] = v.value("val_docs", int64_t{0});
    st.bytes[0] = v.value("train_bytes", int64_t{0});
    st.bytes[1] = v.value("val_bytes", int64_t{0});
    m->sources[name] = st;
  }
}

}  // namespace

std::string DatasetSettings::Fingerprint() const {
  char frac[32];
  std::snprintf(frac, sizeof(frac), "%.17g", val_fraction);
  return "source=" + source + " format=" + format + " text_key=" + json(text_key).dump() +
         " invalid_utf8=" + invalid_utf8 + " val_fraction=" + frac +
         " shard_tokens=" + std::to_string(shard_tokens) +
         " chunk_bytes=" + std::to_string(chunk_bytes) +
         " max_doc_bytes=" + std::to_string(max_doc_bytes);
}

std::string TableName(const char* kind, int64_t generation, const char* ext) {
  char buf[96];
  std::snprintf(buf, sizeof(buf), "%s-%06lld.%s", kind, static_cast<long long>(generation), ext);
  return buf;
}

Status WriteDatasetManifest(const std::string& dir, const DatasetManifest& m) {
  const std::string shards = ShardsTable(m);
  TableRef shards_ref{TableName("shards", m.generation, "tsv"),
                      static_cast<int64_t>(m.splits[0].shards.size() + m.splits[1].shards.size()),
                      Crc32c(shards)};
  FORGE_RETURN_IF_ERROR(WriteFileAtomic(dir + "/" + shards_ref.file, shards));

  json j;
  j["format"] = "forge-dataset";
  j["version"] = 2;
  j["tokenizer"] = {{"name", m.tokenizer},
                    {"identity", m.tokenizer_identity},
                    {"spec", m.tokenizer_spec},
                    {"vocab_size", m.vocab_size},
                    {"eot", m.eot_token},
                    {"bos", m.bos_token}};
  j["dtype"] = TokenDtypeName(m.dtype);
  j["options_hash"] = m.options_hash;
  const DatasetSettings& st = m.settings;
  j["prepare"] = {{"source", st.source},          {"format", st.format},
                  {"text_key", st.text_key},      {"invalid_utf8", st.invalid_utf8},
                  {"val_fraction", st.val_fraction}, {"shard_tokens", st.shard_tokens},
                  {"chunk_bytes", st.chunk_bytes}, {"max_doc_bytes", st.max_doc_bytes}};
  for (Split s : {Split::kTrain, Split::kVal}) {
    const SplitManifest& sm = m.splits[static_cast<int>(s)];
    j["splits"][SplitName(s)] = {{"tokens", sm.tokens},
                                 {"docs", sm.docs},
                                 {"text_bytes", sm.text_bytes},
                                 {"shards", sm.shards.size()}};
  }
  j["totals"] = {{"files", m.files},
                 {"units", m.units},
                 {"input_bytes", m.input_bytes},
                 {"repaired_docs", m.repaired_docs},
                 {"skipped_docs", m.skipped_docs}};
  j["sources"] = json::object();
  for (const auto& [name, s] : m.sources) {
    j["sources"][name] = {{"train_docs", s.docs[0]}, {"val_docs", s.docs[1]},
                          {"train_bytes", s.bytes[0]}, {"val_bytes", s.bytes[1]}};
  }
  j["generation"] = m.generation;
  j["tables"]["shards"] = TableJson(shards_ref);
  if (!m.files_table.file.empty()) j["tables"]["files"] = TableJson(m.files_table);
  if (!m.unigram_table.file.empty()) j["tables"]["unigram"] = TableJson(m.unigram_table);
  j["created"] = {{"unix_time", m.created_unix_time},
                  {"seconds", m.created_seconds},
                  {"threads", m.created_threads}};
  return WriteFileAtomic(dir + "/" + kManifestFile, j.dump(2) + "\n");
}

StatusOr<DatasetManifest> ReadDatasetManifest(const std::string& dir) {
  const std::string path = dir + "/" + kManifestFile;
  auto text = ReadSmallFile(path);
  if (!text.ok()) {
    if (text.status().code() == Code::kNotFound) {
      return Status::NotFound(path + ": no dataset manifest (run `forge data prepare`)");
    }
    return text.status();
  }
  json j = json::parse(*text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return Status::DataLoss(path + ": not valid JSON");
  DatasetManifest m;
  try {
    if (j.at("format").get<std::string>() != "forge-dataset") {
      return Status::DataLoss(path + ": format is not forge-dataset");
    }
    m.version = j.at("version").get<int>();
    if (m.version == 1) {
      FORGE_RETURN_IF_ERROR(ReadVersion1(j, path, &m));
    } else if (m.version == 2) {
      const json& t = j.at("tokenizer");
      m.tokenizer = t.at("name").get<std::string>();
      m.tokenizer_identity = t.at("identity").get<std::string>();
      m.tokenizer_spec = t.value("spec", m.tokenizer);
      m.vocab_size = t.at("vocab_size").get<int32_t>();
      m.eot_token = t.at("eot").get<int32_t>();
      m.bos_token = t.value("bos", -1);
      auto dtype = ParseTokenDtype(j.at("dtype").get<std::string>());
      if (!dtype.ok()) return dtype.status().Annotate(path);
      m.dtype = dtype.value();
      m.options_hash = j.value("options_hash", "");
      if (j.contains("prepare")) {
        const json& p = j["prepare"];
        DatasetSettings& st = m.settings;
        st.source = p.value("source", st.source);
        st.format = p.value("format", st.format);
        st.text_key = p.value("text_key", st.text_key);
        st.invalid_utf8 = p.value("invalid_utf8", st.invalid_utf8);
        st.val_fraction = p.value("val_fraction", 0.0);
        st.shard_tokens = p.value("shard_tokens", int64_t{0});
        st.chunk_bytes = p.value("chunk_bytes", uint64_t{0});
        st.max_doc_bytes = p.value("max_doc_bytes", uint64_t{0});
      }
      int64_t shard_count[2] = {0, 0};
      for (Split s : {Split::kTrain, Split::kVal}) {
        const json& js = j.at("splits").at(SplitName(s));
        SplitManifest& sm = m.splits[static_cast<int>(s)];
        sm.tokens = js.at("tokens").get<int64_t>();
        sm.docs = js.value("docs", int64_t{0});
        sm.text_bytes = js.value("text_bytes", int64_t{0});
        shard_count[static_cast<int>(s)] = js.at("shards").get<int64_t>();
      }
      if (j.contains("totals")) {
        const json& t2 = j["totals"];
        m.files = t2.value("files", int64_t{0});
        m.units = t2.value("units", int64_t{0});
        m.input_bytes = t2.value("input_bytes", int64_t{0});
        m.repaired_docs = t2.value("repaired_docs", int64_t{0});
        m.skipped_docs = t2.value("skipped_docs", int64_t{0});
      }
      m.generation = j.value("generation", int64_t{0});
      const json& tables = j.at("tables");
      TableRef shards;
      FORGE_RETURN_IF_ERROR(ReadTableRef(tables.at("shards"), path + ": tables.shards", &shards));
      if (tables.contains("files")) {
        FORGE_RETURN_IF_ERROR(ReadTableRef(tables["files"], path + ": tables.files", &m.files_table));
      }
      if (tables.contains("unigram")) {
        FORGE_RETURN_IF_ERROR(
            ReadTableRef(tables["unigram"], path + ": tables.unigram", &m.unigram_table));
      }
      FORGE_ASSIGN_OR_RETURN(std::string table, ReadTable(dir, shards));
      FORGE_RETURN_IF_ERROR(ParseShardsTable(dir + "/" + shards.file, table, &m));
      for (int s = 0; s < 2; ++s) {
        if (static_cast<int64_t>(m.splits[s].shards.size()) != shard_count[s]) {
          return Status::DataLoss(dir + "/" + shards.file + ": " +
                                  std::to_string(m.splits[s].shards.size()) + " " +
                                  SplitName(static_cast<Split>(s)) + " shards, " + path +
                                  " says " + std::to_string(shard_count[s]));
        }
      }
    } else {
      return Status::DataLoss(path + ": unsupported version " + std::to_string(m.version));
    }
    FORGE_RETURN_IF_ERROR(CheckSplitSums(path, m));
    ReadSources(j, &m);
    if (j.contains("created")) {
      m.created_unix_time = j["created"].value("unix_time", int64_t{0});
      m.created_seconds = j["created"].value("seconds", 0.0);
      m.created_threads = j["created"].value("threads", 0);
    }
  } catch (const json::exception& e) {
    return Status::DataLoss(path + ": " + e.what());
  }
  return m;
}

Status WriteFilesTable(const std::string& dir, int64_t generation,
                       const std::vector<FileEntry>& rows, TableRef* ref) {
  std::string out;
  for (const FileEntry& f : rows) {
    json j = {{"path", f.path},
              {"size", f.size},
              {"mtime_ns", f.mtime_ns},
              {"crc32c", Crc32cHex(f.crc32c)},
              {"format", InputFormatName(f.format)},
              {"compression", CompressionName(f.compression)},
              {"val_input", f.val_input},
              {"docs", {f.docs[0], f.docs[1]}},
              {"tokens", {f.tokens[0], f.tokens[1]}},
              {"text_bytes", {f.text_bytes[0], f.text_bytes[1]}},
              {"repaired", f.repaired},
              {"skipped_empty", f.skipped_empty},
              {"units", {f.first_unit, f.last_unit}},
              {"shards", {{"train", {f.first_shard[0], f.last_shard[0]}},
                          {"val", {f.first_shard[1], f.last_shard[1]}}}}};
    // Paths are bytes: a name that is not UTF-8 is stored with U+FFFD (display only).
    out += j.dump(-1, ' ', false, json::error_handler_t::replace);
    out += '\n';
  }
  ref->file = TableName("files", generation, "jsonl");
  ref->rows = static_cast<int64_t>(rows.size());
  ref->crc32c = Crc32c(out);
  return WriteFileAtomic(dir + "/" + ref->file, out);
}

StatusOr<std::vector<FileEntry>> ReadFilesTable(const std::string& dir, const DatasetManifest& m) {
  std::vector<FileEntry> rows;
  if (m.files_table.file.empty()) return rows;
  FORGE_ASSIGN_OR_RETURN(std::string data, ReadTable(dir, m.files_table));
  const std::string path = dir + "/" + m.files_table.file;
  size_t pos = 0;
  int64_t line = 0;
  while (pos < data.size()) {
    ++line;
    size_t eol = data.find('\n', pos);
    if (eol == std::string::npos) eol = data.size();
    json j = json::parse(std::string_view(data).substr(pos, eol - pos), nullptr, false);
    pos = eol + 1;
    const std::string where = path + ":" + std::to_string(line);
    if (j.is_discarded()) return Status::DataLoss(where + ": not valid JSON");
    try {
      FileEntry f;
      f.path = j.at("path").get<std::string>();
      f.size = j.at("size").get<uint64_t>();
      f.mtime_ns = j.at("mtime_ns").get<int64_t>();
      FORGE_ASSIGN_OR_RETURN(f.crc32c, ParseHex32(j.at("crc32c").get<std::string>(), where));
      FORGE_ASSIGN_OR_RETURN(f.format, ParseInputFormat(j.at("format").get<std::string>()));
      const std::string c = j.at("compression").get<std::string>();
      f.compression = c == "gzip" ? Compression::kGzip
                      : c == "zstd" ? Compression::kZstd : Compression::kNone;
      f.val_input = j.at("val_input").get<bool>();
      for (int s = 0; s < 2; ++s) {
        f.docs[s] = j.at("docs").at(s).get<int64_t>();
        f.tokens[s] = j.at("tokens").at(s).get<int64_t>();
        f.text_bytes[s] = j.at("text_bytes").at(s).get<int64_t>();
        const json& sh = j.at("shards").at(SplitName(static_cast<Split>(s)));
        f.first_shard[s] = sh.at(0).get<int64_t>();
        f.last_shard[s] = sh.at(1).get<int64_t>();
      }
      f.repaired = j.at("repaired").get<int64_t>();
      f.skipped_empty = j.at("skipped_empty").get<int64_t>();
      f.first_unit = j.at("units").at(0).get<int64_t>();
      f.last_unit = j.at("units").at(1).get<int64_t>();
      rows.push_back(std::move(f));
    } catch (const json::exception& e) {
      return Status::DataLoss(where + ": " + e.what());
    }
  }
  if (static_cast<int64_t>(rows.size()) != m.files_table.rows) {
    return Status::DataLoss(path + ": " + std::to_string(rows.size()) + " rows, manifest says " +
                            std::to_string(m.files_table.rows));
  }
  return rows;
}

Status WriteUnigramTable(const std::string& dir, int64_t generation,
                         const std::vector<uint64_t> counts[2], TableRef* ref) {
  const uint32_t vocab = static_cast<uint32_t>(counts[0].size());
  std::string out(kUnigramMagic, 8);
  out.append(reinterpret_cast<const char*>(&vocab), 4);
  for (int s = 0; s < 2; ++s) {
    std::vector<uint64_t> c = counts[s];
    c.resize(vocab, 0);
    out.append(reinterpret_cast<const char*>(c.data()), c.size() * 8);
  }
  ref->file = TableName("unigram", generation, "bin");
  ref->rows = vocab;
  ref->crc32c = Crc32c(out);
  return WriteFileAtomic(dir + "/" + ref->file, out);
}

Status ReadUnigramTable(const std::string& dir, const DatasetManifest& m,
                        std::vector<uint64_t> counts[2]) {
  if (m.unigram_table.file.empty()) return Status::NotFound(dir + ": no unigram table");
  FORGE_ASSIGN_OR_RETURN(std::string data, ReadTable(dir, m.unigram_table));
  const std::string path = dir + "/" + m.unigram_table.file;
  uint32_t vocab = 0;
  if (data.size() < 12 || std::memcmp(data.data(), kUnigramMagic, 8) != 0) {
    return Status::DataLoss(path + ": not a unigram table");
  }
  std::memcpy(&vocab, data.data() + 8, 4);
  if (data.size() != 12 + size_t{vocab} * 16) {
    return Status::DataLoss(path + ": size " + std::to_string(data.size()) + " bytes, expected " +
                            std::to_string(12 + size_t{vocab} * 16));
  }
  for (int s = 0; s < 2; ++s) {
    counts[s].resize(vocab);
    std::memcpy(counts[s].data(), data.data() + 12 + size_t{vocab} * 8 * s, size_t{vocab} * 8);
  }
  return Status::Ok();
}

}  // namespace forge
