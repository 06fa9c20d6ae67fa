// Dataset manifest IO, the split token streams and the unigram baseline.
#include "worker/data/dataset.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "common/checksum.h"
#include "common/file_io.h"

namespace forge {
namespace {

using nlohmann::json;

StatusOr<uint32_t> ParseHex32(const std::string& s, const std::string& where) {
  if (s.size() != 10 || s.rfind("0x", 0) != 0 ||
      s.find_first_not_of("0123456789abcdefABCDEF", 2) != std::string::npos) {
    return Status::DataLoss(where + ": bad checksum '" + s + "' (want 0x + 8 hex digits)");
  }
  return static_cast<uint32_t>(std::stoul(s.substr(2), nullptr, 16));
}

}  // namespace

Status WriteDatasetManifest(const std::string& dir, const DatasetManifest& m) {
  json j;
  j["format"] = "forge-dataset";
  j["version"] = m.version;
  j["tokenizer"] = m.tokenizer;
  j["vocab_size"] = m.vocab_size;
  j["eot_token"] = m.eot_token;
  j["dtype"] = TokenDtypeName(m.dtype);
  j["options_hash"] = m.options_hash;
  for (Split s : {Split::kTrain, Split::kVal}) {
    const SplitManifest& sm = m.splits[static_cast<int>(s)];
    json js;
    js["tokens"] = sm.tokens;
    js["docs"] = sm.docs;
    js["text_bytes"] = sm.text_bytes;
    js["shards"] = json::array();
    for (const ShardEntry& e : sm.shards) {
      js["shards"].push_back({{"file", e.file}, {"tokens", e.tokens},
                              {"crc32c", Crc32cHex(e.crc32c)}});
    }
    j["splits"][SplitName(s)] = js;
  }
  j["sources"] = json::object();
  for (const auto& [name, st] : m.sources) {
    j["sources"][name] = {{"train_docs", st.docs[0]}, {"val_docs", st.docs[1]},
                          {"train_bytes", st.bytes[0]}, {"val_bytes", st.bytes[1]}};
  }
  j["created"] = {{"unix_time", m.created_unix_time},
                  {"seconds", m.created_seconds},
                  {"threads", m.created_threads}};
  return WriteFileAtomic(dir + "/" + kManifestFile, j.dump(2) + "\n");
}

StatusOr<DatasetManifest> ReadDatasetManifest(const std::string& dir) {
  const std::string path = dir + "/" + kManifestFile;
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::NotFound(path + ": no dataset manifest (run `forge data prepare`)");
  std::stringstream ss;
  ss << in.rdbuf();
  json j = json::parse(ss.str(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) return Status::DataLoss(path + ": not valid JSON");
  DatasetManifest m;
  try {
    if (j.at("format").get<std::string>() != "forge-dataset") {
      return Status::DataLoss(path + ": format is not forge-dataset");
    }
    m.version = j.at("version").get<int>();
    if (m.version != 1) {
      return Status::DataLoss(path + ": unsupported version " + std::to_string(m.version));
    }
    m.tokenizer = j.at("tokenizer").get<std::string>();
    m.vocab_size = j.at("vocab_size").get<int32_t>();
    m.eot_token = j.at("eot_token").get<int32_t>();
    auto dtype = ParseTokenDtype(j.at("dtype").get<std::string>());
    if (!dtype.ok()) return dtype.status().Annotate(path);
    m.dtype = dtype.value();
    m.options_hash = j.value("options_hash", "");
    for (Split s : {Split::kTrain, Split::kVal}) {
      const json& js = j.at("splits").at(SplitName(s));
      SplitManifest& sm = m.splits[static_cast<int>(s)];
      sm.tokens = js.at("tokens").get<int64_t>();
      sm.docs = js.value("docs", int64_t{0});
      sm.text_bytes = js.value("text_bytes", int64_t{0});
      int64_t sum = 0;
      for (const json& e : js.at("shards")) {
        ShardEntry se;
        se.file = e.at("file").get<std::string>();
        se.tokens = e.at("tokens").get<int64_t>();
        auto crc = ParseHex32(e.at("crc32c").get<std::string>(), path + ": " + se.file);
        if (!crc.ok()) return crc.status();
        se.crc32c = crc.value();
        if (se.file.empty() || se.file.find('/') != std::string::npos || se.tokens < 0) {
          return Status::DataLoss(path + ": bad shard entry '" + se.file + "'");
        }
        sum += se.tokens;
        sm.shards.push_back(std::move(se));
      }
      if (sum != sm.tokens) {
        return Status::DataLoss(path + ": split " + SplitName(s) + " says " +
                                std::to_string(sm.tokens) + " tokens but its shards hold " +
                                std::to_string(sum));
      }
    }
    if (j.contains("sources")) {
      for (const auto& [name, v] : j["sources"].items()) {
        SourceStats st;
        st.docs[0] = v.value("train_docs", int64_t{0});
        st.docs[1] = v.value("val_docs", int64_t{0});
        st.bytes[0] = v.value("train_bytes", int64_t{0});
        st.bytes[1] = v.value("val_bytes", int64_t{0});
        m.sources[name] = st;
      }
    }
    if (j.contains("created")) {
      m.created_unix_time = j["created"].value("unix_time", int64_t{0});
      m.created_seconds = j["created"].value("seconds", 0.0);
      m.created_threads = j["created"].value("threads", 0);
    }
  } catch (const json::exception& e) {
    return Status::DataLoss(path + ": " + e.what());
  }
  return m;
}

uint32_t TokenStream::At(int64_t i) const {
  const auto it = std::upper_bound(starts_.begin(), starts_.end(), i);
  const size_t s = static_cast<size_t>(it - starts_.begin()) - 1;
  return shards_[s][static_cast<uint64_t>(i - starts_[s])];
}

Status TokenStream::Read(int64_t start, int64_t count, int32_t* out) const {
  if (start < 0 || count < 0 || start + count > total_) {
    return Status::Invalid("token range [" + std::to_string(start) + ", " +
                           std::to_string(start + count) + ") outside a stream of " +
                           std::to_string(total_) + " tokens");
  }
  auto it = std::upper_bound(starts_.begin(), starts_.end(), start);
  size_t s = static_cast<size_t>(it - starts_.begin()) - 1;
  while (count > 0) {
    const int64_t local = start - starts_[s];
    const int64_t n = std::min<int64_t>(count, static_cast<int64_t>(shards_[s].size()) - local);
    shards_[s].Copy(static_cast<uint64_t>(local), static_cast<uint64_t>(n), out);
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
  const std::string mpath = dir + "/" + kManifestFile;
  for (Split s : {Split::kTrain, Split::kVal}) {
    TokenStream& ts = ds.streams_[static_cast<int>(s)];
    for (const ShardEntry& e : ds.manifest_.splits[static_cast<int>(s)].shards) {
      const std::string path = dir + "/" + e.file;
      FORGE_ASSIGN_OR_RETURN(ShardReader r, ShardReader::Open(path));
      if (static_cast<int64_t>(r.size()) != e.tokens || r.crc32c() != e.crc32c ||
          r.dtype() != ds.manifest_.dtype) {
        return Status::DataLoss(path + ": does not match " + mpath + " (shard has " +
                                std::to_string(r.size()) + " " + TokenDtypeName(r.dtype()) +
                                " tokens, CRC32C " + Crc32cHex(r.crc32c()) + "; manifest says " +
                                std::to_string(e.tokens) + " " +
                                TokenDtypeName(ds.manifest_.dtype) + ", " +
                                Crc32cHex(e.crc32c) + ")");
      }
      if (r.size() == 0) continue;  // keeps starts_ strictly increasing
      ts.starts_.push_back(ts.total_);
      ts.total_ += static_cast<int64_t>(r.size());
      ts.shards_.push_back(std::move(r));
    }
  }
  return ds;
}

UnigramBaseline ComputeUnigramBaseline(const TokenDataset& ds) {
  UnigramBaseline u;
  const int64_t vocab = std::max<int64_t>(ds.manifest().vocab_size, 1);
  std::vector<int64_t> train_counts(static_cast<size_t>(vocab), 0);
  std::vector<int64_t> val_counts(static_cast<size_t>(vocab), 0);
  std::vector<int32_t> buf(1 << 16);
  auto count_into = [&](const TokenStream& ts, std::vector<int64_t>* counts) {
    for (int64_t start = 0; start < ts.size(); start += static_cast<int64_t>(buf.size())) {
      const int64_t n = std::min<int64_t>(static_cast<int64_t>(buf.size()), ts.size() - start);
      (void)ts.Read(start, n, buf.data());  // in range by construction
      for (int64_t i = 0; i < n; ++i) {
        const int32_t t = buf[static_cast<size_t>(i)];
        if (t >= 0 && t < vocab) ++(*counts)[static_cast<size_t>(t)];
      }
    }
  };
  count_into(ds.split(Split::kTrain), &train_counts);
  count_into(ds.split(Split::kVal), &val_counts);
  u.train_tokens = ds.split(Split::kTrain).size();
  u.val_tokens = ds.split(Split::kVal).size();

  const double denom = static_cast<double>(u.train_tokens + vocab);  // add-one smoothing
  double ce = 0, h = 0;
  for (int64_t t = 0; t < vocab; ++t) {
    const double c = static_cast<double>(train_counts[static_cast<size_t>(t)]);
    if (val_counts[static_cast<size_t>(t)] > 0) {
      ce -= static_cast<double>(val_counts[static_cast<size_t>(t)]) * std::log((c + 1) / denom);
    }
    if (c > 0) {
      const double p = c / static_cast<double>(u.train_tokens);
      h -= p * std::log(p);
    }
  }
  u.val_cross_entropy = u.val_tokens > 0 ? ce / static_cast<double>(u.val_tokens) : 0;
  u.train_entropy = h;
  return u;
}

}  // namespace forge
