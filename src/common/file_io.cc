#include "common/file_io.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <utility>

namespace forge {
namespace {

std::string Errno() { return std::strerror(errno); }

std::string ParentDir(const std::string& path) {
  const std::string dir = std::filesystem::path(path).parent_path().string();
  return dir.empty() ? "." : dir;
}

}  // namespace

StatusOr<FileWriter> FileWriter::Create(const std::string& path) {
  FileWriter w;
  w.fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (w.fd_ < 0) return Status::IoError(path + ": cannot create: " + Errno());
  w.path_ = path;
  return w;
}

FileWriter::FileWriter(FileWriter&& other) noexcept { *this = std::move(other); }

FileWriter& FileWriter::operator=(FileWriter&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    path_ = std::move(other.path_);
    fd_ = std::exchange(other.fd_, -1);
    bytes_ = other.bytes_;
  }
  return *this;
}

FileWriter::~FileWriter() {
  if (fd_ >= 0) ::close(fd_);
}

Status FileWriter::Write(const void* data, size_t size) {
  if (fd_ < 0) return Status::Internal(path_ + ": write after close");
  const auto* p = static_cast<const uint8_t*>(data);
  while (size > 0) {
    // Linux writes at most ~2 GiB per call; ask for 1 GiB at a time.
    const size_t chunk = std::min<size_t>(size, size_t{1} << 30);
    const ssize_t n = ::write(fd_, p, chunk);
    if (n < 0) {
      if (errno == EINTR) continue;
      return Status::IoError(path_ + ": write failed: " + Errno());
    }
    p += n;
    size -= static_cast<size_t>(n);
    bytes_ += static_cast<uint64_t>(n);
  }
  return Status::Ok();
}

Status FileWriter::WriteAt(uint64_t offset, const void* data, size_t size) {
  if (fd_ < 0) return Status::Internal(path_ + ": write after close");
  const auto* p = static_cast<const uint8_t*>(data);
  while (size > 0) {
    const ssize_t n = ::pwrite(fd_, p, std::min<size_t>(size, size_t{1} << 30),
                               static_cast<off_t>(offset));
    if (n < 0) {
      if (errno == EINTR) continue;
      return Status::IoError(path_ + ": write failed: " + Errno());
    }
    p += n;
    offset += static_cast<uint64_t>(n);
    size -= static_cast<size_t>(n);
  }
  return Status::Ok();
}

Status FileWriter::Close() {
  if (fd_ < 0) return Status::Internal(path_ + ": closed twice");
  Status st;
  if (::fsync(fd_) != 0) st = Status::IoError(path_ + ": fsync failed: " + Errno());
  if (::close(fd_) != 0 && st.ok()) st = Status::IoError(path_ + ": close failed: " + Errno());
  fd_ = -1;
  return st;
}

Status SyncDirectory(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return Status::IoError(dir + ": cannot open directory: " + Errno());
  Status st;
  if (::fsync(fd) != 0) st = Status::IoError(dir + ": directory fsync failed: " + Errno());
  ::close(fd);
  return st;
}

Status CommitRename(const std::string& tmp, const std::string& path) {
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    return Status::IoError(path + ": rename from " + tmp + " failed: " + Errno());
  }
  return SyncDirectory(ParentDir(path));
}

Status WriteFileAtomic(const std::string& path, std::string_view data,
                       const std::string& tmp_name) {
  const std::string tmp = tmp_name.empty() ? path + ".tmp" : tmp_name;
  FORGE_ASSIGN_OR_RETURN(FileWriter w, FileWriter::Create(tmp));
  Status st = w.Write(data.data(), data.size());
  if (st.ok()) st = w.Close();
  if (st.ok()) st = CommitRename(tmp, path);
  if (!st.ok()) ::unlink(tmp.c_str());
  return st;
}

StatusOr<std::string> ReadSmallFile(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return Status::NotFound(path + ": no such file");
    return Status::IoError(path + ": cannot open: " + Errno());
  }
  std::string out;
  char buf[65536];
  for (;;) {
    const ssize_t n = ::read(fd, buf, sizeof(buf));
    if (n < 0) {
      if (errno == EINTR) continue;
      const Status st = Status::IoError(path + ": read failed: " + Errno());
      ::close(fd);
      return st;
    }
    if (n == 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  return out;
}

StatusOr<MappedFile> MappedFile::Open(const std::string& path, MapAdvice advice) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return Status::NotFound(path + ": no such file");
    return Status::IoError(path + ": cannot open: " + Errno());
  }
  struct stat sb;
  if (::fstat(fd, &sb) != 0) {
    const Status st = Status::IoError(path + ": stat failed: " + Errno());
    ::close(fd);
    return st;
  }
  MappedFile f;
  f.path_ = path;
  f.size_ = static_cast<size_t>(sb.st_size);
  if (f.size_ > 0) {
    void* map = ::mmap(nullptr, f.size_, PROT_READ, MAP_SHARED, fd, 0);
    if (map == MAP_FAILED) {
      const Status st = Status::IoError(path + ": mmap failed: " + Errno());
      ::close(fd);
      return st;
    }
    f.map_ = map;
    if (advice == MapAdvice::kSequential) ::madvise(map, f.size_, MADV_SEQUENTIAL);
  }
  ::close(fd);  // the mapping keeps the file alive
  return f;
}

MappedFile::MappedFile(MappedFile&& other) noexcept { *this = std::move(other); }

MappedFile& MappedFile::operator=(MappedFile&& other) noexcept {
  if (this != &other) {
    Reset();
    path_ = std::move(other.path_);
    map_ = std::exchange(other.map_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

MappedFile::~MappedFile() { Reset(); }

void MappedFile::Reset() {
  if (map_ != nullptr) ::munmap(map_, size_);
  map_ = nullptr;
  size_ = 0;
}

}  // namespace forge
