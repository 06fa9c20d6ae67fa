// Dataset report, decoded samples and full verification (see inspect.h).
#include "worker/data/inspect.h"

#include <algorithm>
#include <atomic>
#include <cstdarg>
#include <cstdio>
#include <mutex>
#include <thread>
#include <vector>

#include "common/human_format.h"
#include "common/utf8.h"
#include "tokenizer/tokenizer.h"
#include "worker/data/dataset.h"
#include "common/splitmix64.h"

namespace forge {
namespace {

std::string Printf(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
std::string Printf(const char* fmt, ...) {
  char buf[1024];
  va_list ap;
  va_start(ap, fmt);
  std::vsnprintf(buf, sizeof(buf), fmt, ap);
  va_end(ap);
  return buf;
}

// One document around a random position: from the token after the previous end-of-text (or
// the stream's start) up to the next end-of-text, at most `max_tokens`.
StatusOr<std::vector<int32_t>> SampleDocument(const TokenStream& ts, int32_t eot, uint64_t pick,
                                              int max_tokens, int64_t* start_out) {
  const int64_t pos = static_cast<int64_t>(pick % static_cast<uint64_t>(ts.size()));
  // Back to the start of the document holding pos: after the last end-of-text before it
  // (within 64k tokens; a longer document is shown from pos).
  const int64_t lo = std::max<int64_t>(0, pos - 65536);
  std::vector<int32_t> back(static_cast<size_t>(pos - lo));
  FORGE_RETURN_IF_ERROR(ts.Read(lo, pos - lo, back.data()));
  int64_t start = lo == 0 ? 0 : pos;
  for (int64_t k = pos - lo - 1; k >= 0; --k) {
    if (back[static_cast<size_t>(k)] == eot) {
      start = lo + k + 1;
      break;
    }
  }
  const int64_t count = std::min<int64_t>(max_tokens, ts.size() - start);
  std::vector<int32_t> ids(static_cast<size_t>(count));
  FORGE_RETURN_IF_ERROR(ts.Read(start, count, ids.data()));
  const auto end = std::find(ids.begin(), ids.end(), eot);
  if (end != ids.end()) ids.erase(end + 1, ids.end());
  *start_out = start;
  return ids;
}

struct VerifyResult {
  int64_t shards = 0, tokens = 0, eots[2] = {0, 0};
  std::vector<std::string> errors;
};

VerifyResult Verify(const TokenDataset& ds, int threads) {
  VerifyResult out;
  std::mutex mu;
  struct Job {
    Split split;
    int shard;
  };
  std::vector<Job> jobs;
  for (Split s : {Split::kTrain, Split::kVal}) {
    for (int k = 0; k < ds.split(s).num_shards(); ++k) jobs.push_back({s, k});
  }
  const int32_t vocab = ds.manifest().vocab_size, eot = ds.manifest().eot_token;
  std::atomic<size_t> next{0};
  auto work = [&] {
    std::vector<int32_t> buf(size_t{1} << 20);
    for (size_t j = next++; j < jobs.size(); j = next++) {
      const TokenStream& ts = ds.split(jobs[j].split);
      const int k = jobs[j].shard;
      Status st = ts.VerifyShard(k);
      int64_t tokens = 0, eots = 0;
      if (st.ok()) {
        // The shard's range in the stream: sum of the sizes before it is not kept here, so
        // read it through a fresh reader of the same file.
        auto r = ShardReader::Open(ts.shard_path(k), ShardCheck::kHeader);
        if (!r.ok()) st = r.status();
        for (uint64_t start = 0; st.ok() && start < r->size(); start += buf.size()) {
          const uint64_t n = std::min<uint64_t>(buf.size(), r->size() - start);
          r->Copy(start, n, buf.data());
          for (uint64_t i = 0; i < n; ++i) {
            const int32_t t = buf[i];
            if (t < 0 || t >= vocab) {
              st = Status::DataLoss(ts.shard_path(k) + ": token " + std::to_string(t) +
                                    " at index " + std::to_string(start + i) +
                                    " outside the vocabulary of " + std::to_string(vocab));
              break;
            }
            eots += t == eot;
          }
          tokens += static_cast<int64_t>(n);
        }
      }
      std::lock_guard<std::mutex> g(mu);
      ++out.shards;
      out.tokens += tokens;
      out.eots[static_cast<int>(jobs[j].split)] += eots;
      if (!st.ok()) out.errors.push_back(st.ToString());
    }
  };
  std::vector<std::thread> pool;
  for (int t = 1; t < threads; ++t) pool.emplace_back(work);
  work();
  for (std::thread& t : pool) t.join();
  std::sort(out.errors.begin(), out.errors.end());
  return out;
}

}  // namespace

Status InspectDataset(const std::string& dir, const InspectOptions& o,
                      const std::function<void(const std::string&)>& out) {
  FORGE_ASSIGN_OR_RETURN(TokenDataset ds, TokenDataset::Open(dir));
  const DatasetManifest& m = ds.manifest();
  out(Printf("dataset %s (manifest version %d, generation %lld)", dir.c_str(), m.version,
             static_cast<long long>(m.generation)));
  out(Printf("  tokenizer   %s (%s), vocab %d, end-of-text %d, %s; tokens stored as %s",
             m.tokenizer.c_str(),
             m.tokenizer_identity.empty() ? "identity not recorded" : m.tokenizer_identity.c_str(),
             m.vocab_size, m.eot_token,
             m.bos_token >= 0 ? ("begin-of-text " + std::to_string(m.bos_token)).c_str()
                              : "no begin-of-text token",
             TokenDtypeName(m.dtype)));
  if (m.settings.source == "inputs") {
    out(Printf("  prepared    from %lld files (%.1f MB), %lld work units; format %s, text key "
               "\"%s\", val fraction %g, invalid UTF-8 %s, %lld tokens/shard",
               static_cast<long long>(m.files), m.input_bytes / 1e6,
               static_cast<long long>(m.units), m.settings.format.c_str(),
               m.settings.text_key.c_str(), m.settings.val_fraction,
               m.settings.invalid_utf8.c_str(), static_cast<long long>(m.settings.shard_tokens)));
  } else {
    std::string names;
    for (const auto& [name, st] : m.sources) names += (names.empty() ? "" : ", ") + name;
    out("  prepared    from the bundled corpus (" + names + ")");
  }
  for (Split s : {Split::kTrain, Split::kVal}) {
    const SplitManifest& sm = m.splits[static_cast<int>(s)];
    out(Printf("  %-5s       %.3fM tokens, %lld docs, %.1f MB text, %zu shards", SplitName(s),
               sm.tokens / 1e6, static_cast<long long>(sm.docs), sm.text_bytes / 1e6,
               sm.shards.size()));
  }
  if (m.repaired_docs + m.skipped_docs > 0) {
    out(Printf("  documents   %lld repaired (ill-formed UTF-8 replaced), %lld empty skipped",
               static_cast<long long>(m.repaired_docs), static_cast<long long>(m.skipped_docs)));
  }
  FORGE_ASSIGN_OR_RETURN(std::vector<FileEntry> files, ReadFilesTable(dir, m));
  if (!files.empty()) {
    std::vector<const FileEntry*> top;
    for (const FileEntry& f : files) top.push_back(&f);
    const size_t n = std::min<size_t>(5, top.size());
    std::partial_sort(top.begin(), top.begin() + static_cast<long>(n), top.end(),
                      [](const FileEntry* a, const FileEntry* b) {
                        return a->tokens[0] + a->tokens[1] > b->tokens[0] + b->tokens[1];
                      });
    out(Printf("  largest of %zu files (tokens train/val, docs, size):", files.size()));
    for (size_t i = 0; i < n; ++i) {
      const FileEntry& f = *top[i];
      out(Printf("    %s  %lld/%lld tokens, %lld docs, %.1f MB%s", f.path.c_str(),
                 static_cast<long long>(f.tokens[0]), static_cast<long long>(f.tokens[1]),
                 static_cast<long long>(f.docs[0] + f.docs[1]), f.size / 1e6,
                 f.val_input ? " (validation input)" : ""));
    }
  }

  if (o.samples > 0) {
    auto tok = LoadTokenizer(m.tokenizer_spec.empty() ? m.tokenizer : m.tokenizer_spec, o.data_dir);
    std::string why;
    if (!tok.ok()) {
      why = tok.status().ToString();
    } else if (!m.tokenizer_identity.empty() && (*tok)->identity() != m.tokenizer_identity) {
      why = "the tokenizer '" + m.tokenizer_spec + "' is now " + (*tok)->identity() +
            ", not the dataset's " + m.tokenizer_identity;
    }
    if (!why.empty()) out("  (samples shown as ids: " + why + ")");
    uint64_t rng = o.seed;
    for (int i = 0; i <= o.samples; ++i) {
      const Split s = i < o.samples ? Split::kTrain : Split::kVal;
      const TokenStream& ts = ds.split(s);
      if (ts.size() == 0) continue;
      int64_t start = 0;
      FORGE_ASSIGN_OR_RETURN(std::vector<int32_t> ids,
                             SampleDocument(ts, m.eot_token, SplitMix64Next(&rng), o.sample_tokens, &start));
      out(Printf("sample %d: %s tokens [%lld, %lld)%s", i + 1, SplitName(s),
                 static_cast<long long>(start), static_cast<long long>(start + ids.size()),
                 ids.empty() || ids.back() != m.eot_token ? " (cut)" : ""));
      std::string text;
      if (why.empty()) {
        FORGE_ASSIGN_OR_RETURN(std::string bytes, (*tok)->Decode(ids));
        text = SanitizeUtf8(bytes);
      } else {
        for (int32_t id : ids) text += std::to_string(id) + " ";
      }
      size_t pos = 0;
      while (pos <= text.size()) {
        const size_t nl = std::min(text.find('\n', pos), text.size());
        out("  | " + text.substr(pos, nl - pos));
        pos = nl + 1;
      }
    }
  }

  if (o.verify) {
    const int threads =
        o.threads > 0 ? o.threads : std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
    const VerifyResult v = Verify(ds, threads);
    std::vector<std::string> errors = v.errors;
    for (Split s : {Split::kTrain, Split::kVal}) {
      const int64_t docs = m.splits[static_cast<int>(s)].docs;
      if (errors.empty() && v.eots[static_cast<int>(s)] != docs) {
        errors.push_back(Printf("%s split: %lld end-of-text tokens, the manifest counts %lld "
                                "documents", SplitName(s),
                                static_cast<long long>(v.eots[static_cast<int>(s)]),
                                static_cast<long long>(docs)));
      }
    }
    if (errors.empty()) {
      out(Printf("verify: %lld shards, %.3fM tokens: every checksum matches, every id is in the "
                 "vocabulary, one end-of-text per document: OK",
                 static_cast<long long>(v.shards), v.tokens / 1e6));
    } else {
      std::string all;
      for (const std::string& e : errors) {
        out("verify: " + e);
        all += "\n  " + e;
      }
      return Status::DataLoss(dir + ": " + std::to_string(errors.size()) +
                              " problems found:" + all);
    }
  }
  return Status::Ok();
}

}  // namespace forge
