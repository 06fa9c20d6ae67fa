// A prepared dataset on disk (dataset_manifest.h) and its loader.
//
// Each split is the concatenation of its documents' tokens ([BOS] ids... EOT per document);
// its shards, in table order, form one logical token stream.
//
// Opening reads manifest.json and the shards table only: no shard is opened, mapped or
// checksummed, so start-up costs the same for 10 MB and 10 TB. A shard is opened on first
// access (TokenStream::Read), mapped, and its header checked: magic, version, dtype, header
// checksum, file size against the token count, and the header's payload CRC against the
// table's. A rank therefore maps only the shards it reads. The payload checksum (every byte)
// is not recomputed there: `forge data inspect --verify` does that for a whole dataset, and
// VerifyShards here.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common/status.h"
#include "worker/data/corpus.h"
#include "worker/data/dataset_manifest.h"
#include "worker/data/shard.h"

namespace forge {

// One split as a single stream of tokens over its shards, each mapped on first use.
// Thread-safe: concurrent readers share one mapping per shard.
class TokenStream {
 public:
  TokenStream() = default;
  TokenStream(TokenStream&&) noexcept = default;
  TokenStream& operator=(TokenStream&&) noexcept = default;

  int64_t size() const { return total_; }
  // Copies tokens [start, start + count) into out; InvalidArgument if out of range, DataLoss
  // naming the shard when one it needs fails its check.
  Status Read(int64_t start, int64_t count, int32_t* out) const;
  // Token i (in [0, size())), for tests and tools: a shard that fails its check is fatal here
  // (the message names it); training reads through Read.
  uint32_t At(int64_t i) const;

  int num_shards() const { return static_cast<int>(shards_.size()); }
  // How many shards have been opened so far.
  int opened_shards() const;
  // Opens shard k now (if not yet) and checks its payload checksum too.
  Status VerifyShard(int k) const;
  const std::string& shard_path(int k) const { return shards_[static_cast<size_t>(k)]->path; }

 private:
  friend class TokenDataset;
  struct Slot {
    std::string path;
    int64_t tokens = 0;
    uint32_t crc32c = 0;
    TokenDtype dtype = TokenDtype::kUint16;
    std::once_flag once;
    std::atomic<bool> opened{false};
    Status status;
    ShardReader reader;
  };
  // The slot's reader, opened and header-checked on first use.
  StatusOr<const ShardReader*> Get(size_t k) const;
  size_t ShardOf(int64_t i) const;

  std::vector<std::unique_ptr<Slot>> shards_;
  std::vector<int64_t> starts_;  // first token index of each shard
  int64_t total_ = 0;
};

class TokenDataset {
 public:
  // Reads the manifest and the shards table (see above): no shard is touched.
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
// From the dataset's unigram table when it has one (no token is read), else by counting
// every token (datasets written before the table existed).
UnigramBaseline ComputeUnigramBaseline(const TokenDataset& ds);
// The same from counts by id for each split.
UnigramBaseline UnigramBaselineFromCounts(const std::vector<uint64_t>& train,
                                          const std::vector<uint64_t>& val);

}  // namespace forge
