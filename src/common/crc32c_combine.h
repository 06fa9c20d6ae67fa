// CRC32C of a concatenation from the CRCs of its parts: Crc32cCombine(Crc32c(a), Crc32c(b),
// b.size()) == Crc32c(a + b). Lets a checkpoint shard's whole-file checksum be derived from its
// per-section checksums, so every byte is checksummed once (on write and on load).
#pragma once

#include <cstdint>

namespace forge {

uint32_t Crc32cCombine(uint32_t crc_a, uint32_t crc_b, uint64_t len_b);

}  // namespace forge
