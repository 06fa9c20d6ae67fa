// Durable file primitives, the one implementation for checkpoints, dataset shards and
// manifests, and the tuned-plan cache: an fd writer whose Close() fsyncs, atomic file
// replacement (temp + fsync + rename + directory fsync), directory fsync and a read-only
// memory map. Every error names the path.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "common/status.h"

namespace forge {

// Writes a new file at `path` (created or truncated). Close() fsyncs before closing.
class FileWriter {
 public:
  static StatusOr<FileWriter> Create(const std::string& path);

  FileWriter() = default;
  FileWriter(FileWriter&& other) noexcept;
  FileWriter& operator=(FileWriter&& other) noexcept;
  FileWriter(const FileWriter&) = delete;
  FileWriter& operator=(const FileWriter&) = delete;
  ~FileWriter();  // closes without fsync if Close() was not called (error paths)

  Status Write(const void* data, size_t size);
  // Overwrites bytes already written (e.g. a header filled in last); the file position and
  // bytes_written() do not move.
  Status WriteAt(uint64_t offset, const void* data, size_t size);
  Status Close();  // fsync + close
  uint64_t bytes_written() const { return bytes_; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  int fd_ = -1;
  uint64_t bytes_ = 0;
};

// fsync of a directory makes renames and unlinks inside it durable.
Status SyncDirectory(const std::string& dir);

// Writes `data` to `path` atomically: readers see the old file or the whole new one. The
// temporary is `tmp`, or "<path>.tmp" when empty (writers that may race name their own).
Status WriteFileAtomic(const std::string& path, std::string_view data,
                       const std::string& tmp = {});

// Renames tmp -> path and fsyncs the directory holding path.
Status CommitRename(const std::string& tmp, const std::string& path);

StatusOr<std::string> ReadSmallFile(const std::string& path);

// How a mapping will be read: kSequential (one pass; the kernel reads ahead and drops
// pages behind) or kNormal (random access, e.g. training windows; the kernel's default).
enum class MapAdvice { kSequential, kNormal };

// A read-only mapping of a whole file. Move-only.
class MappedFile {
 public:
  static StatusOr<MappedFile> Open(const std::string& path,
                                   MapAdvice advice = MapAdvice::kSequential);

  MappedFile() = default;
  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  ~MappedFile();

  const uint8_t* data() const { return static_cast<const uint8_t*>(map_); }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  void Reset();
  std::string path_;
  void* map_ = nullptr;
  size_t size_ = 0;
};

}  // namespace forge
