// Token shard files: a fixed 64-byte little-endian header followed by the tokens.
//
//   offset size field
//        0    8 magic "FRGTOKS\0"
//        8    4 version (1)
//       12    4 bytes per token: 2 (uint16) or 4 (uint32)
//       16    8 token count N
//       24    4 CRC32C of the payload (the N * bytes-per-token bytes after the header)
//       28    4 CRC32C of header bytes [0, 28)
//       32   32 zero
//       64      payload
//
// Writers write to "<path>.tmp", fsync, then rename: a shard either exists whole or not at
// all. Readers mmap the file and check magic, version, dtype and size against N (truncation)
// and the header checksum before handing out a single token; the payload checksum is checked
// when asked for (ShardCheck::kPayload, VerifyPayload), since that reads every byte. Every
// failure is DataLoss naming the file.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "common/file_io.h"
#include "common/status.h"

namespace forge {

enum class TokenDtype : uint32_t { kUint16 = 2, kUint32 = 4 };

inline constexpr char kShardMagic[8] = {'F', 'R', 'G', 'T', 'O', 'K', 'S', '\0'};
inline constexpr uint32_t kShardVersion = 1;
inline constexpr size_t kShardHeaderSize = 64;

const char* TokenDtypeName(TokenDtype dtype);  // "uint16" / "uint32"
StatusOr<TokenDtype> ParseTokenDtype(const std::string& name);

struct ShardInfo {
  uint64_t tokens = 0;
  uint32_t crc32c = 0;  // of the payload
};

// Writes `tokens` as a shard of `dtype` (every token must fit: InvalidArgument otherwise).
StatusOr<ShardInfo> WriteShard(const std::string& path, std::span<const int32_t> tokens,
                               TokenDtype dtype);

// Writes a shard as tokens arrive, in bounded memory: the payload streams to "<path>.tmp"
// behind a placeholder header, Finish() writes the real header, fsyncs and renames.
// Abandoning a writer (destruction without Finish) removes the temporary.
class ShardWriter {
 public:
  static StatusOr<ShardWriter> Create(const std::string& path, TokenDtype dtype);

  ShardWriter() = default;
  ShardWriter(ShardWriter&&) noexcept;
  ShardWriter& operator=(ShardWriter&&) noexcept;
  ~ShardWriter();

  // Every token must fit the dtype (InvalidArgument naming the file otherwise).
  Status Append(std::span<const int32_t> tokens);
  uint64_t tokens() const { return tokens_; }
  // Header, fsync, rename; the directory is not fsynced (the caller syncs it once for many).
  StatusOr<ShardInfo> Finish();

 private:
  Status Flush();
  std::string path_;
  FileWriter file_;
  TokenDtype dtype_ = TokenDtype::kUint16;
  uint64_t tokens_ = 0;
  uint32_t crc_ = 0;
  std::vector<uint8_t> buf_;
  bool open_ = false;
};

enum class ShardCheck {
  kHeader,   // magic, version, dtype, header checksum, file size: reads one page
  kPayload,  // and the payload checksum: reads every byte
};

// A read-only memory-mapped shard. Move-only; unmaps on destruction.
class ShardReader {
 public:
  static StatusOr<ShardReader> Open(const std::string& path,
                                    ShardCheck check = ShardCheck::kPayload);
  // The payload's CRC32C against the header's (DataLoss naming the file on a mismatch).
  Status VerifyPayload() const;

  ShardReader() = default;
  ShardReader(ShardReader&& other) noexcept;
  ShardReader& operator=(ShardReader&& other) noexcept;
  ShardReader(const ShardReader&) = delete;
  ShardReader& operator=(const ShardReader&) = delete;
  ~ShardReader() = default;

  const std::string& path() const { return path_; }
  TokenDtype dtype() const { return dtype_; }
  uint64_t size() const { return tokens_; }
  uint32_t crc32c() const { return crc_; }

  uint32_t operator[](uint64_t i) const {
    const uint8_t* p = payload();
    if (dtype_ == TokenDtype::kUint16) return reinterpret_cast<const uint16_t*>(p)[i];
    return reinterpret_cast<const uint32_t*>(p)[i];
  }
  // Copies tokens [start, start + count) (caller guarantees the range is inside).
  void Copy(uint64_t start, uint64_t count, int32_t* out) const;

 private:
  const uint8_t* payload() const { return file_.data() + kShardHeaderSize; }

  std::string path_;
  MappedFile file_;
  TokenDtype dtype_ = TokenDtype::kUint16;
  uint64_t tokens_ = 0;
  uint32_t crc_ = 0;
};

}  // namespace forge
