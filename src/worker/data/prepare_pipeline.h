// The tokenize/write pipeline of `forge data prepare`: work units (a group of files, a chunk
// of a large file, or the bundled corpus) -> token shards, on a pool of threads.
//
// Each unit is read by one thread, in order, into batches of about 1 MiB of documents; any
// thread tokenizes a batch (with its own Tokenizer clone); the unit's thread writes its
// batches back in order. So a unit's output depends only on its input, not on the thread
// count or timing, and one large compressed stream still keeps every core busy. A thread
// waiting for its unit's next batch tokenizes queued batches meanwhile; idle threads start
// the next unit. At most 2 batches per thread (+1) are in flight over all units: memory is
// bounded by the batch size, the thread count and the largest document, never by the input.
//
// Each document becomes [BOS] ids... EOT in its split's shards (BOS where the tokenizer has
// one). A unit writes its own shards, "<split>-<unit:06d>-<k:04d>.tok", each of at most
// shard_tokens tokens (its last one shorter), and counts its tokens per id (unigram counts).
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "tokenizer/tokenizer.h"
#include "worker/data/corpus.h"
#include "worker/data/documents.h"
#include "worker/data/shard.h"

namespace forge {

// A document (or piece) bound for a split, from file `file` of its unit.
struct UnitItem {
  DocPiece piece;
  Split split = Split::kTrain;
  int file = 0;
  int64_t text_bytes = 0;  // piece.text.size(), kept once the text is freed
};

class UnitSource {
 public:
  virtual ~UnitSource() = default;
  virtual StatusOr<bool> Next(UnitItem* item) = 0;
  // One report per file of the unit, complete once Next has returned false.
  virtual std::vector<ReadReport> Reports() const = 0;
};

struct ShardRecord {
  Split split = Split::kTrain;
  std::string file;
  int64_t tokens = 0;
  uint32_t crc32c = 0;
};

// What a unit did with one of its files.
struct UnitFileStats {
  ReadReport read;
  int64_t docs[2] = {0, 0};        // by Split
  int64_t tokens[2] = {0, 0};
  int64_t text_bytes[2] = {0, 0};
  int64_t repaired = 0;            // documents with ill-formed UTF-8 replaced
  int first_shard[2] = {-1, -1};   // by Split: index into the unit's shards of that split
  int last_shard[2] = {-1, -1};
};

struct UnitResult {
  int64_t index = 0;                   // position in the run's unit list
  std::vector<ShardRecord> shards;     // train shards in order, then val shards in order
  std::vector<UnitFileStats> files;    // per file of the unit
  std::array<std::vector<uint64_t>, 2> counts;  // unigram counts by Split (vocab_size each)
};

struct PipelineOptions {
  std::string dir;                    // where shards go
  int threads = 1;
  const Tokenizer* tokenizer = nullptr;  // cloned per thread
  TokenDtype dtype = TokenDtype::kUint16;
  int64_t shard_tokens = 10'000'000;
  size_t batch_bytes = size_t{1} << 20;
};

struct PipelineProgress {
  std::atomic<int64_t> bytes{0};   // input bytes read (sources add to it)
  std::atomic<int64_t> docs{0};
  std::atomic<int64_t> tokens{0};
  std::atomic<int64_t> units{0};   // finished
  std::atomic<int64_t> repaired{0};
};

// Shard file name of a unit's k-th shard of a split.
std::string UnitShardName(Split split, int64_t unit_id, int k);

// Runs units [0, n) (unit_ids[i] names unit i's shards). `open(i)` makes unit i's source;
// `done` receives each finished unit (one call at a time, in completion order) after its
// shards are durable. The first error stops the run and is returned; a unit that did not
// finish may leave whole shard files behind, never a half-written one under its final name.
Status RunPipeline(const PipelineOptions& options, const std::vector<int64_t>& unit_ids,
                   const std::function<StatusOr<std::unique_ptr<UnitSource>>(int64_t)>& open,
                   const std::function<Status(UnitResult&&)>& done, PipelineProgress* progress);

}  // namespace forge
