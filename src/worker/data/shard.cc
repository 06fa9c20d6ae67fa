// Token shard writer (temp + fsync + rename) and memory-mapped, verified reader.
#include "worker/data/shard.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
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

std::string Errno() { return std::strerror(errno); }

Status WriteAll(int fd, const void* data, size_t size, const std::string& path) {
  const auto* p = static_cast<const uint8_t*>(data);
  while (size > 0) {
    const ssize_t n = ::write(fd, p, size);
    if (n < 0) {
      if (errno == EINTR) continue;
      return Status::IoError(path + ": write failed: " + Errno());
    }
    p += n;
    size -= static_cast<size_t>(n);
  }
  return Status::Ok();
}

// fsync of the directory makes the rename itself durable.
void SyncDir(const std::string& file_path) {
  const std::string dir = std::filesystem::path(file_path).parent_path().string();
  const int fd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY);
  if (fd >= 0) {
    ::fsync(fd);
    ::close(fd);
  }
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
  std::vector<uint8_t> payload(tokens.size() * width);
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
  ShardInfo info{tokens.size(), Crc32c(payload.data(), payload.size())};

  uint8_t header[kShardHeaderSize] = {};
  std::memcpy(header, kShardMagic, 8);
  PutLe<uint32_t>(header + 8, kShardVersion);
  PutLe<uint32_t>(header + 12, static_cast<uint32_t>(dtype));
  PutLe<uint64_t>(header + 16, info.tokens);
  PutLe<uint32_t>(header + 24, info.crc32c);
  PutLe<uint32_t>(header + 28, Crc32c(header, 28));

  const std::string tmp = path + ".tmp";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return Status::IoError(tmp + ": cannot create: " + Errno());
  Status st = WriteAll(fd, header, sizeof(header), tmp);
  if (st.ok()) st = WriteAll(fd, payload.data(), payload.size(), tmp);
  if (st.ok() && ::fsync(fd) != 0) st = Status::IoError(tmp + ": fsync failed: " + Errno());
  if (::close(fd) != 0 && st.ok()) st = Status::IoError(tmp + ": close failed: " + Errno());
  if (st.ok() && ::rename(tmp.c_str(), path.c_str()) != 0) {
    st = Status::IoError(path + ": rename from " + tmp + " failed: " + Errno());
  }
  if (!st.ok()) {
    ::unlink(tmp.c_str());
    return st;
  }
  SyncDir(path);
  return info;
}

StatusOr<ShardReader> ShardReader::Open(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return Status::NotFound(path + ": no such shard file");
    return Status::IoError(path + ": cannot open: " + Errno());
  }
  struct stat sb;
  if (::fstat(fd, &sb) != 0) {
    ::close(fd);
    return Status::IoError(path + ": stat failed: " + Errno());
  }
  const size_t file_size = static_cast<size_t>(sb.st_size);
  if (file_size < kShardHeaderSize) {
    ::close(fd);
    return Status::DataLoss(path + ": truncated: " + std::to_string(file_size) +
                            " bytes, smaller than the " + std::to_string(kShardHeaderSize) +
                            "-byte header");
  }
  void* map = ::mmap(nullptr, file_size, PROT_READ, MAP_SHARED, fd, 0);
  ::close(fd);  // the mapping keeps the file alive
  if (map == MAP_FAILED) return Status::IoError(path + ": mmap failed: " + Errno());

  ShardReader r;
  r.path_ = path;
  r.map_ = map;
  r.map_size_ = file_size;
  const auto* h = static_cast<const uint8_t*>(map);
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
    Reset();
    path_ = std::move(other.path_);
    map_ = std::exchange(other.map_, nullptr);
    map_size_ = std::exchange(other.map_size_, 0);
    dtype_ = other.dtype_;
    tokens_ = std::exchange(other.tokens_, 0);
    crc_ = other.crc_;
  }
  return *this;
}

ShardReader::~ShardReader() { Reset(); }

void ShardReader::Reset() {
  if (map_ != nullptr) ::munmap(map_, map_size_);
  map_ = nullptr;
  map_size_ = 0;
  tokens_ = 0;
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
