// A prepared dataset on disk: <dir>/manifest.json + token shards, and its loader.
//
// manifest.json (written last, by temp + fsync + rename: no manifest, no dataset):
//   {"format": "forge-dataset", "version": 1,
//    "tokenizer": "gpt2-bpe", "vocab_size": 50257, "eot_token": 50256, "dtype": "uint16",
//    "options_hash": "0x...",                       // what PrepareDataset was asked to do
//    "splits": {"train": {"tokens": N, "docs": D, "text_bytes": B,
//                         "shards": [{"file": "train_00000.tok", "tokens": n,
//                                     "crc32c": "0x..."}, ...]},
//               "val": {...}},
//    "sources": {"sotu": {"train_docs": .., "val_docs": .., "train_bytes": .., "val_bytes": ..},
//                ...},
//    "created": {"unix_time": t, "seconds": s, "threads": k}}
// Each split is the concatenation of its documents' tokens, each document followed by
// <|endoftext|>; its shards, in order, form one logical token stream.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "common/status.h"
#include "worker/data/corpus.h"
#include "worker/data/shard.h"

namespace forge {

struct ShardEntry {
  std::string file;  // relative to the dataset directory
  int64_t tokens = 0;
  uint32_t crc32c = 0;
};

struct SplitManifest {
  int64_t tokens = 0;
  int64_t docs = 0;
  int64_t text_bytes = 0;
  std::vector<ShardEntry> shards;
};

struct DatasetManifest {
  int version = 1;
  std::string tokenizer = "gpt2-bpe";
  int32_t vocab_size = 0;
  int32_t eot_token = -1;
  TokenDtype dtype = TokenDtype::kUint16;
  std::string options_hash;
  SplitManifest splits[2];                     // by Split
  std::map<std::string, SourceStats> sources;  // by source name
  int64_t created_unix_time = 0;
  double created_seconds = 0;  // how long preparing took
  int created_threads = 0;
};

inline constexpr const char* kManifestFile = "manifest.json";

Status WriteDatasetManifest(const std::string& dir, const DatasetManifest& m);
StatusOr<DatasetManifest> ReadDatasetManifest(const std::string& dir);

// One split as a single stream of tokens over its memory-mapped shards.
class TokenStream {
 public:
  int64_t size() const { return total_; }
  // Copies tokens [start, start + count) into out; InvalidArgument if out of range.
  Status Read(int64_t start, int64_t count, int32_t* out) const;
  uint32_t At(int64_t i) const;  // i must be in [0, size())

 private:
  friend class TokenDataset;
  std::vector<ShardReader> shards_;
  std::vector<int64_t> starts_;  // first token index of each shard
  int64_t total_ = 0;
};

class TokenDataset {
 public:
  // Reads the manifest and maps every shard of both splits. Any disagreement between the
  // manifest and a shard (missing file, token count, checksum, dtype) is an error naming
  // the shard; shard corruption is DataLoss from ShardReader.
  static StatusOr<TokenDataset> Open(const std::string& dir);

  const std::string& dir() const { return dir_; }
  const DatasetManifest& manifest() const { return manifest_; }
  const TokenStream& split(Split s) const { return streams_[static_cast<int>(s)]; }

 private:
  std::string dir_;
  DatasetManifest manifest_;
  TokenStream streams_[2];
};

// The "unigram baseline": what a model that ignores context would score.
struct UnigramBaseline {
  // Cross-entropy (nats/token) of the val tokens under the train unigram distribution with
  // add-one smoothing over the vocabulary (so unseen val tokens have finite cost). This is
  // the loss a trainer should beat early on.
  double val_cross_entropy = 0;
  double train_entropy = 0;  // entropy of the train unigram distribution itself (nats)
  int64_t train_tokens = 0;
  int64_t val_tokens = 0;
};
UnigramBaseline ComputeUnigramBaseline(const TokenDataset& ds);

}  // namespace forge
