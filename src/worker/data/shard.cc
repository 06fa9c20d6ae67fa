// Token shard writer (atomic replace through common/file_io) and memory-mapped, verified
// reader.
#include "worker/data/shard.h"

#include <cstring>
#include <string_view>
#include <utility>
#include <vector>

#include "common/checksum.h"

namespace forge {
namespace {

template <typename T>
void PutLe(uint8_t* p, T v) {
  std::memcpy(p, &v, sizeof(T));  // x86/ARM hosts are little-endian
}
template <typename T>
T GetLe(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

}  // namespace

const char* TokenDtypeName(TokenDtype dtype) {
  return dtype == TokenDtype::kUint16 ? "uint16" : "uint32";
}

StatusOr<TokenDtype> ParseTokenDtype(const std::string& name) {
  if (name == "uint16") return TokenDtype::kUint16;
  if (name == "uint32") return TokenDtype::kUint32;
  return Status::Invalid("token dtype '" + name + "': expected uint16 or uint32");
}

StatusOr<ShardInfo> WriteShard(const std::string& path, std::span<const int32_t> tokens,
                               TokenDtype dtype) {
  const size_t width = static_cast<size_t>(dtype);
  const int64_t max_token = dtype == TokenDtype::kUint16 ? 0xFFFF : 0x7FFFFFFF;
  // The whole file in one buffer: the header is filled in once the payload's CRC is known.
  std::vector<uint8_t> file(kShardHeaderSize + tokens.size() * width);
  uint8_t* const header = file.data();
  uint8_t* const payload = header + kShardHeaderSize;
  for (size_t i = 0; i < tokens.size(); ++i) {
    const int32_t t = tokens[i];
    if (t < 0 || t > max_token) {
      return Status::Invalid(path + ": token " + std::to_string(t) + " at index " +
                             std::to_string(i) + " does not fit " + TokenDtypeName(dtype));
    }
    if (dtype == TokenDtype::kUint16) {
      PutLe<uint16_t>(&payload[i * 2], static_cast<uint16_t>(t));
    } else {
      PutLe<uint32_t>(&payload[i * 4], static_cast<uint32_t>(t));
    }
  }
  ShardInfo info{tokens.size(), Crc32c(payload, tokens.size() * width)};

  std::memcpy(header, kShardMagic, 8);
  PutLe<uint32_t>(header + 8, kShardVersion);
  PutLe<uint32_t>(header + 12, static_cast<uint32_t>(dtype));
  PutLe<uint64_t>(header + 16, info.tokens);
  PutLe<uint32_t>(header + 24, info.crc32c);
  PutLe<uint32_t>(header + 28, Crc32c(header, 28));

  FORGE_RETURN_IF_ERROR(WriteFileAtomic(
      path, std::string_view(reinterpret_cast<const char*>(file.data()), file.size())));
  return info;
}

StatusOr<ShardReader> ShardReader::Open(const std::string& path) {
  // kNormal: after the checksum pass, training reads windows anywhere in the shard.
  FORGE_ASSIGN_OR_RETURN(MappedFile file, MappedFile::Open(path, MapAdvice::kNormal));
  const size_t file_size = file.size();
  if (file_size < kShardHeaderSize) {
    return Status::DataLoss(path + ": truncated: " + std::to_string(file_size) +
                            " bytes, smaller than the " + std::to_string(kShardHeaderSize) +
                            "-byte header");
  }

  ShardReader r;
  r.path_ = path;
  r.file_ = std::move(file);
  const uint8_t* h = r.file_.data();
  if (std::memcmp(h, kShardMagic, 8) != 0) {
    return Status::DataLoss(path + ": bad magic (not a Forge token shard)");
  }
  if (GetLe<uint32_t>(h + 28) != Crc32c(h, 28)) {
    return Status::DataLoss(path + ": header checksum mismatch (corrupt header)");
  }
  const uint32_t version = GetLe<uint32_t>(h + 8);
  if (version != kShardVersion) {
    return Status::DataLoss(path + ": unsupported shard version " + std::to_string(version) +
                            " (expected " + std::to_string(kShardVersion) + ")");
  }
  const uint32_t width = GetLe<uint32_t>(h + 12);
  if (width != 2 && width != 4) {
    return Status::DataLoss(path + ": bad token width " + std::to_string(width));
  }
  r.dtype_ = static_cast<TokenDtype>(width);
  r.tokens_ = GetLe<uint64_t>(h + 16);
  r.crc_ = GetLe<uint32_t>(h + 24);
  const uint64_t want = kShardHeaderSize + r.tokens_ * width;
  if (want != file_size) {
    return Status::DataLoss(path + ": size " + std::to_string(file_size) + " bytes, expected " +
                            std::to_string(want) + " for " + std::to_string(r.tokens_) +
                            " tokens (" + (file_size < want ? "truncated" : "trailing bytes") +
                            ")");
  }
  const uint32_t actual = Crc32c(r.payload(), r.tokens_ * width);
  if (actual != r.crc_) {
    return Status::DataLoss(path + ": checksum mismatch: payload CRC32C " + Crc32cHex(actual) +
                            ", header says " + Crc32cHex(r.crc_));
  }
  return r;
}

ShardReader::ShardReader(ShardReader&& other) noexcept { *this = std::move(other); }

ShardReader& ShardReader::operator=(ShardReader&& other) noexcept {
  if (this != &other) {
    path_ = std::move(other.path_);
    file_ = std::move(other.file_);
    dtype_ = other.dtype_;
    tokens_ = std::exchange(other.tokens_, 0);
    crc_ = other.crc_;
  }
  return *this;
}

void ShardReader::Copy(uint64_t start, uint64_t count, int32_t* out) const {
  const uint8_t* p = payload();
  if (dtype_ == TokenDtype::kUint16) {
    for (uint64_t i = 0; i < count; ++i) out[i] = GetLe<uint16_t>(p + (start + i) * 2);
  } else {
    for (uint64_t i = 0; i < count; ++i) {
      out[i] = static_cast<int32_t>(GetLe<uint32_t>(p + (start + i) * 4));
    }
  }
}

}  // namespace forge
