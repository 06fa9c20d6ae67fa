// The Grafana dashboard (deploy/grafana/) and the alert rules (deploy/prometheus/) may only
// name metrics, and labels of those metrics, that the code exports: every PromQL expression is
// checked against MetricCatalog(), the table the exporters register from.
#include <gtest/gtest.h>

#include <cctype>
#include <set>
#include <string>
#include <vector>

#include "../common/dashboard_queries.h"
#include "metrics/metric_catalog.h"

namespace forge {
namespace {

const std::string kSource = FORGE_SOURCE_DIR;

bool IsIdentStart(char c) { return std::isalpha(static_cast<unsigned char>(c)) || c == '_' || c == ':'; }
bool IsIdent(char c) { return IsIdentStart(c) || std::isdigit(static_cast<unsigned char>(c)); }

bool LabelOf(const MetricInfo& m, const std::string& label) {
  for (auto l : m.labels)
    if (l == label) return true;
  return label == "job" || label == "instance" || (label == "le" && m.type == MetricType::kHistogram);
}

// Problems with one expression: unknown forge_ metrics, label matchers a metric does not have,
// grouping labels (by/on/without/ignoring) that none of its metrics has.
std::vector<std::string> CheckExpr(const std::string& e) {
  std::vector<std::string> problems;
  std::vector<const MetricInfo*> used;
  std::vector<std::string> grouping;
  const size_t n = e.size();
  auto skip_space = [&](size_t i) {
    while (i < n && std::isspace(static_cast<unsigned char>(e[i]))) ++i;
    return i;
  };
  auto skip_string = [&](size_t i) {  // i at the opening quote; returns past the closing one
    const char q = e[i++];
    while (i < n && e[i] != q) i += e[i] == '\\' ? 2 : 1;
    return i + 1;
  };
  for (size_t i = 0; i < n;) {
    if (e[i] == '"' || e[i] == '\'' || e[i] == '`') {
      i = skip_string(i);
      continue;
    }
    if (e[i] == '[') {  // a range or subquery duration
      while (i < n && e[i] != ']') ++i;
      continue;
    }
    if (!IsIdentStart(e[i]) || (i > 0 && (IsIdent(e[i - 1]) || e[i - 1] == '.'))) {
      ++i;
      continue;
    }
    size_t j = i;
    while (j < n && IsIdent(e[j])) ++j;
    const std::string word = e.substr(i, j - i);
    size_t k = skip_space(j);
    if (word == "by" || word == "on" || word == "without" || word == "ignoring" ||
        word == "group_left" || word == "group_right") {
      if (k < n && e[k] == '(') {
        const size_t close = e.find(')', k);
        std::string list = e.substr(k + 1, close - k - 1), label;
        for (char c : list + ",") {
          if (c == ',') {
            if (!label.empty()) grouping.push_back(label);
            label.clear();
          } else if (!std::isspace(static_cast<unsigned char>(c))) {
            label += c;
          }
        }
        i = close + 1;
        continue;
      }
    }
    if (word.rfind("forge_", 0) == 0) {
      const MetricInfo* m = FindSeries(word);
      if (m == nullptr) {
        problems.push_back("unknown metric " + word);
      } else {
        used.push_back(m);
        if (k < n && e[k] == '{') {  // label matchers
          size_t p = k + 1;
          while (p < n && e[p] != '}') {
            p = skip_space(p);
            size_t q = p;
            while (q < n && IsIdent(e[q])) ++q;
            const std::string label = e.substr(p, q - p);
            if (!label.empty() && !LabelOf(*m, label))
              problems.push_back(word + " has no label " + label);
            while (q < n && e[q] != '"' && e[q] != '}') ++q;
            if (q < n && e[q] == '"') q = skip_string(q);
            q = skip_space(q);
            if (q < n && e[q] == ',') ++q;
            p = q;
          }
          j = p + 1;
        }
      }
    }
    i = j;
  }
  for (const std::string& g : grouping) {
    bool known = used.empty();  // nothing to check against (e.g. only `up`)
    for (const MetricInfo* m : used) known = known || LabelOf(*m, g);
    if (g == "job" || g == "instance") known = true;
    if (!known) problems.push_back("grouping label " + g + " is on none of its metrics");
  }
  return problems;
}

void ExpectClean(const std::vector<test::NamedQuery>& queries) {
  for (const auto& q : queries) {
    for (const std::string& p : CheckExpr(q.expr)) ADD_FAILURE() << q.where << ": " << p << "\n  " << q.expr;
  }
}

TEST(MetricCatalog, NamesFollowPrometheusConventions) {
  std::set<std::string_view> seen;
  for (const MetricInfo& m : MetricCatalog()) {
    EXPECT_TRUE(seen.insert(m.name).second) << "duplicate " << m.name;
    EXPECT_EQ(m.name.rfind("forge_", 0), 0u) << m.name;
    const bool total = m.name.size() > 6 && m.name.substr(m.name.size() - 6) == "_total";
    EXPECT_EQ(total, m.type == MetricType::kCounter) << m.name;
    ASSERT_FALSE(m.labels.empty()) << m.name;
    EXPECT_EQ(m.labels[0], "run_id") << m.name;
    EXPECT_FALSE(m.help.empty()) << m.name;
  }
  // DESIGN.md's metric set.
  for (const char* name : {"forge_tokens_per_second", "forge_mfu_ratio", "forge_step_seconds",
                           "forge_loss", "forge_grad_norm", "forge_learning_rate",
                           "forge_gpu_memory_bytes", "forge_comm_seconds_total",
                           "forge_data_wait_seconds_total", "forge_checkpoint_seconds",
                           "forge_checkpoint_bytes", "forge_skipped_steps_total",
                           "forge_worker_up", "forge_run_state"})
    EXPECT_NE(FindMetric(name), nullptr) << name;
  EXPECT_EQ(FindSeries("forge_step_seconds_bucket"), FindMetric("forge_step_seconds"));
  EXPECT_EQ(FindSeries("forge_loss_sum"), nullptr);  // not a histogram
}

TEST(DashboardQueries, CheckerCatchesWhatItShould) {
  EXPECT_TRUE(CheckExpr(R"(sum by (le) (rate(forge_step_seconds_bucket{run_id=~"a"}[5m])))").empty());
  EXPECT_TRUE(CheckExpr(R"(up{job=~"forge_.*"} == 0 or forge_worker_up == 0)").empty());
  EXPECT_EQ(CheckExpr("rate(forge_bogus_total[5m])").size(), 1u);
  EXPECT_EQ(CheckExpr(R"(forge_loss{kind="peak"})").size(), 1u);
  EXPECT_EQ(CheckExpr(R"(forge_gpu_memory_bytes{run_id="a", kind="peak"})").size(), 0u);
  EXPECT_EQ(CheckExpr("sum by (op) (forge_loss)").size(), 1u);
  EXPECT_EQ(CheckExpr("forge_loss_bucket").size(), 1u);
}

TEST(DashboardQueries, DashboardNamesOnlyExportedMetrics) {
  const auto queries = test::DashboardQueries(kSource + "/deploy/grafana/dashboards/forge-training.json");
  ASSERT_GE(queries.size(), 25u);
  ExpectClean(queries);
  for (const auto& q : queries) {
    if (q.where.rfind("template", 0) == 0) continue;
    EXPECT_NE(q.expr.find("$run_id"), std::string::npos) << q.where << ": not templated on run_id";
  }
}

TEST(DashboardQueries, DashboardHasThePanelsAskedFor) {
  std::set<std::string> titles;
  for (const auto& q : test::DashboardQueries(kSource + "/deploy/grafana/dashboards/forge-training.json"))
    titles.insert(q.where);
  for (const char* t : {"Throughput", "MFU", "Loss", "Learning rate", "Step time (heatmap)",
                        "Per-rank step time", "Memory", "Comm vs compute", "Checkpoints",
                        "Stragglers", "Loss spikes",
                        "GPU utilisation", "GPU temperature", "Throttle reasons", "template run_id"})
    EXPECT_TRUE(titles.count(t)) << t;
}

TEST(DashboardQueries, AlertRulesNameOnlyExportedMetrics) {
  const auto rules = test::AlertQueries(kSource + "/deploy/prometheus/alerts.yml");
  std::set<std::string> names;
  for (const auto& r : rules) names.insert(r.where);
  EXPECT_EQ(names, (std::set<std::string>{"ForgeWorkerDown", "ForgeRunStalled", "ForgeMfuDrop",
                                          "ForgeNonFiniteLoss", "ForgeStepsSkipped",
                                          "ForgeCheckpointOverdue", "ForgeGpuThrottling",
                                          "ForgeRunHung", "ForgeSpikeRollback",
                                          "ForgeStraggler"}));
  ExpectClean(rules);
}

}  // namespace
}  // namespace forge
