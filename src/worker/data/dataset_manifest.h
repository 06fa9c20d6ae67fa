// A prepared dataset's description on disk: a small manifest.json plus tables that are read
// only when needed, so that a dataset of 10 TB, 100k source files and 100k+ shards opens by
// reading a few megabytes.
//
//   manifest.json     written last (temp + fsync + rename): no manifest, no dataset.
//     {"format": "forge-dataset", "version": 2,
//      "tokenizer": {"name": "gpt2", "identity": "gpt2:crc32c=0x...", "spec": "gpt2",
//                    "vocab_size": 50257, "eot": 50256, "bos": -1},
//      "dtype": "uint16", "options_hash": "0x...", "prepare": {settings, dataset_settings.h},
//      "splits": {"train": {"tokens": N, "docs": D, "text_bytes": B, "shards": K}, "val": ...},
//      "totals": {"files": F, "units": U, "input_bytes": I, "repaired_docs": R,
//                 "skipped_docs": S},
//      "sources": {bundled corpus: per-source docs/bytes},
//      "generation": G,
//      "tables": {"shards":  {"file": "shards-00000G.tsv",    "rows": K, "crc32c": "0x..."},
//                 "files":   {"file": "files-00000G.jsonl",   "rows": F, "crc32c": "0x..."},
//                 "unigram": {"file": "unigram-00000G.bin",   "rows": V, "crc32c": "0x..."}},
//      "created": {"unix_time": t, "seconds": s, "threads": k}}
//   shards-G.tsv      one line per shard, in stream order within each split:
//                     "<split>\t<file>\t<tokens>\t<crc32c>" (after a "# split file tokens
//                     crc32c" header). Read at open: it gives every shard's size, hence where
//                     each shard starts in its split's stream, without touching a shard.
//   files-G.jsonl     one JSON object per source file (path, size, mtime, CRC32C of its
//                     bytes, docs/tokens/text bytes per split, the shards that hold it).
//                     Read by prepare (to add files) and inspect, never by training.
//   unigram-G.bin     token counts per id for each split ("FRGUNIG\0", vocab as uint32, then
//                     train and val counts as uint64): the unigram baseline without reading a
//                     token.
// The tables carry the generation in their names: an incremental prepare writes generation
// G+1 beside G, then the manifest that points at it, then deletes G, so a reader always finds
// the tables its manifest names.
//
// Version 1 manifests (shards listed inline, no tables) are still read; their datasets open
// and train as before (the baseline is then counted from the tokens).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "common/status.h"
#include "worker/data/corpus.h"
#include "worker/data/input_files.h"
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

struct TableRef {
  std::string file;  // "" when absent
  int64_t rows = 0;
  uint32_t crc32c = 0;
};

// How a dataset was prepared: what an incremental prepare must repeat exactly.
struct DatasetSettings {
  std::string source = "inputs";  // "inputs" (forge data prepare --input) or "bundled"
  std::string format = "auto";
  std::string text_key = "text";
  std::string invalid_utf8 = "replace";
  double val_fraction = 0;        // documents held out by hash
  int64_t shard_tokens = 0;
  uint64_t chunk_bytes = 0;
  uint64_t max_doc_bytes = 0;
  // One line that differs whenever any of the above does.
  std::string Fingerprint() const;
};

struct DatasetManifest {
  int version = 2;
  std::string tokenizer = "gpt2";    // name (version 1 datasets: "gpt2-bpe", read as "gpt2")
  std::string tokenizer_identity;    // name + file hash; "" for version 1 datasets
  std::string tokenizer_spec;          // how prepare named it (a name or a path)
  int32_t vocab_size = 0;
  int32_t eot_token = -1;
  int32_t bos_token = -1;
  TokenDtype dtype = TokenDtype::kUint16;
  std::string options_hash;
  DatasetSettings settings;
  SplitManifest splits[2];                     // by Split
  std::map<std::string, SourceStats> sources;  // bundled corpus: by source name
  int64_t files = 0, units = 0, input_bytes = 0, repaired_docs = 0, skipped_docs = 0;
  int64_t generation = 0;
  TableRef files_table, unigram_table;  // the shards table is written from splits[]
  int64_t created_unix_time = 0;
  double created_seconds = 0;  // how long preparing took
  int created_threads = 0;
};

inline constexpr const char* kManifestFile = "manifest.json";

// Writes the shards table of m.generation from m.splits, then manifest.json (atomically).
Status WriteDatasetManifest(const std::string& dir, const DatasetManifest& m);
// Reads manifest.json and the shards table it names (checksummed), or a version 1 manifest.
StatusOr<DatasetManifest> ReadDatasetManifest(const std::string& dir);
// Table file name of a generation: TableName("shards", 3, "tsv") == "shards-000003.tsv".
std::string TableName(const char* kind, int64_t generation, const char* ext);

// One row of the files table.
struct FileEntry {
  std::string path;
  uint64_t size = 0;
  int64_t mtime_ns = 0;
  uint32_t crc32c = 0;  // of the file's bytes as stored
  InputFormat format = InputFormat::kText;
  Compression compression = Compression::kNone;
  bool val_input = false;  // held out whole (--val-input)
  int64_t docs[2] = {0, 0};
  int64_t tokens[2] = {0, 0};
  int64_t text_bytes[2] = {0, 0};
  int64_t repaired = 0;       // documents with ill-formed UTF-8 replaced
  int64_t skipped_empty = 0;  // documents with empty text
  int64_t first_unit = -1, last_unit = -1;
  int64_t first_shard[2] = {-1, -1};  // by Split: indices into that split's shard list
  int64_t last_shard[2] = {-1, -1};
};

// Writes rows as <dir>/files-G.jsonl (atomically) and fills *ref.
Status WriteFilesTable(const std::string& dir, int64_t generation,
                       const std::vector<FileEntry>& rows, TableRef* ref);
// The files table a manifest names (empty when it names none), checksummed.
StatusOr<std::vector<FileEntry>> ReadFilesTable(const std::string& dir, const DatasetManifest& m);

// Unigram counts: counts[s][id] for s in train, val.
Status WriteUnigramTable(const std::string& dir, int64_t generation,
                         const std::vector<uint64_t> counts[2], TableRef* ref);
Status ReadUnigramTable(const std::string& dir, const DatasetManifest& m,
                        std::vector<uint64_t> counts[2]);

}  // namespace forge
