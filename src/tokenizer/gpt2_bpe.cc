// GPT-2 BPE: vocabulary loading, the merge loop and the per-pre-token cache.
#include "tokenizer/gpt2_bpe.h"

#include <algorithm>
#include <array>
#include <limits>
#include <queue>
#include <sstream>
#include <unordered_map>

#include <nlohmann/json.hpp>

#include "common/file_io.h"

namespace forge {
namespace {

inline uint64_t pair_key(int32_t a, int32_t b) {
  return (static_cast<uint64_t>(a) << 32) | static_cast<uint32_t>(b);
}

}  // namespace

struct Gpt2Bpe::Tables {
  std::vector<std::string> id_bytes;                    // id -> raw bytes
  std::unordered_map<std::string, int32_t> bytes_id;    // raw bytes -> id
  std::array<int32_t, 256> byte_id{};                   // single byte -> id
  struct Merge {
    int32_t rank;
    int32_t merged;
  };
  std::unordered_map<uint64_t, Merge> merges;  // (left id << 32 | right id) -> merge
};

// Per-instance cache: pre-token bytes -> ids, stored in one pool to avoid small vectors.
struct Gpt2Bpe::Cache {
  struct Hash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  struct Span {
    uint32_t offset;
    uint32_t length;
  };
  std::unordered_map<std::string, Span, Hash, std::equal_to<>> map;
  std::vector<int32_t> pool;
  static constexpr size_t kMaxEntries = 1 << 20;  // cleared when full: bounds memory
};

namespace {

// GPT-2's reversible byte -> printable code point map: printable Latin-1 bytes map to
// themselves, the other 68 bytes to U+0100.. in byte order.
std::array<uint32_t, 256> ByteToUnicode() {
  std::array<uint32_t, 256> map{};
  std::array<bool, 256> printable{};
  for (int b = '!'; b <= '~'; ++b) printable[b] = true;
  for (int b = 0xA1; b <= 0xAC; ++b) printable[b] = true;
  for (int b = 0xAE; b <= 0xFF; ++b) printable[b] = true;
  uint32_t next = 256;
  for (int b = 0; b < 256; ++b) map[b] = printable[b] ? b : next++;
  return map;
}

// Maps a vocabulary string (UTF-8 of byte-to-unicode code points) back to raw bytes.
bool VocabStringToBytes(const std::string& s, const std::vector<int>& unicode_to_byte,
                        std::string* out) {
  out->clear();
  size_t i = 0;
  while (i < s.size()) {
    const auto b0 = static_cast<uint8_t>(s[i]);
    uint32_t cp;
    if (b0 < 0x80) {
      cp = b0, i += 1;
    } else if ((b0 & 0xE0) == 0xC0 && i + 1 < s.size()) {
      cp = ((b0 & 0x1F) << 6) | (static_cast<uint8_t>(s[i + 1]) & 0x3F), i += 2;
    } else {
      return false;  // the map only uses code points < 0x800
    }
    if (cp >= unicode_to_byte.size() || unicode_to_byte[cp] < 0) return false;
    out->push_back(static_cast<char>(unicode_to_byte[cp]));
  }
  return true;
}

}  // namespace

StatusOr<Gpt2Bpe> Gpt2Bpe::Load(const std::string& encoder_json_path,
                               const std::string& vocab_bpe_path) {
  auto tables = std::make_shared<Tables>();
  const std::array<uint32_t, 256> b2u = ByteToUnicode();
  std::vector<int> u2b(512, -1);
  for (int b = 0; b < 256; ++b) u2b[b2u[b]] = b;

  FORGE_ASSIGN_OR_RETURN(std::string enc_text, ReadSmallFile(encoder_json_path));
  nlohmann::json enc = nlohmann::json::parse(enc_text, nullptr, /*allow_exceptions=*/false);
  if (!enc.is_object() || enc.empty()) {
    return Status::DataLoss(encoder_json_path + ": not a JSON object of token -> id");
  }
  tables->id_bytes.resize(enc.size());
  std::vector<bool> seen(enc.size(), false);
  std::string bytes;
  for (const auto& [key, value] : enc.items()) {
    if (!value.is_number_integer()) {
      return Status::DataLoss(encoder_json_path + ": token '" + key + "' has a non-integer id");
    }
    const int64_t id = value.get<int64_t>();
    if (id < 0 || id >= static_cast<int64_t>(enc.size()) || seen[id]) {
      return Status::DataLoss(encoder_json_path + ": token '" + key + "' has id " +
                              std::to_string(id) + " (out of range or repeated)");
    }
    seen[id] = true;
    if (key == "<|endoftext|>") {
      tables->id_bytes[id] = key;  // special: never produced by the merges
      continue;
    }
    if (!VocabStringToBytes(key, u2b, &bytes)) {
      return Status::DataLoss(encoder_json_path + ": token '" + key +
                              "' is not in GPT-2's byte-to-unicode alphabet");
    }
    tables->id_bytes[id] = bytes;
    tables->bytes_id.emplace(bytes, static_cast<int32_t>(id));
  }
  if (tables->id_bytes.size() <= static_cast<size_t>(kEndOfText) ||
      tables->id_bytes[kEndOfText] != "<|endoftext|>") {
    return Status::DataLoss(encoder_json_path + ": id " + std::to_string(kEndOfText) +
                            " is not <|endoftext|>");
  }
  for (int b = 0; b < 256; ++b) {
    auto it = tables->bytes_id.find(std::string(1, static_cast<char>(b)));
    if (it == tables->bytes_id.end()) {
      return Status::DataLoss(encoder_json_path + ": no token for byte " + std::to_string(b));
    }
    tables->byte_id[b] = it->second;
  }

  FORGE_ASSIGN_OR_RETURN(std::string merges_text, ReadSmallFile(vocab_bpe_path));
  std::istringstream lines(merges_text);
  std::string line, left, right;
  int line_no = 0;
  int32_t rank = 0;
  while (std::getline(lines, line)) {
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty() || (line_no == 1 && line.rfind("#version", 0) == 0)) continue;
    const size_t sp = line.find(' ');
    if (sp == std::string::npos || line.find(' ', sp + 1) != std::string::npos) {
      return Status::DataLoss(vocab_bpe_path + ":" + std::to_string(line_no) +
                              ": expected 'left right'");
    }
    if (!VocabStringToBytes(line.substr(0, sp), u2b, &left) ||
        !VocabStringToBytes(line.substr(sp + 1), u2b, &right)) {
      return Status::DataLoss(vocab_bpe_path + ":" + std::to_string(line_no) +
                              ": symbol outside the byte-to-unicode alphabet");
    }
    auto l = tables->bytes_id.find(left);
    auto r = tables->bytes_id.find(right);
    auto m = tables->bytes_id.find(left + right);
    if (l == tables->bytes_id.end() || r == tables->bytes_id.end() ||
        m == tables->bytes_id.end()) {
      return Status::DataLoss(vocab_bpe_path + ":" + std::to_string(line_no) + ": merge '" +
                              line + "' uses a token missing from " + encoder_json_path);
    }
    const uint64_t key = (static_cast<uint64_t>(l->second) << 32) | static_cast<uint32_t>(r->second);
    tables->merges.emplace(key, Tables::Merge{rank++, m->second});
  }
  if (rank == 0) return Status::DataLoss(vocab_bpe_path + ": no merges");
  return Gpt2Bpe(std::move(tables));
}

Gpt2Bpe::Gpt2Bpe(std::shared_ptr<const Tables> tables)
    : tables_(std::move(tables)), cache_(std::make_unique<Cache>()) {}

Gpt2Bpe::Gpt2Bpe(const Gpt2Bpe& other)
    : tables_(other.tables_), cache_(std::make_unique<Cache>()) {}

Gpt2Bpe& Gpt2Bpe::operator=(const Gpt2Bpe& other) {
  if (this != &other) {
    tables_ = other.tables_;
    cache_ = std::make_unique<Cache>();
  }
  return *this;
}

Gpt2Bpe::Gpt2Bpe(Gpt2Bpe&&) noexcept = default;
Gpt2Bpe& Gpt2Bpe::operator=(Gpt2Bpe&&) noexcept = default;
Gpt2Bpe::~Gpt2Bpe() = default;

int32_t Gpt2Bpe::vocab_size() const { return static_cast<int32_t>(tables_->id_bytes.size()); }

std::string_view Gpt2Bpe::TokenBytes(int32_t id) const {
  if (id < 0 || id >= vocab_size()) return {};
  return tables_->id_bytes[id];
}

std::vector<int32_t> Gpt2Bpe::MergePiece(std::string_view piece, bool long_algorithm) const {
  std::vector<int32_t> sym(piece.size());
  for (size_t i = 0; i < piece.size(); ++i) {
    sym[i] = tables_->byte_id[static_cast<uint8_t>(piece[i])];
  }
  if (long_algorithm) {
    MergeLong(*tables_, &sym);
  } else {
    MergeShort(*tables_, &sym);
  }
  return sym;
}

std::vector<int32_t> Gpt2Bpe::Encode(std::string_view text) {
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 1);
  EncodeAppend(text, &out);
  return out;
}

void Gpt2Bpe::EncodeAppend(std::string_view text, std::vector<int32_t>* out) {
  size_t pos = 0;
  while (pos < text.size()) {
    const size_t len = Gpt2PretokenLength(text, pos);
    EncodePiece(text.substr(pos, len), out);
    pos += len;
  }
}

void Gpt2Bpe::EncodePiece(std::string_view piece, std::vector<int32_t>* out) {
  const Tables& t = *tables_;
  if (piece.size() == 1) {
    out->push_back(t.byte_id[static_cast<uint8_t>(piece[0])]);
    return;
  }
  Cache& cache = *cache_;
  if (auto it = cache.map.find(piece); it != cache.map.end()) {
    const int32_t* p = cache.pool.data() + it->second.offset;
    out->insert(out->end(), p, p + it->second.length);
    return;
  }

  std::vector<int32_t> sym(piece.size());
  for (size_t i = 0; i < piece.size(); ++i) sym[i] = t.byte_id[static_cast<uint8_t>(piece[i])];
  if (sym.size() > kLongPiece) {
    MergeLong(t, &sym);
  } else {
    MergeShort(t, &sym);
  }

  out->insert(out->end(), sym.begin(), sym.end());
  if (cache.map.size() >= Cache::kMaxEntries) {
    cache.map.clear();
    cache.pool.clear();
  }
  cache.map.emplace(std::string(piece), Cache::Span{static_cast<uint32_t>(cache.pool.size()),
                                                    static_cast<uint32_t>(sym.size())});
  cache.pool.insert(cache.pool.end(), sym.begin(), sym.end());
}

// GPT-2's merge loop: find the adjacent pair with the lowest merge rank, merge every
// occurrence of it left to right, repeat until no pair has a merge. O(n^2): short pieces.
void Gpt2Bpe::MergeShort(const Tables& t, std::vector<int32_t>* symbols) {
  std::vector<int32_t>& sym = *symbols;
  while (sym.size() > 1) {
    int32_t best_rank = std::numeric_limits<int32_t>::max();
    uint64_t best_key = 0;
    int32_t best_merged = -1;
    for (size_t i = 0; i + 1 < sym.size(); ++i) {
      auto m = t.merges.find(pair_key(sym[i], sym[i + 1]));
      if (m != t.merges.end() && m->second.rank < best_rank) {
        best_rank = m->second.rank;
        best_key = m->first;
        best_merged = m->second.merged;
      }
    }
    if (best_merged < 0) break;
    size_t w = 0;
    for (size_t i = 0; i < sym.size();) {
      if (i + 1 < sym.size() && pair_key(sym[i], sym[i + 1]) == best_key) {
        sym[w++] = best_merged;
        i += 2;
      } else {
        sym[w++] = sym[i++];
      }
    }
    sym.resize(w);
  }
}

// The same result in O(n log n) for long pieces: a heap of candidate pairs ordered by (rank,
// position) over a linked list of symbols. Popping the lowest rank, leftmost first, merges
// the occurrences of a pair left to right exactly as MergeShort does, and pairs created by a
// merge always rank after it (a merge using token AB was learned after AB existed), so
// the order of merges is the same.
void Gpt2Bpe::MergeLong(const Tables& t, std::vector<int32_t>* symbols) {
  std::vector<int32_t>& sym = *symbols;
  const int32_t n = static_cast<int32_t>(sym.size());
  std::vector<int32_t> next(n), prev(n);
  for (int32_t i = 0; i < n; ++i) {
    next[i] = i + 1 < n ? i + 1 : -1;
    prev[i] = i - 1;
  }
  struct Candidate {
    int32_t rank;
    int32_t left;  // position of the left symbol
    int32_t left_id;
    int32_t right_id;
    bool operator>(const Candidate& o) const {
      return rank != o.rank ? rank > o.rank : left > o.left;
    }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<Candidate>> heap;
  auto push = [&](int32_t left) {
    if (left < 0 || next[left] < 0) return;
    auto m = t.merges.find(pair_key(sym[left], sym[next[left]]));
    if (m != t.merges.end()) heap.push({m->second.rank, left, sym[left], sym[next[left]]});
  };
  for (int32_t i = 0; i + 1 < n; ++i) push(i);
  while (!heap.empty()) {
    const Candidate c = heap.top();
    heap.pop();
    const int32_t right = next[c.left];
    // Stale: the left symbol was merged into its neighbour or changed, or its right changed.
    if (sym[c.left] != c.left_id || right < 0 || sym[right] != c.right_id) continue;
    sym[c.left] = t.merges.find(pair_key(c.left_id, c.right_id))->second.merged;
    sym[right] = -1;  // dead
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

StatusOr<std::string> Gpt2Bpe::Decode(const std::vector<int32_t>& ids) const {
  std::string out;
  for (int32_t id : ids) {
    if (id < 0 || id >= vocab_size()) {
      return Status::Invalid("Decode: token id " + std::to_string(id) + " outside vocabulary of " +
                             std::to_string(vocab_size()));
    }
    out += tables_->id_bytes[id];
  }
  return out;
}

}  // namespace forge
