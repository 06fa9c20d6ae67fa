// Document readers over byte sources: JSON Lines (whole files and line-aligned chunks) and
// text files (whole, or in pieces when large); see documents.h.
#include "worker/data/documents.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <vector>

#include "common/checksum.h"
#include "common/utf8.h"
#include "common/crc32c_combine.h"
#include "common/splitmix64.h"

namespace forge {
namespace {

constexpr size_t kReadBlock = size_t{1} << 20;
constexpr std::string_view kBom = "\xEF\xBB\xBF";

bool IsAsciiSpace(unsigned char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}

// Unicode White_Space outside ASCII: U+0085, U+00A0, U+1680, U+2000..U+200A, U+2028, U+2029,
// U+202F, U+205F, U+3000.
bool IsUnicodeSpace(uint32_t cp) {
  return cp == 0x85 || cp == 0xA0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) ||
         cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

// Whether the character starting at s[pos] is a (valid) non-whitespace character.
bool NonSpaceAt(std::string_view s, size_t pos) {
  if (pos >= s.size()) return false;
  const auto c = static_cast<unsigned char>(s[pos]);
  if (c < 0x80) return !IsAsciiSpace(c);
  const size_t len = Utf8CharLength(s, pos);
  if (len == 0) return false;
  uint32_t cp = c & (0xFF >> (len + 1));
  for (size_t k = 1; k < len; ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[pos + k]) & 0x3F);
  return !IsUnicodeSpace(cp);
}

// Whether the character that ends just before s[end] is a non-whitespace character.
bool NonSpaceBefore(std::string_view s, size_t end) {
  if (end == 0) return false;
  size_t start = end - 1;
  while (start > 0 && end - start < 4 && (static_cast<unsigned char>(s[start]) & 0xC0) == 0x80) {
    --start;
  }
  return Utf8CharLength(s, start) == end - start && NonSpaceAt(s, start);
}

bool IsBlank(std::string_view line) {
  for (char c : line) {
    if (!IsAsciiSpace(static_cast<unsigned char>(c))) return false;
  }
  return true;
}

// Lines of a byte source from a line start at `begin`; lines that start at or after `limit`
// are left alone. Checksums the bytes of the lines it returns (with their newlines).
class LineReader {
 public:
  // `progress` (may be null) counts the bytes of the lines returned.
  LineReader(ByteSource* src, uint64_t begin, uint64_t limit, uint64_t max_line,
             std::atomic<int64_t>* progress)
      : src_(src), offset_(begin), limit_(limit), max_line_(max_line), progress_(progress) {}

  // The next line without its '\n'; *start is its offset. False at the end.
  StatusOr<bool> Next(std::string_view* line, uint64_t* start) {
    if (offset_ >= limit_) return false;
    size_t scan = head_;
    for (;;) {
      const void* nl = std::memchr(buf_.data() + scan, '\n', tail_ - scan);
      if (nl != nullptr) {
        const size_t at = static_cast<size_t>(static_cast<const char*>(nl) - buf_.data());
        return Take(at + 1, at, line, start);
      }
      scan = tail_;
      if (eof_) {
        if (head_ == tail_) return false;
        return Take(tail_, tail_, line, start);  // the last line has no newline
      }
      if (tail_ - head_ > max_line_) {
        return Status::Invalid(src_->path() + ": a line at byte " + std::to_string(offset_) +
                               " is longer than " + std::to_string(max_line_) + " bytes");
      }
      // Make room: move the partial line to the front, grow when it fills the buffer.
      if (head_ > 0) {
        std::memmove(buf_.data(), buf_.data() + head_, tail_ - head_);
        tail_ -= head_;
        scan -= head_;
        head_ = 0;
      }
      if (buf_.size() - tail_ < kReadBlock) buf_.resize(std::max(buf_.size() * 2, tail_ + kReadBlock));
      FORGE_ASSIGN_OR_RETURN(size_t got, src_->Read(buf_.data() + tail_, buf_.size() - tail_));
      if (got == 0) eof_ = true;
      tail_ += got;
    }
  }

  uint64_t offset() const { return offset_; }  // where the next line starts
  uint32_t crc() const { return crc_; }

 private:
  StatusOr<bool> Take(size_t next, size_t line_end, std::string_view* line, uint64_t* start) {
    *line = std::string_view(buf_.data() + head_, line_end - head_);
    *start = offset_;
    crc_ = Crc32cExtend(crc_, buf_.data() + head_, next - head_);
    if (progress_ != nullptr) progress_->fetch_add(static_cast<int64_t>(next - head_));
    offset_ += next - head_;
    head_ = next;
    return true;
  }

  ByteSource* src_;
  uint64_t offset_, limit_, max_line_;
  std::atomic<int64_t>* progress_;
  std::vector<char> buf_ = std::vector<char>(kReadBlock);
  size_t head_ = 0, tail_ = 0;
  bool eof_ = false;
  uint32_t crc_ = 0;
};

Status ChangedWhileRead(const InputFile& f, uint64_t read) {
  return Status::Invalid(f.path + ": changed while being read (" + std::to_string(f.size) +
                         " bytes when listed, " + std::to_string(read) + " read)");
}

class JsonlReader : public DocumentReader {
 public:
  JsonlReader(const InputFile& file, const DocumentOptions& o) : file_(file), o_(o) {}

  Status Open(uint64_t chunk, uint64_t chunk_bytes, std::atomic<int64_t>* progress) {
    uint64_t begin = 0, limit = std::numeric_limits<uint64_t>::max();
    if (file_.compression == Compression::kNone && chunk_bytes > 0) {
      FORGE_ASSIGN_OR_RETURN(begin, FindLineStart(file_.path, chunk * chunk_bytes));
      limit = (chunk + 1) * chunk_bytes;
      last_chunk_ = limit >= file_.size;
    }
    // Progress: a compressed source counts the file bytes it reads; for a plain file the
    // lines count themselves (a chunk's reads run past its end).
    const bool plain = file_.compression == Compression::kNone;
    FORGE_ASSIGN_OR_RETURN(src_, OpenByteSource(file_.path, file_.compression, begin,
                                                plain ? nullptr : progress));
    lines_ = std::make_unique<LineReader>(src_.get(), begin, limit, o_.max_line_bytes,
                                          plain ? progress : nullptr);
    report_.begin = begin;
    known_lines_ = begin == 0;
    return Status::Ok();
  }

  StatusOr<bool> Next(DocPiece* piece) override {
    std::string_view line;
    uint64_t start = 0;
    for (;;) {
      FORGE_ASSIGN_OR_RETURN(bool more, lines_->Next(&line, &start));
      if (!more) {
        FORGE_RETURN_IF_ERROR(Finish());
        return false;
      }
      ++report_.lines;
      if (start == 0 && line.substr(0, kBom.size()) == kBom) line.remove_prefix(kBom.size());
      if (IsBlank(line)) continue;
      JsonTextResult r;
      Status st = ExtractJsonText(line, o_.text_key, o_.invalid_utf8, &piece->text, &r);
      if (!st.ok()) return LineError(start, st.message());
      if (piece->text.empty()) {
        ++report_.skipped_empty;
        continue;
      }
      piece->begins = piece->ends = true;
      piece->repaired = r.repaired;
      piece->doc_hash = HeldOutHash(piece->text);
      return true;
    }
  }

  const ReadReport& report() const override { return report_; }

 private:
  Status LineError(uint64_t start, const std::string& what) {
    int64_t line = report_.lines;
    if (!known_lines_) {
      auto n = LineNumberAt(file_.path, start);
      if (!n.ok()) return Status::Invalid(file_.path + ": line at byte " + std::to_string(start) +
                                          ": " + what);
      line = *n;
    }
    return Status::Invalid(file_.path + ":" + std::to_string(line) + ": " + what);
  }

  Status Finish() {
    if (file_.compression != Compression::kNone) {
      report_.end = src_->file_bytes();
      report_.crc = src_->file_crc();
      if (report_.end != file_.size) return ChangedWhileRead(file_, report_.end);
    } else {
      report_.end = lines_->offset();
      report_.crc = lines_->crc();
      if (last_chunk_ && report_.end != file_.size) return ChangedWhileRead(file_, report_.end);
    }
    return Status::Ok();
  }

  InputFile file_;
  DocumentOptions o_;
  std::unique_ptr<ByteSource> src_;
  std::unique_ptr<LineReader> lines_;
  ReadReport report_;
  bool known_lines_ = true;
  bool last_chunk_ = true;
};

// Cuts a byte stream into pieces at safe points (see documents.h).
class PieceCutter {
 public:
  PieceCutter(ByteSource* src, uint64_t piece_bytes) : src_(src), piece_(piece_bytes) {}

  // The next raw piece (not yet repaired); false at the end.
  StatusOr<bool> Next(std::string* out) {
    for (;;) {
      if (buf_.size() >= piece_ || eof_) {
        const size_t cut = eof_ ? buf_.size() : Cut();
        if (cut > 0) {
          out->assign(buf_, 0, cut);
          buf_.erase(0, cut);
          if (first_ && out->compare(0, kBom.size(), kBom) == 0) {
            out->erase(0, kBom.size());
            bom_ = true;
          }
          first_ = false;
          crc_ = Crc32cExtend(crc_, out->data(), out->size());
          return true;
        }
        if (eof_) return false;
      }
      const size_t at = buf_.size();
      buf_.resize(at + kReadBlock);
      FORGE_ASSIGN_OR_RETURN(size_t got, src_->Read(buf_.data() + at, kReadBlock));
      buf_.resize(at + got);
      bytes_ += got;
      if (got == 0) eof_ = true;
    }
  }
  uint64_t bytes() const { return bytes_; }
  uint32_t crc() const { return crc_; }  // of the raw bytes returned (the BOM excluded)
  bool bom() const { return bom_; }      // a byte order mark was dropped

 private:
  // A cut position in buf_ (>= piece_ bytes in), or 0 to read more first.
  size_t Cut() const {
    const std::string_view s(buf_);
    for (size_t j = s.find('\n', piece_ - 1); j != std::string_view::npos; j = s.find('\n', j + 1)) {
      if (NonSpaceBefore(s, j) && NonSpaceAt(s, j + 1)) return j + 1;
    }
    if (s.size() < 4 * piece_) return 0;
    for (size_t j = s.find(' ', piece_); j != std::string_view::npos; j = s.find(' ', j + 1)) {
      if (NonSpaceBefore(s, j) && NonSpaceAt(s, j + 1)) return j;
    }
    for (size_t j = piece_; j < s.size(); ++j) {
      if (static_cast<unsigned char>(s[j]) < 0x80) return j;
    }
    for (size_t j = piece_; j < s.size(); ++j) {
      if ((static_cast<unsigned char>(s[j]) & 0xC0) != 0x80) return j;
    }
    return s.size();
  }

  ByteSource* src_;
  uint64_t piece_;
  std::string buf_;
  bool eof_ = false, first_ = true, bom_ = false;
  uint64_t bytes_ = 0;
  uint32_t crc_ = 0;
};

class TextReader : public DocumentReader {
 public:
  TextReader(const InputFile& file, const DocumentOptions& o) : file_(file), o_(o) {}

  Status Open(std::atomic<int64_t>* progress) {
    progress_ = progress;
    report_.begin = 0;
    if (file_.compression == Compression::kNone && file_.size > o_.max_doc_bytes) {
      return StartPieces();
    }
    return Status::Ok();
  }

  StatusOr<bool> Next(DocPiece* piece) override {
    if (done_) return false;
    if (cutter_ == nullptr) {
      FORGE_ASSIGN_OR_RETURN(bool whole, ReadWhole(piece));
      if (whole) {
        done_ = true;
        if (piece->text.empty()) {
          report_.skipped_empty = 1;
          return false;
        }
        return true;
      }
      FORGE_RETURN_IF_ERROR(StartPieces());
    }
    std::string raw;
    bool more = false;
    if (have_next_) {
      raw = std::move(next_raw_);
      have_next_ = false;
      more = true;
    } else {
      FORGE_ASSIGN_OR_RETURN(more, cutter_->Next(&raw));
    }
    if (!more) {
      done_ = true;
      FORGE_RETURN_IF_ERROR(FinishPieces());
      if (!any_) report_.skipped_empty = 1;
      return false;
    }
    if (!any_ && cutter_->bom()) offset_ = kBom.size();
    FORGE_RETURN_IF_ERROR(Repair(raw, offset_, &piece->text, &piece->repaired));
    offset_ += raw.size();
    piece->repaired = repaired_;
    piece->doc_hash = doc_hash_;
    piece->begins = !any_;
    any_ = true;
    // The end is known only once the next piece is asked for: look ahead one piece.
    FORGE_ASSIGN_OR_RETURN(more, Peek());
    piece->ends = !more;
    if (!more) {
      done_ = true;
      FORGE_RETURN_IF_ERROR(FinishPieces());
    }
    return true;
  }

  const ReadReport& report() const override { return report_; }

 private:
  // Reads the document whole if it fits max_doc_bytes (true), else returns false.
  StatusOr<bool> ReadWhole(DocPiece* piece) {
    FORGE_ASSIGN_OR_RETURN(auto src, OpenByteSource(file_.path, file_.compression, 0, progress_));
    std::string raw;
    for (;;) {
      const size_t at = raw.size();
      if (at > o_.max_doc_bytes) {  // a large document: read it in pieces
        counted_ = src->file_bytes();
        return false;
      }
      raw.resize(at + kReadBlock);
      FORGE_ASSIGN_OR_RETURN(size_t got, src->Read(raw.data() + at, kReadBlock));
      raw.resize(at + got);
      if (got == 0) break;
    }
    report_.end = src->file_bytes();
    report_.crc = file_.compression == Compression::kNone ? Crc32c(raw) : src->file_crc();
    if (report_.end != file_.size) return ChangedWhileRead(file_, report_.end);
    size_t skip = raw.compare(0, kBom.size(), kBom) == 0 ? kBom.size() : 0;
    FORGE_RETURN_IF_ERROR(Repair(std::string_view(raw).substr(skip), skip, &piece->text,
                                 &piece->repaired));
    piece->begins = piece->ends = true;
    piece->doc_hash = HeldOutHash(piece->text);
    return true;
  }

  // The first pass over a large document: its hash (of the repaired text) and whether any
  // of it was repaired; then the second pass starts.
  Status StartPieces() {
    FORGE_ASSIGN_OR_RETURN(auto src, OpenByteSource(file_.path, file_.compression, 0, nullptr));
    PieceCutter pass(src.get(), o_.piece_bytes);
    uint64_t h = HeldOutHashStart();
    std::string raw, text;
    uint64_t offset = 0;
    bool repaired = false;
    for (;;) {
      FORGE_ASSIGN_OR_RETURN(bool more, pass.Next(&raw));
      if (!more) break;
      bool r = false;
      FORGE_RETURN_IF_ERROR(Repair(raw, offset, &text, &r));
      repaired |= r;
      offset += raw.size();
      h = HeldOutHashExtend(h, text);
    }
    doc_hash_ = HeldOutHashFinish(h);
    repaired_ = repaired;
    report_.end = src->file_bytes();
    if (progress_ != nullptr) progress_->fetch_add(static_cast<int64_t>(report_.end - counted_));
    pass1_crc_ = file_.compression == Compression::kNone ? 0 : src->file_crc();
    if (report_.end != file_.size) return ChangedWhileRead(file_, report_.end);
    // The second pass counts no progress: its bytes were counted by the first.
    FORGE_ASSIGN_OR_RETURN(src2_, OpenByteSource(file_.path, file_.compression, 0, nullptr));
    cutter_ = std::make_unique<PieceCutter>(src2_.get(), o_.piece_bytes);
    offset_ = 0;
    return Status::Ok();
  }

  StatusOr<bool> Peek() {
    if (have_next_) return true;
    FORGE_ASSIGN_OR_RETURN(have_next_, cutter_->Next(&next_raw_));
    return have_next_;
  }

  Status FinishPieces() {
    if (src2_->file_bytes() != file_.size) return ChangedWhileRead(file_, src2_->file_bytes());
    if (file_.compression == Compression::kNone) {
      // The cutter's checksum leaves out a BOM; the file's includes it.
      report_.crc = cutter_->crc();
      if (cutter_->bom()) report_.crc = Crc32cCombine(Crc32c(kBom.data(), kBom.size()), report_.crc,
                                            cutter_->bytes() - kBom.size());
    } else {
      report_.crc = pass1_crc_;
    }
    return Status::Ok();
  }

  // raw -> valid UTF-8 under the policy; `offset` places errors in the file.
  Status Repair(std::string_view raw, uint64_t offset, std::string* text, bool* repaired) {
    const size_t bad = FindInvalidUtf8(raw);
    *repaired = false;
    if (bad == kUtf8Valid) {
      text->assign(raw);
      return Status::Ok();
    }
    if (o_.invalid_utf8 == InvalidUtf8::kReject) {
      return Status::Invalid(file_.path + ": invalid UTF-8 at byte " +
                             std::to_string(offset + bad) + " (--invalid-utf8 reject)");
    }
    *text = SanitizeUtf8(raw);
    *repaired = true;
    return Status::Ok();
  }

  InputFile file_;
  DocumentOptions o_;
  std::atomic<int64_t>* progress_ = nullptr;
  ReadReport report_;
  bool done_ = false, any_ = false, repaired_ = false;
  uint64_t doc_hash_ = 0, offset_ = 0, counted_ = 0;
  uint32_t pass1_crc_ = 0;
  std::unique_ptr<ByteSource> src2_;
  std::unique_ptr<PieceCutter> cutter_;
  std::string next_raw_;
  bool have_next_ = false;
};

}  // namespace

uint64_t HeldOutHashStart() { return uint64_t{0x9e3779b9u} << 32; }

uint64_t HeldOutHashExtend(uint64_t state, std::string_view piece) {
  const uint32_t a = Crc32cExtend(static_cast<uint32_t>(state >> 32), piece.data(), piece.size());
  const uint32_t b = Crc32cExtend(static_cast<uint32_t>(state), piece.data(), piece.size());
  return (uint64_t{a} << 32) | b;
}

// SplitMix64's finalizer spreads the CRCs' linear structure.
uint64_t HeldOutHashFinish(uint64_t state) { return SplitMix64Finish(state); }

uint64_t HeldOutHash(std::string_view text) {
  return HeldOutHashFinish(HeldOutHashExtend(HeldOutHashStart(), text));
}

bool IsHeldOut(uint64_t doc_hash, double fraction) {
  if (fraction <= 0) return false;
  if (fraction >= 1) return true;
  // 53 bits as a double in [0, 1).
  return static_cast<double>(doc_hash >> 11) * 0x1.0p-53 < fraction;
}

StatusOr<std::unique_ptr<DocumentReader>> OpenDocuments(const InputFile& file,
                                                        const DocumentOptions& options,
                                                        uint64_t chunk, uint64_t chunk_bytes,
                                                        std::atomic<int64_t>* progress) {
  if (file.format == InputFormat::kJsonl) {
    auto r = std::make_unique<JsonlReader>(file, options);
    FORGE_RETURN_IF_ERROR(r->Open(chunk, chunk_bytes, progress));
    return std::unique_ptr<DocumentReader>(std::move(r));
  }
  if (file.format == InputFormat::kText) {
    if (chunk != 0) return Status::Internal(file.path + ": text files are not chunked");
    auto r = std::make_unique<TextReader>(file, options);
    FORGE_RETURN_IF_ERROR(r->Open(progress));
    return std::unique_ptr<DocumentReader>(std::move(r));
  }
  return Status::Invalid(file.path + ": unknown format");
}

StatusOr<uint64_t> FindLineStart(const std::string& path, uint64_t offset) {
  if (offset == 0) return uint64_t{0};
  FORGE_ASSIGN_OR_RETURN(auto src, OpenByteSource(path, Compression::kNone, offset - 1));
  std::vector<char> buf(1 << 16);
  uint64_t pos = offset - 1;
  for (;;) {
    FORGE_ASSIGN_OR_RETURN(size_t got, src->Read(buf.data(), buf.size()));
    if (got == 0) return pos;
    const void* nl = std::memchr(buf.data(), '\n', got);
    if (nl != nullptr) return pos + static_cast<uint64_t>(static_cast<const char*>(nl) - buf.data()) + 1;
    pos += got;
  }
}

StatusOr<int64_t> LineNumberAt(const std::string& path, uint64_t offset) {
  FORGE_ASSIGN_OR_RETURN(auto src, OpenByteSource(path, Compression::kNone, 0));
  std::vector<char> buf(1 << 20);
  uint64_t pos = 0;
  int64_t line = 1;
  while (pos < offset) {
    FORGE_ASSIGN_OR_RETURN(size_t got, src->Read(buf.data(), buf.size()));
    if (got == 0) break;
    const size_t n = static_cast<size_t>(std::min<uint64_t>(got, offset - pos));
    line += std::count(buf.data(), buf.data() + n, '\n');
    pos += got;
  }
  return line;
}

}  // namespace forge
