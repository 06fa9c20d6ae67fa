// CRC32C (Castagnoli polynomial, reflected, as in iSCSI/ext4/LevelDB): checksums of token
// shards, checkpoint shards and dataset manifests. SSE4.2 crc32 where the CPU has it (~6 GB/s
// per core), else software slicing-by-8 (~1.5 GB/s); same values either way.
// Known value: Crc32c("123456789") == 0xE3069283.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace forge {

// Continues a CRC: Crc32cExtend(Crc32c(a), b) == Crc32c(a + b). Start from 0.
uint32_t Crc32cExtend(uint32_t crc, const void* data, size_t size);

inline uint32_t Crc32c(const void* data, size_t size) { return Crc32cExtend(0, data, size); }
inline uint32_t Crc32c(std::string_view s) { return Crc32cExtend(0, s.data(), s.size()); }

// "0x" + 8 lowercase hex digits, the form manifests store.
std::string Crc32cHex(uint32_t crc);

}  // namespace forge
