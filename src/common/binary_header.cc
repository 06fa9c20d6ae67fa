#include "common/binary_header.h"

#include "common/checksum.h"

namespace forge {

void StartBinaryHeader(uint8_t* header, const BinaryHeaderFormat& f) {
  std::memcpy(header, f.magic, 8);
  PutLe<uint32_t>(header + 8, f.version);
}

void SealBinaryHeader(uint8_t* header, const BinaryHeaderFormat& f) {
  PutLe<uint32_t>(header + f.crc_at, Crc32c(header, f.crc_at));
}

Status CheckBinaryHeader(const std::string& path, const uint8_t* data, size_t size,
                         const BinaryHeaderFormat& f) {
  if (size < f.size) {
    return Status::DataLoss(path + ": truncated: " + std::to_string(size) +
                            " bytes, smaller than the " + std::to_string(f.size) + "-byte header");
  }
  if (std::memcmp(data, f.magic, 8) != 0) {
    return Status::DataLoss(path + ": bad magic (not a Forge " + f.kind + ")");
  }
  if (GetLe<uint32_t>(data + f.crc_at) != Crc32c(data, f.crc_at)) {
    return Status::DataLoss(path + ": header checksum mismatch (corrupt header)");
  }
  const uint32_t version = GetLe<uint32_t>(data + 8);
  if (version != f.version) {
    return Status::DataLoss(path + ": unsupported " + f.kind + " version " +
                            std::to_string(version) + " (expected " + std::to_string(f.version) +
                            ")");
  }
  return Status::Ok();
}

}  // namespace forge
