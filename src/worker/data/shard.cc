// Token shard writer (atomic replace through common/file_io) and memory-mapped, verified
// reader.
#include "worker/data/shard.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <string_view>
#include <utility>
#include <vector>

#include "common/binary_header.h"
#include "common/checksum.h"
#include "common/named_values.h"

namespace forge {
namespace {

constexpr BinaryHeaderFormat kHeader{"token shard", kShardMagic, kShardVersion, kShardHeaderSize,
                                     28};

void FillHeader(uint8_t* header, TokenDtype dtype, uint64_t tokens, uint32_t payload_crc) {
  std::memset(header, 0, kShardHeaderSize);
  StartBinaryHeader(header, kHeader);
  PutLe<uint32_t>(header + 12, static_cast<uint32_t>(dtype));
  PutLe<uint64_t>(header + 16, tokens);
  PutLe<uint32_t>(header + 24, payload_crc);
  SealBinaryHeader(header, kHeader);
}

constexpr size_t kWriteBuffer = size_t{1} << 20;
constexpr std::array<NamedValue<TokenDtype>, 2> kTokenDtypeNames{
    {{"uint16", TokenDtype::kUint16}, {"uint32", TokenDtype::kUint32}}};

}  // namespace

const char* TokenDtypeName(TokenDtype dtype) { return NameOf(kTokenDtypeNames, dtype); }
StatusOr<TokenDtype> ParseTokenDtype(const std::string& name) {
  return ValueOf(kTokenDtypeNames, name, "token dtype");
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
  FillHeader(header, dtype, info.tokens, info.crc32c);

  FORGE_RETURN_IF_ERROR(WriteFileAtomic(
      path, std::string_view(reinterpret_cast<const char*>(file.data()), file.size())));
  return info;
}


StatusOr<ShardWriter> ShardWriter::Create(const std::string& path, TokenDtype dtype) {
  ShardWriter w;
  w.path_ = path;
  w.dtype_ = dtype;
  FORGE_ASSIGN_OR_RETURN(w.file_, FileWriter::Create(path + ".tmp"));
  w.open_ = true;
  uint8_t placeholder[kShardHeaderSize] = {};
  FORGE_RETURN_IF_ERROR(w.file_.Write(placeholder, sizeof placeholder));
  w.buf_.reserve(kWriteBuffer);
  return w;
}

ShardWriter::ShardWriter(ShardWriter&& other) noexcept { *this = std::move(other); }

ShardWriter& ShardWriter::operator=(ShardWriter&& other) noexcept {
  if (this != &other) {
    if (open_) std::remove((path_ + ".tmp").c_str());
    path_ = std::move(other.path_);
    file_ = std::move(other.file_);
    dtype_ = other.dtype_;
    tokens_ = other.tokens_;
    crc_ = other.crc_;
    buf_ = std::move(other.buf_);
    open_ = std::exchange(other.open_, false);
  }
  return *this;
}

ShardWriter::~ShardWriter() {
  if (open_) {
    file_ = FileWriter();  // closes
    std::remove((path_ + ".tmp").c_str());
  }
}

Status ShardWriter::Append(std::span<const int32_t> tokens) {
  const size_t width = static_cast<size_t>(dtype_);
  const uint32_t max_token = dtype_ == TokenDtype::kUint16 ? 0xFFFFu : 0x7FFFFFFFu;
  size_t i = 0;
  while (i < tokens.size()) {
    const size_t take = std::min((kWriteBuffer - buf_.size()) / width, tokens.size() - i);
    const size_t at = buf_.size();
    buf_.resize(at + take * width);
    uint8_t* out = buf_.data() + at;
    for (size_t k = 0; k < take; ++k) {
      const int32_t t = tokens[i + k];
      if (t < 0 || static_cast<uint32_t>(t) > max_token) {
        return Status::Invalid(path_ + ": token " + std::to_string(t) + " at index " +
                               std::to_string(tokens_ + i + k) + " does not fit " +
                               TokenDtypeName(dtype_));
      }
      if (dtype_ == TokenDtype::kUint16) {
        PutLe<uint16_t>(out + k * 2, static_cast<uint16_t>(t));
      } else {
        PutLe<uint32_t>(out + k * 4, static_cast<uint32_t>(t));
      }
    }
    i += take;
    if (buf_.size() + width > kWriteBuffer) FORGE_RETURN_IF_ERROR(Flush());
  }
  tokens_ += tokens.size();
  return Status::Ok();
}

Status ShardWriter::Flush() {
  crc_ = Crc32cExtend(crc_, buf_.data(), buf_.size());
  FORGE_RETURN_IF_ERROR(file_.Write(buf_.data(), buf_.size()));
  buf_.clear();
  return Status::Ok();
}

StatusOr<ShardInfo> ShardWriter::Finish() {
  if (!open_) return Status::Internal(path_ + ": shard finished twice");
  FORGE_RETURN_IF_ERROR(Flush());
  uint8_t header[kShardHeaderSize];
  FillHeader(header, dtype_, tokens_, crc_);
  FORGE_RETURN_IF_ERROR(file_.WriteAt(0, header, sizeof header));
  FORGE_RETURN_IF_ERROR(file_.Close());
  if (std::rename((path_ + ".tmp").c_str(), path_.c_str()) != 0) {
    return Status::IoError(path_ + ": rename from " + path_ + ".tmp failed");
  }
  open_ = false;
  return ShardInfo{tokens_, crc_};
}

StatusOr<ShardReader> ShardReader::Open(const std::string& path, ShardCheck check) {
  // kNormal: training reads windows anywhere in the shard.
  FORGE_ASSIGN_OR_RETURN(MappedFile file, MappedFile::Open(path, MapAdvice::kNormal));
  const size_t file_size = file.size();
  FORGE_RETURN_IF_ERROR(CheckBinaryHeader(path, file.data(), file_size, kHeader));

  ShardReader r;
  r.path_ = path;
  r.file_ = std::move(file);
  const uint8_t* h = r.file_.data();
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
  if (check == ShardCheck::kPayload) FORGE_RETURN_IF_ERROR(r.VerifyPayload());
  return r;
}

Status ShardReader::VerifyPayload() const {
  const uint32_t actual = Crc32c(payload(), tokens_ * static_cast<uint64_t>(dtype_));
  if (actual != crc_) {
    return Status::DataLoss(path_ + ": checksum mismatch: payload CRC32C " + Crc32cHex(actual) +
                            ", header says " + Crc32cHex(crc_));
  }
  return Status::Ok();
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
