// BpeModel: building the tables from ranks or merges, and the merge loop.
#include "tokenizer/bpe_model.h"

#include <algorithm>
#include <climits>
#include <cstring>
#include <queue>

#include "tokenizer/byte_hash.h"

namespace forge {
namespace {

size_t PowerOfTwoAtLeast(size_t n) {
  size_t p = 16;
  while (p < n) p <<= 1;
  return p;
}

inline uint64_t PairKey(int32_t a, int32_t b) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
}

}  // namespace

StatusOr<std::unique_ptr<BpeModel>> BpeModel::Build(std::vector<Token> tokens,
                                                   const std::string& source) {
  std::unique_ptr<BpeModel> m(new BpeModel());
  int32_t max_id = -1;
  for (const Token& t : tokens) {
    if (t.id < 0) return Status::DataLoss(source + ": negative token id " + std::to_string(t.id));
    if (t.bytes.empty()) {
      return Status::DataLoss(source + ": token " + std::to_string(t.id) + " has no bytes");
    }
    max_id = std::max(max_id, t.id);
  }
  if (max_id < 0) return Status::DataLoss(source + ": no tokens");
  std::sort(tokens.begin(), tokens.end(), [](const Token& a, const Token& b) { return a.id < b.id; });
  m->offsets_.assign(static_cast<size_t>(max_id) + 2, 0);
  m->present_.assign(static_cast<size_t>(max_id) + 1, false);
  size_t total = 0;
  for (const Token& t : tokens) total += t.bytes.size();
  m->bytes_.reserve(total);
  size_t next = 0;
  for (const Token& t : tokens) {
    if (m->present_[t.id]) {
      return Status::DataLoss(source + ": token id " + std::to_string(t.id) + " appears twice");
    }
    for (; next <= static_cast<size_t>(t.id); ++next) m->offsets_[next] = m->bytes_.size();
    m->bytes_ += t.bytes;
    m->present_[t.id] = true;
  }
  for (; next < m->offsets_.size(); ++next) m->offsets_[next] = m->bytes_.size();

  m->find_slots_.assign(PowerOfTwoAtLeast(tokens.size() * 2), FindSlot{-1, 0});
  const size_t mask = m->find_slots_.size() - 1;
  for (const Token& t : tokens) {
    const auto* p = reinterpret_cast<const uint8_t*>(t.bytes.data());
    if (m->Find(p, t.bytes.size()) >= 0) {
      return Status::DataLoss(source + ": two tokens have the same bytes (ids " +
                              std::to_string(m->Find(p, t.bytes.size())) + " and " +
                              std::to_string(t.id) + ")");
    }
    const uint64_t h = HashBytes(p, t.bytes.size(), PackHead(p, t.bytes.size()));
    size_t slot = h & mask;
    while (m->find_slots_[slot].id >= 0) slot = (slot + 1) & mask;
    m->find_slots_[slot] = FindSlot{t.id, static_cast<uint32_t>(h >> 32)};
  }
  for (int b = 0; b < 256; ++b) {
    const auto byte = static_cast<uint8_t>(b);
    m->byte_id_[b] = m->Find(&byte, 1);
    if (m->byte_id_[b] < 0) {
      return Status::DataLoss(source + ": no token for the single byte 0x" +
                              std::string(1, "0123456789abcdef"[b >> 4]) +
                              std::string(1, "0123456789abcdef"[b & 15]) +
                              " (byte-level BPE needs all 256)");
    }
  }
  return m;
}

void BpeModel::BuildBytePairs() {
  byte_pairs_.resize(1 << 16);
  for (int a = 0; a < 256; ++a) {
    for (int b = 0; b < 256; ++b) byte_pairs_[(a << 8) | b] = Lookup(byte_id_[a], byte_id_[b]);
  }
  for (size_t id = 0; id + 1 < offsets_.size(); ++id) {
    max_token_bytes_ = std::max<size_t>(max_token_bytes_, offsets_[id + 1] - offsets_[id]);
  }
}

int32_t BpeModel::Find(const uint8_t* p, size_t n) const {
  if (find_slots_.empty()) return -1;
  const size_t mask = find_slots_.size() - 1;
  const uint64_t h = HashBytes(p, n, PackHead(p, n));
  const auto check = static_cast<uint32_t>(h >> 32);
  for (size_t slot = h & mask;; slot = (slot + 1) & mask) {
    const FindSlot s = find_slots_[slot];
    if (s.id < 0) return -1;
    if (s.check == check && offsets_[s.id + 1] - offsets_[s.id] == n &&
        std::memcmp(bytes_.data() + offsets_[s.id], p, n) == 0) {
      return s.id;
    }
  }
}

void BpeModel::ReservePairs(size_t n) {
  pairs_.assign(PowerOfTwoAtLeast(n * 2 + 1), PairSlot{kEmpty, 0, 0});
}

void BpeModel::AddPair(int32_t left, int32_t right, int32_t priority, int32_t merged) {
  const uint64_t key = PairKey(left, right);
  const size_t mask = pairs_.size() - 1;
  size_t slot = MixHash(key) & mask;
  while (pairs_[slot].key != kEmpty && pairs_[slot].key != key) slot = (slot + 1) & mask;
  if (pairs_[slot].key == kEmpty) ++pair_count_;
  pairs_[slot] = PairSlot{key, priority, merged};
}

std::pair<int32_t, int32_t> BpeModel::Lookup(int32_t left, int32_t right) const {
  const uint64_t key = PairKey(left, right);
  const size_t mask = pairs_.size() - 1;
  for (size_t slot = MixHash(key) & mask;; slot = (slot + 1) & mask) {
    const PairSlot& s = pairs_[slot];
    if (s.key == key) return {s.priority, s.merged};
    if (s.key == kEmpty) return {INT32_MAX, -1};
  }
}

StatusOr<std::shared_ptr<const BpeModel>> BpeModel::FromRanks(std::vector<Token> tokens,
                                                             const std::string& source) {
  FORGE_ASSIGN_OR_RETURN(std::unique_ptr<BpeModel> m, Build(std::move(tokens), source));
  // Every split of every token into two tokens is a pair that merges with the token's rank.
  std::vector<std::pair<uint64_t, int32_t>> pairs;  // (key, merged id = rank)
  for (int32_t id = 0; id < m->size(); ++id) {
    if (!m->present_[id]) continue;
    const std::string_view b = m->TokenBytes(id);
    const auto* p = reinterpret_cast<const uint8_t*>(b.data());
    for (size_t k = 1; k < b.size(); ++k) {
      const int32_t left = m->Find(p, k);
      if (left < 0) continue;
      const int32_t right = m->Find(p + k, b.size() - k);
      if (right >= 0) pairs.emplace_back(PairKey(left, right), id);
    }
  }
  m->ReservePairs(pairs.size());
  for (const auto& [key, id] : pairs) {
    m->AddPair(static_cast<int32_t>(key >> 32), static_cast<int32_t>(key & 0xffffffffu), id, id);
  }
  m->whole_piece_lookup_ = true;
  m->BuildBytePairs();
  return std::shared_ptr<const BpeModel>(std::move(m));
}

StatusOr<std::shared_ptr<const BpeModel>> BpeModel::FromMerges(std::vector<Token> tokens,
                                                              const std::vector<Merge>& merges,
                                                              bool whole_piece_lookup,
                                                              const std::string& source) {
  FORGE_ASSIGN_OR_RETURN(std::unique_ptr<BpeModel> m, Build(std::move(tokens), source));
  m->ReservePairs(merges.size());
  std::string joined;
  for (size_t i = 0; i < merges.size(); ++i) {
    const Merge& mg = merges[i];
    if (!m->HasToken(mg.left) || !m->HasToken(mg.right)) {
      return Status::DataLoss(source + ": merge " + std::to_string(i) + " uses an id that is not a token");
    }
    joined.assign(m->TokenBytes(mg.left));
    joined += m->TokenBytes(mg.right);
    const int32_t merged = m->Find(reinterpret_cast<const uint8_t*>(joined.data()), joined.size());
    if (merged < 0) {
      return Status::DataLoss(source + ": merge " + std::to_string(i) +
                              " makes a token that is not in the vocabulary");
    }
    // A repeated pair takes its last position, as the reference implementations' maps do.
    m->AddPair(mg.left, mg.right, static_cast<int32_t>(i), merged);
  }
  m->whole_piece_lookup_ = whole_piece_lookup;
  m->BuildBytePairs();
  return std::shared_ptr<const BpeModel>(std::move(m));
}

// tiktoken's loop: the priority of each adjacent pair is kept, so a merge costs a scan for the
// minimum and two lookups for the new neighbours. Quadratic in the piece length.
size_t BpeModel::MergeShortArrays(int32_t* sym, size_t n, int32_t* rk, int32_t* mg,
                                  bool pairs_ready) const {
  if (n < 2) return n;
  if (!pairs_ready) {
    for (size_t i = 0; i + 1 < n; ++i) std::tie(rk[i], mg[i]) = Lookup(sym[i], sym[i + 1]);
  }
  while (n > 1) {
    int32_t best = INT32_MAX;
    size_t bi = 0;
    for (size_t i = 0; i + 1 < n; ++i) {
      if (rk[i] < best) best = rk[i], bi = i;
    }
    if (best == INT32_MAX) break;
    sym[bi] = mg[bi];
    for (size_t j = bi + 1; j + 1 < n; ++j) sym[j] = sym[j + 1];
    for (size_t j = bi + 1; j + 2 < n; ++j) rk[j] = rk[j + 1], mg[j] = mg[j + 1];
    --n;
    if (bi > 0) std::tie(rk[bi - 1], mg[bi - 1]) = Lookup(sym[bi - 1], sym[bi]);
    if (bi + 1 < n) std::tie(rk[bi], mg[bi]) = Lookup(sym[bi], sym[bi + 1]);
  }
  return n;
}

void BpeModel::MergeShort(std::vector<int32_t>* sym) const {
  std::vector<int32_t> rk(sym->size()), mg(sym->size());
  sym->resize(MergeShortArrays(sym->data(), sym->size(), rk.data(), mg.data(), false));
}

// The same result in O(n log n): a heap of candidate pairs ordered by (priority, position)
// over a linked list of symbols; entries made stale by a neighbouring merge are skipped.
void BpeModel::MergeLong(std::vector<int32_t>* symbols) const {
  std::vector<int32_t>& sym = *symbols;
  const auto n = static_cast<int32_t>(sym.size());
  std::vector<int32_t> next(n), prev(n);
  for (int32_t i = 0; i < n; ++i) {
    next[i] = i + 1 < n ? i + 1 : -1;
    prev[i] = i - 1;
  }
  struct Candidate {
    int32_t priority;
    int32_t left;  // position of the left symbol
    int32_t left_id;
    int32_t right_id;
    int32_t merged;
    bool operator>(const Candidate& o) const {
      return priority != o.priority ? priority > o.priority : left > o.left;
    }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<Candidate>> heap;
  auto push = [&](int32_t left) {
    if (left < 0 || next[left] < 0) return;
    const auto [priority, merged] = Lookup(sym[left], sym[next[left]]);
    if (priority != INT32_MAX) heap.push({priority, left, sym[left], sym[next[left]], merged});
  };
  for (int32_t i = 0; i + 1 < n; ++i) push(i);
  while (!heap.empty()) {
    const Candidate c = heap.top();
    heap.pop();
    const int32_t right = next[c.left];
    if (sym[c.left] != c.left_id || right < 0 || sym[right] != c.right_id) continue;
    sym[c.left] = c.merged;
    sym[right] = -1;
    next[c.left] = next[right];
    if (next[right] >= 0) prev[next[right]] = c.left;
    push(prev[c.left]);
    push(c.left);
  }
  int32_t w = 0;
  for (int32_t i = 0; i < n; ++i) {
    if (sym[i] >= 0) sym[w++] = sym[i];
  }
  sym.resize(w);
}

std::vector<int32_t> BpeModel::MergeBytes(std::string_view piece, bool heap_based) const {
  std::vector<int32_t> sym(piece.size());
  for (size_t i = 0; i < piece.size(); ++i) sym[i] = byte_id_[static_cast<uint8_t>(piece[i])];
  if (heap_based) {
    MergeLong(&sym);
  } else {
    MergeShort(&sym);
  }
  return sym;
}

void BpeModel::EncodePiece(const uint8_t* p, size_t n, std::vector<int32_t>* out) const {
  if (n == 1) {
    out->push_back(byte_id_[p[0]]);
    return;
  }
  if (whole_piece_lookup_ && n <= max_token_bytes_) {
    const int32_t id = Find(p, n);
    if (id >= 0) {
      out->push_back(id);
      return;
    }
  }
  if (n <= kLongPiece) {
    int32_t sym[kLongPiece], rk[kLongPiece], mg[kLongPiece];
    for (size_t i = 0; i < n; ++i) sym[i] = byte_id_[p[i]];
    for (size_t i = 0; i + 1 < n; ++i) std::tie(rk[i], mg[i]) = byte_pairs_[(p[i] << 8) | p[i + 1]];
    const size_t m = MergeShortArrays(sym, n, rk, mg, true);
    out->insert(out->end(), sym, sym + m);
    return;
  }
  std::vector<int32_t> sym(n);
  for (size_t i = 0; i < n; ++i) sym[i] = byte_id_[p[i]];
  MergeLong(&sym);
  out->insert(out->end(), sym.begin(), sym.end());
}

}  // namespace forge
