// Plain, gzip and zstd byte sources over read(2) (see byte_source.h).
#include "worker/data/byte_source.h"

#include <fcntl.h>
#include <unistd.h>
#include <zlib.h>
#include <zstd.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include "common/checksum.h"

namespace forge {
namespace {

constexpr size_t kBlock = size_t{1} << 20;

// A file descriptor read in blocks from an offset.
class RawFile {
 public:
  ~RawFile() {
    if (fd_ >= 0) ::close(fd_);
  }
  Status Open(const std::string& path, uint64_t offset) {
    path_ = path;
    fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd_ < 0) {
      if (errno == ENOENT) return Status::NotFound(path + ": no such file");
      return Status::IoError(path + ": cannot open: " + std::strerror(errno));
    }
    ::posix_fadvise(fd_, 0, 0, POSIX_FADV_SEQUENTIAL);
    pos_ = offset;
    return Status::Ok();
  }
  StatusOr<size_t> Read(char* buf, size_t n) {
    for (;;) {
      const ssize_t got = ::pread(fd_, buf, n, static_cast<off_t>(pos_));
      if (got < 0) {
        if (errno == EINTR) continue;
        return Status::IoError(path_ + ": read failed at byte " + std::to_string(pos_) + ": " +
                               std::strerror(errno));
      }
      pos_ += static_cast<uint64_t>(got);
      return static_cast<size_t>(got);
    }
  }
  uint64_t pos() const { return pos_; }

 private:
  std::string path_;
  int fd_ = -1;
  uint64_t pos_ = 0;
};

class PlainSource : public ByteSource {
 public:
  PlainSource(std::string path, std::atomic<int64_t>* progress)
      : ByteSource(std::move(path)), progress_(progress) {}
  Status Open(uint64_t offset) { return file_.Open(path_, offset); }
  StatusOr<size_t> Read(char* buf, size_t n) override {
    FORGE_ASSIGN_OR_RETURN(size_t got, file_.Read(buf, n));
    file_bytes_ += got;
    if (progress_ != nullptr) progress_->fetch_add(static_cast<int64_t>(got));
    return got;
  }

 private:
  RawFile file_;
  std::atomic<int64_t>* progress_;
};

// Shared by the two decompressors: a block of compressed input, refilled from the file.
class CompressedSource : public ByteSource {
 protected:
  CompressedSource(std::string path, std::atomic<int64_t>* progress)
      : ByteSource(std::move(path)), progress_(progress), in_(kBlock) {}
  Status OpenFile() { return file_.Open(path_, 0); }
  // Refills in_ when it is used up; false at the end of the file.
  StatusOr<bool> Refill() {
    if (in_pos_ < in_len_) return true;
    FORGE_ASSIGN_OR_RETURN(size_t got, file_.Read(in_.data(), in_.size()));
    in_pos_ = 0;
    in_len_ = got;
    file_bytes_ += got;
    file_crc_ = Crc32cExtend(file_crc_, in_.data(), got);
    if (progress_ != nullptr) progress_->fetch_add(static_cast<int64_t>(got));
    return got > 0;
  }
  // Compressed offset of the next unread input byte (for error messages).
  uint64_t offset() const { return file_bytes_ - (in_len_ - in_pos_); }

  RawFile file_;
  std::atomic<int64_t>* progress_;
  std::vector<char> in_;
  size_t in_pos_ = 0, in_len_ = 0;
};

class GzipSource : public CompressedSource {
 public:
  GzipSource(std::string path, std::atomic<int64_t>* progress)
      : CompressedSource(std::move(path), progress) {}
  ~GzipSource() override {
    if (init_) inflateEnd(&z_);
  }
  Status Open() {
    FORGE_RETURN_IF_ERROR(OpenFile());
    std::memset(&z_, 0, sizeof z_);
    if (inflateInit2(&z_, 15 + 32) != Z_OK) return Status::Internal(path_ + ": inflateInit2");
    init_ = true;
    return Status::Ok();
  }
  StatusOr<size_t> Read(char* buf, size_t n) override {
    for (;;) {
      FORGE_ASSIGN_OR_RETURN(bool more, Refill());
      if (!more) {
        if (member_bytes_ == 0 && members_ > 0) return size_t{0};  // ended between members
        return Status::DataLoss(path_ + ": truncated gzip stream (ends inside a member at "
                                "compressed byte " + std::to_string(file_bytes_) + ")");
      }
      z_.next_in = reinterpret_cast<Bytef*>(in_.data() + in_pos_);
      z_.avail_in = static_cast<uInt>(in_len_ - in_pos_);
      z_.next_out = reinterpret_cast<Bytef*>(buf);
      z_.avail_out = static_cast<uInt>(n);
      const uint64_t at = offset();
      const int rc = inflate(&z_, Z_NO_FLUSH);
      const size_t used = (in_len_ - in_pos_) - z_.avail_in;
      in_pos_ += used;
      member_bytes_ += used;
      const size_t produced = n - z_.avail_out;
      if (rc == Z_STREAM_END) {
        ++members_;
        member_bytes_ = 0;
        inflateReset(&z_);  // another member may follow (gzip files may be concatenated)
      } else if (rc != Z_OK && rc != Z_BUF_ERROR) {
        return Status::DataLoss(path_ + ": corrupt gzip data near compressed byte " +
                                std::to_string(at) + ": " +
                                (z_.msg != nullptr ? z_.msg : "inflate error " + std::to_string(rc)));
      }
      if (produced > 0) return produced;
    }
  }

 private:
  z_stream z_;
  bool init_ = false;
  uint64_t member_bytes_ = 0;
  int64_t members_ = 0;
};

class ZstdSource : public CompressedSource {
 public:
  ZstdSource(std::string path, std::atomic<int64_t>* progress)
      : CompressedSource(std::move(path), progress) {}
  ~ZstdSource() override {
    if (d_ != nullptr) ZSTD_freeDStream(d_);
  }
  Status Open() {
    FORGE_RETURN_IF_ERROR(OpenFile());
    d_ = ZSTD_createDStream();
    if (d_ == nullptr) return Status::Internal(path_ + ": ZSTD_createDStream");
    ZSTD_initDStream(d_);
    return Status::Ok();
  }
  StatusOr<size_t> Read(char* buf, size_t n) override {
    for (;;) {
      FORGE_ASSIGN_OR_RETURN(bool more, Refill());
      ZSTD_outBuffer out{buf, n, 0};
      if (!more) {
        // Flush what the decoder still holds for input it has already taken.
        ZSTD_inBuffer none{nullptr, 0, 0};
        const size_t rc = ZSTD_decompressStream(d_, &out, &none);
        if (ZSTD_isError(rc)) return Error(rc);
        if (out.pos > 0) return out.pos;
        if (rc == 0) frame_open_ = false;
        if (frame_open_) {
          return Status::DataLoss(path_ + ": truncated zstd stream (ends inside a frame at "
                                  "compressed byte " + std::to_string(file_bytes_) + ")");
        }
        return size_t{0};
      }
      ZSTD_inBuffer in{in_.data() + in_pos_, in_len_ - in_pos_, 0};
      const size_t rc = ZSTD_decompressStream(d_, &out, &in);
      in_pos_ += in.pos;
      if (ZSTD_isError(rc)) return Error(rc);
      frame_open_ = rc != 0;  // 0: a frame just ended (another may follow)
      if (out.pos > 0) return out.pos;
    }
  }

 private:
  Status Error(size_t rc) const {
    return Status::DataLoss(path_ + ": corrupt zstd data near compressed byte " +
                            std::to_string(offset()) + ": " + ZSTD_getErrorName(rc));
  }
  ZSTD_DStream* d_ = nullptr;
  bool frame_open_ = false;
};

}  // namespace

StatusOr<std::unique_ptr<ByteSource>> OpenByteSource(const std::string& path,
                                                     Compression compression, uint64_t offset,
                                                     std::atomic<int64_t>* progress) {
  switch (compression) {
    case Compression::kNone: {
      auto s = std::make_unique<PlainSource>(path, progress);
      FORGE_RETURN_IF_ERROR(s->Open(offset));
      return std::unique_ptr<ByteSource>(std::move(s));
    }
    case Compression::kGzip: {
      if (offset != 0) return Status::Internal(path + ": a gzip stream is read from its start");
      auto s = std::make_unique<GzipSource>(path, progress);
      FORGE_RETURN_IF_ERROR(s->Open());
      return std::unique_ptr<ByteSource>(std::move(s));
    }
    case Compression::kZstd: {
      if (offset != 0) return Status::Internal(path + ": a zstd stream is read from its start");
      auto s = std::make_unique<ZstdSource>(path, progress);
      FORGE_RETURN_IF_ERROR(s->Open());
      return std::unique_ptr<ByteSource>(std::move(s));
    }
  }
  return Status::Internal("unknown compression");
}

}  // namespace forge
