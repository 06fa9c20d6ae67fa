// The journal of an unfinished prepare: <dir>/journal/run.json names the run (settings,
// tokenizer, the dataset it extends) and <dir>/journal/done.jsonl holds one line per finished
// work unit (its key, shards and per-file statistics), appended and fsynced after the unit's
// shards are durable. A killed prepare leaves the journal; the next one with the same
// settings reads it and skips the units recorded there. A torn last line (a kill during the
// append) is ignored: that unit is simply done again. The journal is deleted once the
// manifest is written.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "common/status.h"
#include "worker/data/prepare_pipeline.h"

namespace forge {

struct UnitRecord {
  int64_t id = 0;
  std::string key_hash;             // of PlannedUnit::key
  std::vector<ShardRecord> shards;  // train shards in order, then val shards
  std::vector<UnitFileStats> files;
};

class PrepareJournal {
 public:
  static constexpr const char* kDir = "journal";

  // Opens <dir>/journal for a run named by `fingerprint` (one line of text). An existing
  // journal of another run is FailedPrecondition naming both, unless `discard`, which deletes
  // it first.
  static StatusOr<PrepareJournal> Open(const std::string& dir, const std::string& fingerprint,
                                       bool discard);
  // Whether <dir>/journal exists.
  static bool Exists(const std::string& dir);

  const std::map<int64_t, UnitRecord>& done() const { return done_; }
  Status Append(const UnitRecord& record);
  // Deletes the journal (after the manifest is written).
  Status Remove();

 private:
  std::string dir_;
  std::map<int64_t, UnitRecord> done_;
};

// 16 hex digits: a hash of a unit key.
std::string UnitKeyHash(const std::string& key);

}  // namespace forge
