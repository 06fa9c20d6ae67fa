// Readers of input files as byte streams: plain files (whole, or from an offset), gzip
// (zlib; concatenated members too) and zstd (libzstd; concatenated frames too). Files are
// read with read(2) in 1 MiB blocks, never mapped or loaded whole, so memory stays bounded
// whatever the file size and the page cache, not this process, holds what was read.
//
// Every source counts the bytes it took from the file (compressed bytes for .gz/.zst) for
// progress; compressed sources also checksum them (CRC32C of the file as stored), since only
// they read every byte of their file. Errors name the file and, for corrupt compressed data,
// the compressed offset.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "common/status.h"
#include "worker/data/input_files.h"

namespace forge {

class ByteSource {
 public:
  virtual ~ByteSource() = default;
  // Up to `n` bytes of the (decompressed) stream; 0 only at its end.
  virtual StatusOr<size_t> Read(char* buf, size_t n) = 0;
  // Bytes taken from the file so far, and their CRC32C (compressed sources: the whole file's
  // once Read has returned 0; plain sources leave the checksum to their reader).
  uint64_t file_bytes() const { return file_bytes_; }
  uint32_t file_crc() const { return file_crc_; }
  const std::string& path() const { return path_; }

 protected:
  explicit ByteSource(std::string path) : path_(std::move(path)) {}
  std::string path_;
  uint64_t file_bytes_ = 0;
  uint32_t file_crc_ = 0;
};

// Opens `path`. Plain files start at `offset` (compressed ones must start at 0). When
// `progress` is given, every byte taken from the file is added to it as it is read.
StatusOr<std::unique_ptr<ByteSource>> OpenByteSource(const std::string& path,
                                                     Compression compression,
                                                     uint64_t offset = 0,
                                                     std::atomic<int64_t>* progress = nullptr);

}  // namespace forge
