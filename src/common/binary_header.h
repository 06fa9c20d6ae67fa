// Forge's binary files (token shards, checkpoint shards) store little-endian fields and begin
// with a header of one form: an 8-byte magic, a uint32 format version at byte 8, and the
// CRC32C of the bytes before `crc_at` stored at `crc_at`. CheckBinaryHeader checks that form,
// so a damaged or foreign file is named the same way whichever reader meets it.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

#include "common/status.h"

namespace forge {

static_assert(std::endian::native == std::endian::little, "Forge's binary files are little-endian");

template <typename T>
void PutLe(uint8_t* p, T v) {
  std::memcpy(p, &v, sizeof(T));
}
template <typename T>
T GetLe(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

struct BinaryHeaderFormat {
  const char* kind;   // what the file is, for errors: "token shard"
  const char* magic;  // 8 bytes
  uint32_t version;
  size_t size;    // bytes of the header
  size_t crc_at;  // where the CRC32C of the header's bytes before it is stored
};

// Fills the magic and version of an all-zero header; SealBinaryHeader stores its CRC once the
// other fields are in.
void StartBinaryHeader(uint8_t* header, const BinaryHeaderFormat& f);
void SealBinaryHeader(uint8_t* header, const BinaryHeaderFormat& f);

// DataLoss naming `path` unless the file's `size` bytes at `data` hold a whole header of form
// `f`: "truncated", "bad magic (not a Forge token shard)", "header checksum mismatch",
// "unsupported token shard version 2 (expected 1)".
Status CheckBinaryHeader(const std::string& path, const uint8_t* data, size_t size,
                         const BinaryHeaderFormat& f);

}  // namespace forge
