// Per-instance cache of pre-token bytes -> ids, so a common word costs one probe of an
// open-addressing table. Keys of up to 8 bytes live in the slot itself; longer keys and id
// lists of more than one id live in two arenas. Nothing is allocated per lookup; the arenas
// grow geometrically. When the table is full it is cleared (memory stays bounded).
#pragma once

#include <cstdint>
#include <cstring>
#include <vector>

#include "tokenizer/byte_hash.h"

namespace forge {

class PieceCache {
 public:
  // Pieces longer than this are not cached (rare; they would crowd the arenas).
  static constexpr size_t kMaxKey = 256;

  // Appends the cached ids of p[0, n) to out and returns true, or returns false.
  bool Lookup(const uint8_t* p, size_t n, std::vector<int32_t>* out) const {
    if (slots_.empty()) return false;
    const uint64_t head = PackHead(p, n);
    const size_t mask = slots_.size() - 1;
    for (size_t i = HashBytes(p, n, head) & mask;; i = (i + 1) & mask) {
      const Slot& s = slots_[i];
      if (s.len == 0) return false;
      if (s.len == n && s.head == head &&
          (n <= 8 || std::memcmp(tails_.data() + s.tail, p + 8, n - 8) == 0)) {
        if (s.count == 1) {
          out->push_back(static_cast<int32_t>(s.value));
        } else {
          const int32_t* ids = ids_.data() + s.value;
          out->insert(out->end(), ids, ids + s.count);
        }
        return true;
      }
    }
  }

  void Insert(const uint8_t* p, size_t n, const int32_t* ids, size_t count) {
    if (n == 0 || n > kMaxKey || count == 0) return;
    if (slots_.empty()) slots_.resize(kInitialSlots);
    if ((used_ + 1) * 2 > slots_.size()) {
      if (slots_.size() >= kMaxSlots) {
        Clear();
      } else {
        Grow();
      }
    }
    const uint64_t head = PackHead(p, n);
    Slot s{head, static_cast<uint32_t>(n), 0, 0, static_cast<uint32_t>(count)};
    if (n > 8) {
      s.tail = static_cast<uint32_t>(tails_.size());
      tails_.insert(tails_.end(), p + 8, p + n);
    }
    if (count == 1) {
      s.value = static_cast<uint32_t>(ids[0]);
    } else {
      s.value = static_cast<uint32_t>(ids_.size());
      ids_.insert(ids_.end(), ids, ids + count);
    }
    Place(s, HashBytes(p, n, head));
    ++used_;
  }

  size_t size() const { return used_; }

 private:
  struct Slot {
    uint64_t head;   // first 8 bytes of the key, zero-padded
    uint32_t len;    // key length; 0 = empty slot
    uint32_t tail;   // offset of key bytes [8, len) in tails_
    uint32_t value;  // the id when count == 1, else the offset in ids_
    uint32_t count;
  };
  static constexpr size_t kInitialSlots = 1 << 12;
  static constexpr size_t kMaxSlots = 1 << 19;

  void Place(const Slot& s, uint64_t hash) {
    const size_t mask = slots_.size() - 1;
    size_t i = hash & mask;
    while (slots_[i].len != 0) i = (i + 1) & mask;
    slots_[i] = s;
  }
  uint64_t HashOf(const Slot& s) const {
    if (s.len <= 8) return HashBytes(reinterpret_cast<const uint8_t*>(&s.head), s.len, s.head);
    uint8_t key[kMaxKey];
    std::memcpy(key, &s.head, 8);
    std::memcpy(key + 8, tails_.data() + s.tail, s.len - 8);
    return HashBytes(key, s.len, s.head);
  }
  void Grow() {
    std::vector<Slot> old(slots_.size() * 2);
    old.swap(slots_);
    for (const Slot& s : old) {
      if (s.len != 0) Place(s, HashOf(s));
    }
  }
  void Clear() {
    std::fill(slots_.begin(), slots_.end(), Slot{});
    tails_.clear();
    ids_.clear();
    used_ = 0;
  }

  std::vector<Slot> slots_;
  std::vector<uint8_t> tails_;
  std::vector<int32_t> ids_;
  size_t used_ = 0;
};

}  // namespace forge
