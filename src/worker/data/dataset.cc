// The dataset loader: split token streams over lazily opened shards, and the unigram baseline.
#include "worker/data/dataset.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "common/checksum.h"

namespace forge {

StatusOr<const ShardReader*> TokenStream::Get(size_t k) const {
  Slot& slot = *shards_[k];
  std::call_once(slot.once, [&slot] {
    auto r = ShardReader::Open(slot.path, ShardCheck::kHeader);
    if (!r.ok()) {
      slot.status = r.status();
      return;
    }
    if (static_cast<int64_t>(r->size()) != slot.tokens || r->crc32c() != slot.crc32c ||
        r->dtype() != slot.dtype) {
      slot.status = Status::DataLoss(
          slot.path + ": does not match the dataset's shards table (shard has " +
          std::to_string(r->size()) + " " + TokenDtypeName(r->dtype()) + " tokens, CRC32C " +
          Crc32cHex(r->crc32c()) + "; the table says " + std::to_string(slot.tokens) + " " +
          TokenDtypeName(slot.dtype) + ", " + Crc32cHex(slot.crc32c) + ")");
      return;
    }
    slot.reader = std::move(r).value();
    slot.opened = true;
  });
  if (!slot.status.ok()) return slot.status;
  return &slot.reader;
}

int TokenStream::opened_shards() const {
  int n = 0;
  for (const auto& s : shards_) n += s->opened ? 1 : 0;
  return n;
}

Status TokenStream::VerifyShard(int k) const {
  FORGE_ASSIGN_OR_RETURN(const ShardReader* r, Get(static_cast<size_t>(k)));
  return r->VerifyPayload();
}

size_t TokenStream::ShardOf(int64_t i) const {
  const auto it = std::upper_bound(starts_.begin(), starts_.end(), i);
  return static_cast<size_t>(it - starts_.begin()) - 1;
}

uint32_t TokenStream::At(int64_t i) const {
  const size_t s = ShardOf(i);
  auto r = Get(s);
  if (!r.ok()) {
    std::fprintf(stderr, "forge: %s\n", r.status().ToString().c_str());
    std::abort();
  }
  return (**r)[static_cast<uint64_t>(i - starts_[s])];
}

Status TokenStream::Read(int64_t start, int64_t count, int32_t* out) const {
  if (start < 0 || count < 0 || start + count > total_) {
    return Status::Invalid("token range [" + std::to_string(start) + ", " +
                           std::to_string(start + count) + ") outside a stream of " +
                           std::to_string(total_) + " tokens");
  }
  if (count == 0) return Status::Ok();
  size_t s = ShardOf(start);
  while (count > 0) {
    FORGE_ASSIGN_OR_RETURN(const ShardReader* r, Get(s));
    const int64_t local = start - starts_[s];
    const int64_t n = std::min<int64_t>(count, static_cast<int64_t>(r->size()) - local);
    r->Copy(static_cast<uint64_t>(local), static_cast<uint64_t>(n), out);
    out += n;
    start += n;
    count -= n;
    ++s;
  }
  return Status::Ok();
}

StatusOr<TokenDataset> TokenDataset::Open(const std::string& dir) {
  TokenDataset ds;
  ds.dir_ = dir;
  FORGE_ASSIGN_OR_RETURN(ds.manifest_, ReadDatasetManifest(dir));
  for (Split s : {Split::kTrain, Split::kVal}) {
    TokenStream& ts = ds.streams_[static_cast<int>(s)];
    for (const ShardEntry& e : ds.manifest_.splits[static_cast<int>(s)].shards) {
      if (e.tokens == 0) continue;  // keeps starts_ strictly increasing
      auto slot = std::make_unique<TokenStream::Slot>();
      slot->path = dir + "/" + e.file;
      slot->tokens = e.tokens;
      slot->crc32c = e.crc32c;
      slot->dtype = ds.manifest_.dtype;
      ts.starts_.push_back(ts.total_);
      ts.total_ += e.tokens;
      ts.shards_.push_back(std::move(slot));
    }
  }
  return ds;
}

UnigramBaseline UnigramBaselineFromCounts(const std::vector<uint64_t>& train,
                                          const std::vector<uint64_t>& val) {
  UnigramBaseline u;
  const size_t vocab = std::max<size_t>({train.size(), val.size(), 1});
  for (uint64_t c : train) u.train_tokens += static_cast<int64_t>(c);
  for (uint64_t c : val) u.val_tokens += static_cast<int64_t>(c);
  const double denom = static_cast<double>(u.train_tokens) + static_cast<double>(vocab);
  double ce = 0, h = 0;
  for (size_t t = 0; t < vocab; ++t) {
    const double c = t < train.size() ? static_cast<double>(train[t]) : 0.0;
    const uint64_t v = t < val.size() ? val[t] : 0;
    if (v > 0) ce -= static_cast<double>(v) * std::log((c + 1) / denom);  // add-one smoothing
    if (c > 0) {
      const double p = c / static_cast<double>(u.train_tokens);
      h -= p * std::log(p);
    }
  }
  u.val_cross_entropy = u.val_tokens > 0 ? ce / static_cast<double>(u.val_tokens) : 0;
  u.train_entropy = h;
  return u;
}

UnigramBaseline ComputeUnigramBaseline(const TokenDataset& ds) {
  const size_t vocab = static_cast<size_t>(std::max<int64_t>(ds.manifest().vocab_size, 1));
  std::vector<uint64_t> counts[2];
  if (ReadUnigramTable(ds.dir(), ds.manifest(), counts).ok() && counts[0].size() == vocab) {
    return UnigramBaselineFromCounts(counts[0], counts[1]);
  }
  std::vector<int32_t> buf(1 << 16);
  for (int s = 0; s < 2; ++s) {
    counts[s].assign(vocab, 0);
    const TokenStream& ts = ds.split(static_cast<Split>(s));
    for (int64_t start = 0; start < ts.size(); start += static_cast<int64_t>(buf.size())) {
      const int64_t n = std::min<int64_t>(static_cast<int64_t>(buf.size()), ts.size() - start);
      if (!ts.Read(start, n, buf.data()).ok()) break;  // a damaged shard: count what reads
      for (int64_t i = 0; i < n; ++i) {
        const int32_t t = buf[static_cast<size_t>(i)];
        if (t >= 0 && static_cast<size_t>(t) < vocab) ++counts[s][static_cast<size_t>(t)];
      }
    }
  }
  return UnigramBaselineFromCounts(counts[0], counts[1]);
}

}  // namespace forge
