// The PromQL of Forge's Grafana dashboard and alert rules, read from deploy/: for the test that
// checks every metric they name is exported, and for the Prometheus integration test that runs
// the panels' queries against a real run. Header-only.
#pragma once

#include <yaml-cpp/yaml.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace forge::test {

struct NamedQuery {
  std::string where;  // panel title / "template run_id" / alert name
  std::string expr;
};

inline void CollectPanelQueries(const nlohmann::json& panels, std::vector<NamedQuery>* out) {
  for (const auto& p : panels) {
    if (p.contains("panels")) CollectPanelQueries(p["panels"], out);  // collapsed rows
    if (!p.contains("targets")) continue;
    for (const auto& t : p["targets"])
      if (t.contains("expr")) out->push_back({p.value("title", "?"), t["expr"].get<std::string>()});
  }
}

// Panel targets, then template-variable queries.
inline std::vector<NamedQuery> DashboardQueries(const std::string& path) {
  std::ifstream in(path);
  const nlohmann::json d = nlohmann::json::parse(in);
  std::vector<NamedQuery> out;
  CollectPanelQueries(d.at("panels"), &out);
  for (const auto& v : d.at("templating").at("list")) {
    if (v.value("type", "") != "query") continue;
    const auto& q = v.at("query");
    out.push_back({"template " + v.value("name", "?"),
                   q.is_string() ? q.get<std::string>() : q.at("query").get<std::string>()});
  }
  return out;
}

inline std::vector<NamedQuery> AlertQueries(const std::string& path) {
  std::vector<NamedQuery> out;
  const YAML::Node doc = YAML::LoadFile(path);
  for (const auto& g : doc["groups"])
    for (const auto& r : g["rules"])
      out.push_back({r["alert"] ? r["alert"].as<std::string>() : r["record"].as<std::string>(),
                     r["expr"].as<std::string>()});
  return out;
}

// A dashboard expression as Prometheus can run it: Grafana's variables replaced.
inline std::string Instantiate(std::string expr, const std::string& run_id,
                               const std::string& rate_interval = "30s") {
  auto replace = [&](const std::string& from, const std::string& to) {
    for (size_t i = expr.find(from); i != std::string::npos; i = expr.find(from, i + to.size()))
      expr.replace(i, from.size(), to);
  };
  replace("$__rate_interval", rate_interval);
  replace("$run_id", run_id);
  return expr;
}

}  // namespace forge::test
