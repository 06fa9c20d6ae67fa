// Input discovery for `forge data prepare --input ...`: files, directories (walked
// recursively) and glob patterns become one sorted list of input files, each with its size,
// modification time, format and compression.
//
// Formats: text (.txt, .md, .text, .markdown: one document per file) and jsonl (.jsonl,
// .ndjson: one JSON object per line, the document in its text key). Compression by suffix:
// .gz (gzip, zlib) and .zst (zstd), e.g. part-00001.jsonl.zst. With Format::kAuto the format
// comes from the name; a file named explicitly whose name says neither is an error, while a
// directory walk skips such files (and hidden ones: names starting with '.') and counts them.
// With an explicit format every regular file found is read in that format.
//
// Symbolic links to files are followed (dataset caches link to blobs); links to directories
// are not walked into. A file reached twice (two arguments, or a link and its target) is
// listed once, under the first path that reached it. The list is sorted by path, so the
// order of the arguments does not matter.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"

namespace forge {

enum class InputFormat { kAuto, kText, kJsonl };
enum class Compression { kNone, kGzip, kZstd };

const char* InputFormatName(InputFormat f);  // "auto", "text", "jsonl"
StatusOr<InputFormat> ParseInputFormat(const std::string& name);
const char* CompressionName(Compression c);  // "none", "gzip", "zstd"

struct InputFile {
  std::string path;  // absolute, lexically normal (symbolic links not resolved)
  uint64_t size = 0;
  int64_t mtime_ns = 0;
  InputFormat format = InputFormat::kText;  // never kAuto
  Compression compression = Compression::kNone;
  bool val = false;  // held out whole (--val-input)
};

struct InputList {
  std::vector<InputFile> files;  // sorted by path
  int64_t skipped = 0;            // files in walked directories with no known format
  std::vector<std::string> skipped_examples;  // the first few of them
};

// Format and compression from a file name ("a.jsonl.gz" -> jsonl, gzip); format kAuto when
// the name says neither text nor jsonl.
void ClassifyName(const std::string& name, InputFormat* format, Compression* compression);

// Expands `patterns` (files, directories, globs). Each pattern must yield at least one file
// (NotFound naming it otherwise); an unreadable directory or a file that cannot be stat'ed is
// an error naming it. `val` marks every file found.
StatusOr<InputList> DiscoverInputs(const std::vector<std::string>& patterns, InputFormat format,
                                   bool val);

// The stat of one path now, for change detection (size and mtime as DiscoverInputs reports).
Status StatInput(const std::string& path, uint64_t* size, int64_t* mtime_ns);

}  // namespace forge
