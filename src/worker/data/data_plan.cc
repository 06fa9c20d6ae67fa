// Data plans and consumption records (data_plan.h).
#include "worker/data/data_plan.h"

#include <algorithm>

#include <nlohmann/json.hpp>

namespace forge {

using json = nlohmann::json;

bool operator==(const DataPlanSource& a, const DataPlanSource& b) {
  return a.dir == b.dir && a.weight == b.weight && a.stream == b.stream && a.base == b.base;
}

bool operator==(const DataPlan& a, const DataPlan& b) {
  return a.origin == b.origin && a.sources == b.sources;
}

DataPlan PlanOf(const DataUsage& usage) {
  DataPlan p;
  p.origin = usage.origin;
  for (const SourceUsage& s : usage.sources) p.sources.push_back(s.source);
  return p;
}

std::string EncodeDataUsage(const DataUsage& u) {
  json sources = json::array();
  for (const SourceUsage& s : u.sources) {
    sources.push_back({{"dir", s.source.dir},
                       {"weight", s.source.weight},
                       {"stream", s.source.stream},
                       {"base", s.source.base},
                       {"sequences", s.sequences},
                       {"tokens", s.tokens},
                       {"epoch", s.epoch},
                       {"epoch_sequences", s.epoch_sequences}});
  }
  return json{{"cursor", u.cursor}, {"origin", u.origin}, {"sources", sources}}.dump();
}

StatusOr<DataUsage> DecodeDataUsage(const std::string& text, const std::string& source) {
  DataUsage u;
  try {
    const json j = json::parse(text);
    u.cursor = j.at("cursor").get<int64_t>();
    u.origin = j.at("origin").get<int64_t>();
    for (const json& js : j.at("sources")) {
      SourceUsage s;
      s.source.dir = js.at("dir").get<std::string>();
      s.source.weight = js.at("weight").get<double>();
      s.source.stream = js.at("stream").get<int64_t>();
      s.source.base = js.at("base").get<int64_t>();
      s.sequences = js.at("sequences").get<int64_t>();
      s.tokens = js.at("tokens").get<int64_t>();
      s.epoch = js.at("epoch").get<int64_t>();
      s.epoch_sequences = js.at("epoch_sequences").get<int64_t>();
      u.sources.push_back(std::move(s));
    }
  } catch (const json::exception& e) {
    return Status::DataLoss(source + ": malformed data record: " + e.what());
  }
  if (u.sources.empty()) return Status::DataLoss(source + ": data record lists no source");
  if (u.origin < 0 || u.cursor < u.origin)
    return Status::DataLoss(source + ": data record has origin " + std::to_string(u.origin) +
                            " after its cursor " + std::to_string(u.cursor));
  return u;
}

StatusOr<DataPlan> PlanForResume(const std::vector<DataSourceConfig>& sources,
                                 const DataUsage* saved, int64_t cursor,
                                 std::vector<std::string>* notes) {
  DataPlan plan;
  if (saved == nullptr) {
    for (size_t s = 0; s < sources.size(); ++s)
      plan.sources.push_back({sources[s].dir, sources[s].weight, int64_t(s), 0});
    return plan;
  }
  if (saved->cursor != cursor)
    return Status::Invalid("data record taken at global cursor " + std::to_string(saved->cursor) +
                           ", resuming at " + std::to_string(cursor));
  bool same = saved->sources.size() == sources.size();
  for (size_t s = 0; same && s < sources.size(); ++s)
    same = saved->sources[s].source.dir == sources[s].dir &&
           saved->sources[s].source.weight == sources[s].weight;
  if (same) return PlanOf(*saved);

  plan.origin = cursor;
  int64_t next_stream = 0;
  for (const SourceUsage& u : saved->sources) next_stream = std::max(next_stream, u.source.stream + 1);
  std::string kept, added;
  for (const DataSourceConfig& c : sources) {
    DataPlanSource p{c.dir, c.weight, -1, 0};
    for (const SourceUsage& u : saved->sources) {
      if (u.source.dir != c.dir) continue;
      p.stream = u.source.stream;
      p.base = u.sequences;
    }
    if (p.stream < 0) {
      p.stream = next_stream++;
      added += (added.empty() ? "" : ", ") + c.dir;
    } else {
      kept += (kept.empty() ? "" : ", ") + c.dir + " at sequence " + std::to_string(p.base);
    }
    plan.sources.push_back(std::move(p));
  }
  if (notes) {
    notes->push_back("data.sources differ from the checkpoint's: the new weights apportion the "
                     "stream from global sequence " + std::to_string(cursor) +
                     (kept.empty() ? "" : "; continuing " + kept) +
                     (added.empty() ? "" : "; new: " + added));
  }
  return plan;
}

std::vector<DataSourceConfig> PlanSources(const DataPlan& plan) {
  std::vector<DataSourceConfig> out;
  for (const DataPlanSource& s : plan.sources) out.push_back({s.dir, s.weight});
  return out;
}

}  // namespace forge
