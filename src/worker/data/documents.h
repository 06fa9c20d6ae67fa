// Document splitting: an input file (or a line-aligned chunk of one) -> documents, each as
// valid UTF-8 text ready for a tokenizer.
//
// JSON Lines: one document per line, the text key's string (json_text.h); blank lines are
// skipped. Text: the whole file is one document. A UTF-8 byte order mark at the start of a
// file is dropped. A document whose text is empty is skipped (counted). Errors name the file
// and line ("a.jsonl:17: column 9: expected ':'"); a chunk that starts inside a file counts
// the lines before it only when it has an error to report.
//
// Chunks: a plain (uncompressed) file is cut into chunks of about `chunk_bytes` for parallel
// and resumable work. Chunk k owns the lines that start in [k*C, (k+1)*C): it begins at the
// first line start at or after k*C and reads its last line to that line's end, so every line
// (document) belongs to exactly one chunk, whole, and the chunks' byte ranges tile the file.
//
// Large documents: a text document over `max_doc_bytes` is never held whole. It is read in
// pieces of about `piece_bytes`, cut after a newline that has a non-space character on both
// sides: every supported pre-tokenizer (GPT-2, tiktoken, Llama 3) ends a pre-token there, so
// encoding the pieces gives the ids of encoding the whole. (Text without such a newline for
// 4 pieces' length is cut before a space between two non-space characters, else before an
// ASCII byte, else at a character boundary; only the last can change ids at the cut.) Such a
// document is read twice: once to hash it for the validation split, once to emit its pieces.
// UTF-8 repair is the same piece by piece as whole: cuts fall before ASCII bytes or character
// boundaries, where no ill-formed subpart continues.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "common/status.h"
#include "worker/data/byte_source.h"
#include "worker/data/input_files.h"
#include "worker/data/json_text.h"

namespace forge {

struct DocumentOptions {
  std::string text_key = "text";
  InvalidUtf8 invalid_utf8 = InvalidUtf8::kReplace;
  uint64_t max_doc_bytes = uint64_t{64} << 20;  // larger text documents are read in pieces
  uint64_t piece_bytes = uint64_t{8} << 20;
  uint64_t max_line_bytes = uint64_t{1} << 30;   // a JSONL line longer than this is an error
};

// One document, or one piece of a large one.
struct DocPiece {
  std::string text;     // valid UTF-8
  bool begins = true;   // the document's first piece (takes the BOS token)
  bool ends = true;     // its last piece (takes the end-of-text token; the document counts here)
  uint64_t doc_hash = 0;  // of the whole document's text (HeldOutHash input), on every piece
  bool repaired = false;  // ill-formed UTF-8 was replaced in this document
};

// What a reader saw of its file or chunk once it has returned its last piece.
struct ReadReport {
  uint64_t begin = 0, end = 0;  // the byte range of the file it covered
  uint32_t crc = 0;             // CRC32C of those bytes (compressed files: as stored)
  int64_t skipped_empty = 0;    // documents with empty text
  int64_t lines = 0;            // JSONL lines read (blank ones too)
};

class DocumentReader {
 public:
  virtual ~DocumentReader() = default;
  // The next document or piece; false at the end.
  virtual StatusOr<bool> Next(DocPiece* piece) = 0;
  virtual const ReadReport& report() const = 0;
};

// A reader over `file`: the whole file, or for a plain file its chunk `chunk` of
// `chunk_bytes` (chunk_bytes 0: the whole file). Bytes taken from the file are added to
// `progress` as they are read.
StatusOr<std::unique_ptr<DocumentReader>> OpenDocuments(const InputFile& file,
                                                        const DocumentOptions& options,
                                                        uint64_t chunk, uint64_t chunk_bytes,
                                                        std::atomic<int64_t>* progress);

// The hash that decides held-out documents: 64 bits of the document's (valid UTF-8) text.
uint64_t HeldOutHash(std::string_view text);
// Extends a hash over a text given in pieces: HeldOutHashFinish(Extend(Extend(Start(), a), b))
// == HeldOutHash(a + b).
uint64_t HeldOutHashStart();
uint64_t HeldOutHashExtend(uint64_t state, std::string_view piece);
uint64_t HeldOutHashFinish(uint64_t state);
// True when a document with this hash is held out for validation at `fraction` (0..1): the
// top bits of the hash read as a number in [0, 1) below `fraction`. Identical texts always
// land in the same split.
bool IsHeldOut(uint64_t doc_hash, double fraction);

// The first line start at or after `offset` in a plain file (0 for offset 0; the file size
// when no line starts there).
StatusOr<uint64_t> FindLineStart(const std::string& path, uint64_t offset);
// 1-based line number of the line that starts at byte `offset` (counts newlines before it).
StatusOr<int64_t> LineNumberAt(const std::string& path, uint64_t offset);

}  // namespace forge
