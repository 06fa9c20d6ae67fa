#include "worker/checkpoint/shard_file.h"

#include <cstring>
#include <utility>

#include "common/binary_header.h"
#include "common/checksum.h"
#include "common/crc32c_combine.h"

namespace forge {
namespace {

constexpr BinaryHeaderFormat kHeader{"checkpoint shard", kCheckpointShardMagic,
                                     kCheckpointShardVersion, kCheckpointShardHeaderSize, 60};
constexpr size_t kSectionHeaderSize = 16;
constexpr size_t kSectionTrailerSize = 4;

std::string SectionName(const char* tag, uint32_t index) {
  std::string name(tag, 4);
  while (!name.empty() && name.back() == ' ') name.pop_back();
  return name + "[" + std::to_string(index) + "]";
}

// Streams sections to a FileWriter, keeping the running whole-file CRC.
class SectionWriter {
 public:
  explicit SectionWriter(FileWriter* w) : w_(w) {}

  Status Header(const uint8_t* header, size_t size) {
    file_crc_ = Crc32cExtend(file_crc_, header, size);
    return w_->Write(header, size);
  }

  // One section whose payload is the concatenation of `parts`.
  Status Section(const char* tag, uint32_t index,
                 std::initializer_list<std::pair<const void*, size_t>> parts) {
    uint64_t length = 0;
    for (const auto& [p, n] : parts) length += n;
    uint8_t hdr[kSectionHeaderSize];
    std::memcpy(hdr, tag, 4);
    PutLe<uint32_t>(hdr + 4, index);
    PutLe<uint64_t>(hdr + 8, length);
    uint32_t crc = Crc32c(hdr, sizeof(hdr));
    FORGE_RETURN_IF_ERROR(w_->Write(hdr, sizeof(hdr)));
    for (const auto& [p, n] : parts) {
      crc = Crc32cExtend(crc, p, n);
      FORGE_RETURN_IF_ERROR(w_->Write(p, n));
    }
    uint8_t trailer[kSectionTrailerSize];
    PutLe<uint32_t>(trailer, crc);
    FORGE_RETURN_IF_ERROR(w_->Write(trailer, sizeof(trailer)));
    file_crc_ = Crc32cCombine(file_crc_, crc, kSectionHeaderSize + length);
    file_crc_ = Crc32cExtend(file_crc_, trailer, sizeof(trailer));
    return Status::Ok();
  }

  uint32_t file_crc() const { return file_crc_; }

 private:
  FileWriter* w_;
  uint32_t file_crc_ = 0;
};

uint64_t SectionBytes(uint64_t payload) {
  return kSectionHeaderSize + payload + kSectionTrailerSize;
}

Status CheckState(const ShardState& s) {
  if (s.world < 1 || s.rank < 0 || s.rank >= s.world) {
    return Status::Invalid("shard state: rank " + std::to_string(s.rank) + " of world " +
                           std::to_string(s.world));
  }
  for (size_t u = 0; u < s.units.size(); ++u) {
    const UnitSlice& x = s.units[u];
    const std::string where = "shard state unit " + std::to_string(u);
    if (x.begin < 0 || x.begin > x.end || x.end > x.unit_numel) {
      return Status::Invalid(where + ": slice [" + std::to_string(x.begin) + ", " +
                             std::to_string(x.end) + ") outside the unit's " +
                             std::to_string(x.unit_numel) + " elements");
    }
    const auto n = static_cast<int64_t>(x.master.size());
    if (n != x.size() && n != x.unit_numel) {
      return Status::Invalid(where + ": master holds " + std::to_string(n) +
                             " floats, expected the slice (" + std::to_string(x.size()) +
                             ") or the whole unit (" + std::to_string(x.unit_numel) + ")");
    }
    if (static_cast<int64_t>(x.m.size()) != n || static_cast<int64_t>(x.v.size()) != n) {
      return Status::Invalid(where + ": moments m/v hold " + std::to_string(x.m.size()) + "/" +
                             std::to_string(x.v.size()) + " floats, master " +
                             std::to_string(n));
    }
  }
  return Status::Ok();
}

uint64_t FileSize(const ShardState& s) {
  uint64_t size = kCheckpointShardHeaderSize + SectionBytes(24 * s.units.size());
  for (const UnitSlice& x : s.units) size += 3 * SectionBytes(4 * static_cast<uint64_t>(x.size()));
  size += SectionBytes(s.trainer.rng.size());
  for (const auto& [name, blob] : s.trainer.extra) size += SectionBytes(4 + name.size() + blob.size());
  return size + SectionBytes(0);
}

}  // namespace

StatusOr<ShardFileInfo> WriteShardFile(const std::string& path, const ShardState& s) {
  FORGE_RETURN_IF_ERROR(CheckState(s).Annotate(path));
  const uint64_t file_size = FileSize(s);

  uint8_t header[kCheckpointShardHeaderSize] = {};
  StartBinaryHeader(header, kHeader);
  PutLe<uint32_t>(header + 12, static_cast<uint32_t>(s.rank));
  PutLe<uint32_t>(header + 16, static_cast<uint32_t>(s.world));
  PutLe<uint32_t>(header + 20, static_cast<uint32_t>(s.units.size()));
  PutLe<int64_t>(header + 24, s.trainer.step);
  PutLe<int64_t>(header + 32, s.trainer.data_cursor);
  PutLe<uint32_t>(header + 40, static_cast<uint32_t>(s.trainer.extra.size()));
  PutLe<uint64_t>(header + 48, file_size);
  SealBinaryHeader(header, kHeader);

  FORGE_ASSIGN_OR_RETURN(FileWriter w, FileWriter::Create(path));
  SectionWriter sw(&w);
  FORGE_RETURN_IF_ERROR(sw.Header(header, sizeof(header)));

  std::vector<uint8_t> table(24 * s.units.size());
  for (size_t u = 0; u < s.units.size(); ++u) {
    PutLe<int64_t>(&table[24 * u], s.units[u].unit_numel);
    PutLe<int64_t>(&table[24 * u + 8], s.units[u].begin);
    PutLe<int64_t>(&table[24 * u + 16], s.units[u].end);
  }
  FORGE_RETURN_IF_ERROR(sw.Section("UNIT", 0, {{table.data(), table.size()}}));
  for (size_t u = 0; u < s.units.size(); ++u) {
    const UnitSlice& x = s.units[u];
    const size_t off = static_cast<size_t>(x.data_offset());
    const size_t bytes = 4 * static_cast<size_t>(x.size());
    const auto index = static_cast<uint32_t>(u);
    FORGE_RETURN_IF_ERROR(sw.Section("MSTR", index, {{x.master.data() + off, bytes}}));
    FORGE_RETURN_IF_ERROR(sw.Section("ADMM", index, {{x.m.data() + off, bytes}}));
    FORGE_RETURN_IF_ERROR(sw.Section("ADMV", index, {{x.v.data() + off, bytes}}));
  }
  FORGE_RETURN_IF_ERROR(sw.Section("RNG ", 0, {{s.trainer.rng.data(), s.trainer.rng.size()}}));
  uint32_t i = 0;
  for (const auto& [name, blob] : s.trainer.extra) {
    uint8_t len[4];
    PutLe<uint32_t>(len, static_cast<uint32_t>(name.size()));
    FORGE_RETURN_IF_ERROR(sw.Section(
        "XTRA", i++, {{len, 4}, {name.data(), name.size()}, {blob.data(), blob.size()}}));
  }
  FORGE_RETURN_IF_ERROR(sw.Section("END ", 0, {}));
  if (w.bytes_written() != file_size) {
    return Status::Internal(path + ": wrote " + std::to_string(w.bytes_written()) +
                            " bytes, header says " + std::to_string(file_size));
  }
  FORGE_RETURN_IF_ERROR(w.Close());
  return ShardFileInfo{file_size, sw.file_crc()};
}

namespace {

// Walks the sections of a mapped file in their required order.
class SectionReader {
 public:
  SectionReader(const MappedFile& f, uint32_t header_crc)
      : f_(f), pos_(kCheckpointShardHeaderSize), file_crc_(header_crc) {}

  // Verifies the next section is (tag, index) and returns its payload.
  Status Next(const char* tag, uint32_t index, const uint8_t** payload, uint64_t* length) {
    const std::string name = SectionName(tag, index);
    const uint8_t* base = f_.data();
    if (f_.size() - pos_ < kSectionHeaderSize) {
      return Status::DataLoss(f_.path() + ": truncated before section " + name);
    }
    const uint8_t* hdr = base + pos_;
    if (std::memcmp(hdr, tag, 4) != 0 || GetLe<uint32_t>(hdr + 4) != index) {
      return Status::DataLoss(f_.path() + ": expected section " + name + " at offset " +
                              std::to_string(pos_) + ", found " +
                              SectionName(reinterpret_cast<const char*>(hdr),
                                          GetLe<uint32_t>(hdr + 4)) +
                              " (corrupt or not a checkpoint shard)");
    }
    const uint64_t len = GetLe<uint64_t>(hdr + 8);
    if (len > f_.size() - pos_ - kSectionHeaderSize ||
        f_.size() - pos_ - kSectionHeaderSize - len < kSectionTrailerSize) {
      return Status::DataLoss(f_.path() + ": truncated in section " + name + " (" +
                              std::to_string(len) + "-byte payload at offset " +
                              std::to_string(pos_) + ", file is " + std::to_string(f_.size()) +
                              " bytes)");
    }
    const uint32_t crc = Crc32c(hdr, kSectionHeaderSize + len);
    const uint8_t* trailer = hdr + kSectionHeaderSize + len;
    if (GetLe<uint32_t>(trailer) != crc) {
      return Status::DataLoss(f_.path() + ": section " + name + " checksum mismatch (corrupt data)");
    }
    file_crc_ = Crc32cCombine(file_crc_, crc, kSectionHeaderSize + len);
    file_crc_ = Crc32cExtend(file_crc_, trailer, kSectionTrailerSize);
    pos_ += SectionBytes(len);
    *payload = hdr + kSectionHeaderSize;
    *length = len;
    return Status::Ok();
  }

  uint64_t pos() const { return pos_; }
  uint32_t file_crc() const { return file_crc_; }

 private:
  const MappedFile& f_;
  uint64_t pos_;
  uint32_t file_crc_;
};

}  // namespace

StatusOr<ShardFileContents> ReadShardFile(const std::string& path) {
  auto mapped = MappedFile::Open(path);
  if (!mapped.ok()) {
    if (mapped.status().code() == Code::kNotFound) {
      return Status::DataLoss(path + ": shard file is missing");
    }
    return mapped.status();
  }
  ShardFileContents c;
  c.file = std::move(mapped).value();
  const MappedFile& f = c.file;
  FORGE_RETURN_IF_ERROR(CheckBinaryHeader(path, f.data(), f.size(), kHeader));
  const uint8_t* h = f.data();
  const uint64_t expect_size = GetLe<uint64_t>(h + 48);
  if (f.size() != expect_size) {
    return Status::DataLoss(path + ": " + (f.size() < expect_size ? "truncated" : "trailing bytes") +
                            ": file is " + std::to_string(f.size()) + " bytes, header says " +
                            std::to_string(expect_size));
  }
  c.rank = static_cast<int>(GetLe<uint32_t>(h + 12));
  c.world = static_cast<int>(GetLe<uint32_t>(h + 16));
  const uint32_t units = GetLe<uint32_t>(h + 20);
  c.step = GetLe<int64_t>(h + 24);
  c.data_cursor = GetLe<int64_t>(h + 32);
  const uint32_t extras = GetLe<uint32_t>(h + 40);

  SectionReader r(f, Crc32c(h, kCheckpointShardHeaderSize));
  const uint8_t* p = nullptr;
  uint64_t len = 0;
  FORGE_RETURN_IF_ERROR(r.Next("UNIT", 0, &p, &len));
  if (len != 24ull * units) {
    return Status::DataLoss(path + ": unit table holds " + std::to_string(len) +
                            " bytes for " + std::to_string(units) + " units");
  }
  for (uint32_t u = 0; u < units; ++u) {
    const int64_t numel = GetLe<int64_t>(p + 24 * u);
    const ShardRange range{GetLe<int64_t>(p + 24 * u + 8), GetLe<int64_t>(p + 24 * u + 16)};
    if (range.begin < 0 || range.begin > range.end || range.end > numel) {
      return Status::DataLoss(path + ": unit " + std::to_string(u) + " slice [" +
                              std::to_string(range.begin) + ", " + std::to_string(range.end) +
                              ") outside its " + std::to_string(numel) + " elements");
    }
    c.unit_numel.push_back(numel);
    c.ranges.push_back(range);
  }
  for (uint32_t u = 0; u < units; ++u) {
    const uint64_t bytes = 4 * static_cast<uint64_t>(c.ranges[u].size());
    std::vector<const uint8_t*>* dst[3] = {&c.master, &c.m, &c.v};
    const char* tags[3] = {"MSTR", "ADMM", "ADMV"};
    for (int k = 0; k < 3; ++k) {
      FORGE_RETURN_IF_ERROR(r.Next(tags[k], u, &p, &len));
      if (len != bytes) {
        return Status::DataLoss(path + ": section " + SectionName(tags[k], u) + " holds " +
                                std::to_string(len) + " bytes, the unit slice needs " +
                                std::to_string(bytes));
      }
      dst[k]->push_back(p);
    }
  }
  FORGE_RETURN_IF_ERROR(r.Next("RNG ", 0, &p, &len));
  c.rng.assign(reinterpret_cast<const char*>(p), len);
  for (uint32_t i = 0; i < extras; ++i) {
    FORGE_RETURN_IF_ERROR(r.Next("XTRA", i, &p, &len));
    const uint32_t name_len = len >= 4 ? GetLe<uint32_t>(p) : 0;
    if (len < 4 || name_len > len - 4) {
      return Status::DataLoss(path + ": section " + SectionName("XTRA", i) +
                              " has a bad name length");
    }
    c.extra[std::string(reinterpret_cast<const char*>(p + 4), name_len)] =
        std::string(reinterpret_cast<const char*>(p + 4 + name_len), len - 4 - name_len);
  }
  FORGE_RETURN_IF_ERROR(r.Next("END ", 0, &p, &len));
  if (r.pos() != f.size()) {
    return Status::DataLoss(path + ": " + std::to_string(f.size() - r.pos()) +
                            " trailing bytes after the END section");
  }
  c.info = {f.size(), r.file_crc()};
  return c;
}

}  // namespace forge
