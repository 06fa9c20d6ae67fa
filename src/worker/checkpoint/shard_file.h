// The checkpoint shard file: one rank's ShardState, little-endian, every section checksummed.
//
//   header (64 bytes)
//        0    8 magic "FRGCKPT\0"
//        8    4 version (1)
//       12    4 rank
//       16    4 world
//       20    4 unit count U
//       24    8 step (optimizer steps completed)
//       32    8 data cursor (global sequence index of the next batch)
//       40    4 extra blob count X
//       44    4 zero
//       48    8 file size in bytes (truncation is visible without the manifest)
//       56    4 zero
//       60    4 CRC32C of header bytes [0, 60)
//   sections, in this order:
//       UNIT          U * 3 uint64: unit numel, begin, end (this rank's slice of the unit)
//       MSTR u, ADMM u, ADMV u   for u in 0..U-1: (end - begin) float32 each: master weights,
//                     AdamW first and second moment of the slice
//       RNG           opaque RNG bytes
//       XTRA i        for i in 0..X-1: uint32 name length, name, blob (sorted by name)
//       END           empty; the file ends right after it
//   every section: 4-char tag, uint32 index, uint64 payload length, payload, then the CRC32C of
//   (those 16 header bytes + payload).
//
// The whole-file CRC32C (recorded in the manifest) is derived from the section CRCs with
// Crc32cCombine, so writing and loading checksum every byte exactly once. Readers check
// everything above and return DataLoss naming the file and the section on any mismatch.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "common/file_io.h"
#include "common/status.h"
#include "worker/checkpoint/checkpoint_state.h"
#include "worker/model/shard_layout.h"

namespace forge {

inline constexpr char kCheckpointShardMagic[8] = {'F', 'R', 'G', 'C', 'K', 'P', 'T', '\0'};
inline constexpr uint32_t kCheckpointShardVersion = 1;
inline constexpr size_t kCheckpointShardHeaderSize = 64;

struct ShardFileInfo {
  uint64_t size = 0;
  uint32_t crc32c = 0;  // of the whole file
};

// Writes `state` to `path` (created/truncated, fsynced; no rename: see checkpoint_writer.h).
StatusOr<ShardFileInfo> WriteShardFile(const std::string& path, const ShardState& state);

// A verified shard file, mapped; the float payloads point into the mapping.
struct ShardFileContents {
  MappedFile file;
  int rank = 0, world = 0;
  int64_t step = 0, data_cursor = 0;
  std::vector<int64_t> unit_numel;
  std::vector<ShardRange> ranges;  // per unit
  // Per unit: ranges[u].size() float32 values inside the mapping (possibly unaligned: copy them
  // out with memcpy).
  std::vector<const uint8_t*> master, m, v;
  std::string rng;
  std::map<std::string, std::string> extra;
  ShardFileInfo info;
};

// Maps and verifies every byte of the file (header, section order, sizes, section CRCs).
StatusOr<ShardFileContents> ReadShardFile(const std::string& path);

}  // namespace forge
