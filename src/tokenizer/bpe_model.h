// The byte-level BPE engine every tokenizer uses: immutable tables plus the merge loop.
//
// Symbols are token ids. A piece of text starts as the ids of its single bytes; the adjacent
// pair with the lowest priority is merged into its token, the leftmost on ties, until no
// adjacent pair has a merge. Two sources of the pair table give the two common semantics:
//  - merge lists (GPT-2's vocab.bpe, a tokenizer.json's "merges"): the pair (a, b) of the
//    i-th merge has priority i;
//  - rank files (tiktoken): a pair merges when the concatenation of its bytes is a token, with
//    the token's rank as priority; FromRanks enumerates every such split of every token.
// Either way the loop is the same, so tiktoken's and Hugging Face's results come out of one
// implementation. With `whole_piece_lookup` (tiktoken always; tokenizer.json's
// "ignore_merges"), a piece that is itself a token is that token without merging.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/status.h"

namespace forge {

class BpeModel {
 public:
  struct Token {
    std::string bytes;
    int32_t id;
  };
  struct Merge {
    int32_t left;
    int32_t right;
  };

  // Ranks: token bytes -> id, the id being the rank. Every single byte must be a token.
  // `source` names the file in errors.
  static StatusOr<std::shared_ptr<const BpeModel>> FromRanks(std::vector<Token> tokens,
                                                             const std::string& source);
  // A merge list in priority order over ids of `tokens`; each merged token must exist.
  static StatusOr<std::shared_ptr<const BpeModel>> FromMerges(std::vector<Token> tokens,
                                                              const std::vector<Merge>& merges,
                                                              bool whole_piece_lookup,
                                                              const std::string& source);

  // One more than the largest ordinary id.
  int32_t size() const { return static_cast<int32_t>(offsets_.size()) - 1; }
  bool HasToken(int32_t id) const { return id >= 0 && id < size() && present_[id]; }
  // Bytes of an ordinary token ("" for an id that has none).
  std::string_view TokenBytes(int32_t id) const {
    if (id < 0 || id >= size()) return {};
    return std::string_view(bytes_).substr(offsets_[id], offsets_[id + 1] - offsets_[id]);
  }
  // The id whose bytes are exactly p[0, n), or -1.
  int32_t Find(const uint8_t* p, size_t n) const;
  int32_t ByteId(uint8_t b) const { return byte_id_[b]; }
  bool whole_piece_lookup() const { return whole_piece_lookup_; }
  size_t pair_count() const { return pair_count_; }

  // Appends the ids of one pre-token (no cache): the whole-piece lookup if enabled, else the
  // merge loop, quadratic for short pieces and heap-based for long ones (same result).
  void EncodePiece(const uint8_t* p, size_t n, std::vector<int32_t>* out) const;
  // The merge loop alone with a chosen algorithm, for tests that compare the two.
  std::vector<int32_t> MergeBytes(std::string_view piece, bool heap_based) const;

  // Pieces longer than this (bytes) use the heap-based merge.
  static constexpr size_t kLongPiece = 64;

 private:
  struct PairSlot {
    uint64_t key;  // left << 32 | right; kEmpty when unused
    int32_t priority;
    int32_t merged;
  };
  static constexpr uint64_t kEmpty = ~0ull;

  BpeModel() = default;
  static StatusOr<std::unique_ptr<BpeModel>> Build(std::vector<Token> tokens,
                                                   const std::string& source);
  void AddPair(int32_t left, int32_t right, int32_t priority, int32_t merged);
  void ReservePairs(size_t n);
  // Priority and merged id of (left, right), or priority INT32_MAX when they do not merge.
  std::pair<int32_t, int32_t> Lookup(int32_t left, int32_t right) const;
  // Merges sym[0, n) in place (rk, mg: scratch of n entries, holding the pairs' priorities
  // and merged ids when `pairs_ready`); returns the new length.
  size_t MergeShortArrays(int32_t* sym, size_t n, int32_t* rk, int32_t* mg, bool pairs_ready) const;
  void BuildBytePairs();
  void MergeShort(std::vector<int32_t>* sym) const;
  void MergeLong(std::vector<int32_t>* sym) const;

  std::string bytes_;              // ordinary tokens' bytes, by id
  std::vector<uint32_t> offsets_;  // id -> [offsets_[id], offsets_[id + 1]) in bytes_
  std::vector<bool> present_;
  struct FindSlot {
    int32_t id;      // -1 when unused
    uint32_t check;  // high bits of the hash, compared before the bytes
  };
  std::vector<FindSlot> find_slots_;  // open addressing over ids, by the hash of their bytes
  std::array<int32_t, 256> byte_id_{};
  std::vector<PairSlot> pairs_;  // open addressing, power-of-two size
  // (priority, merged) of the pair of single-byte tokens (b1, b2) at b1 << 8 | b2: the first
  // merges of every piece without a probe of the large table.
  std::vector<std::pair<int32_t, int32_t>> byte_pairs_;
  size_t max_token_bytes_ = 0;
  size_t pair_count_ = 0;
  bool whole_piece_lookup_ = false;
};

}  // namespace forge
