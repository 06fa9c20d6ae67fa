// A real Prometheus server on loopback scrapes a real CPU `forge train` run through the run's
// /metrics endpoint (metrics.port any: the port forge picks and logs, handed to Prometheus as a
// file_sd target; Prometheus's own port is the one it picks and logs): the test asks Prometheus's HTTP API for the throughput and
// the loss series, then runs every panel query of the Grafana dashboard against the same data
// and prints which returned series. Skipped with a message where the `prometheus` binary is not
// installed (Debian package prometheus).
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "../common/dashboard_queries.h"
#include "../common/http_get.h"
#include "../common/reported_port.h"
#include "child_process.h"
#include "counting_dataset.h"
#include "mpi_launch.h"

namespace forge {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;
using nlohmann::json;

// GET /api/v1/query; the "result" array (null JSON on any failure).
json Query(int port, const std::string& promql) {
  const test::HttpResponse r = test::HttpGet(port, "/api/v1/query?query=" + test::UrlEncode(promql));
  if (r.status != 200) return json();
  const json j = json::parse(r.body, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || j.value("status", "") != "success") return json();
  return j["data"]["result"];
}

// A range query's one series, its values scrape by scrape (empty unless exactly one series).
std::vector<double> SeriesValues(int port, const std::string& range_promql) {
  const json series = Query(port, range_promql);
  std::vector<double> values;
  if (!series.is_array() || series.size() != 1) return values;
  for (const auto& v : series[0]["values"]) values.push_back(std::stod(v[1].get<std::string>()));
  return values;
}

bool HaveProgram(const char* name) {
  return std::system(("command -v " + std::string(name) + " >/dev/null 2>&1").c_str()) == 0;
}

TEST(PrometheusScrape, RealServerScrapesACpuTrainingRun) {
  if (!HaveProgram("prometheus"))
    GTEST_SKIP() << "prometheus not found: install the Debian package prometheus "
                    "(--no-install-recommends) for the scrape test";
  const auto t_start = Clock::now();
  const std::string dir = ::testing::TempDir() + "/prom_scrape_" + std::to_string(::getpid());
  fs::remove_all(dir);
  fs::create_directories(dir);
  test::WriteCountingDataset(dir + "/data", 777u, 60000, 4000);

  const std::string name = "prom-it";
  // Long enough never to finish by itself: the test stops it once Prometheus has what it needs.
  // /metrics on a port forge picks and logs (metrics.port any).
  std::ofstream(dir + "/run.yaml") << "name: " << name << "\n"
      << "seed: 3\n"
         "model: {n_layer: 2, d_model: 64, n_head: 4, ffn: 128, vocab: 256, seq_len: 64}\n"
         "data: {dataset_dir: " << dir << "/data}\n"
         "optimizer: {lr: 0.001}\n"
         "schedule: {total_steps: 1000000, warmup_steps: 5, decay: constant}\n"
         "batch: {micro_batch: 8, global_batch: 16}\n"
         "eval: {every_steps: 200, batches: 2}\n"
         "train: {backend: cpu, log_every: 2, run_dir: " << dir << "/run}\n"
         "metrics: {port: any, bind_address: 127.0.0.1, peak_tflops: 0.01}\n";
  // The target comes from a file Prometheus watches, written once forge has logged its port.
  std::ofstream(dir + "/targets.json") << "[]\n";
  std::ofstream(dir + "/prometheus.yml")
      << "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
         "rule_files: [" << FORGE_SOURCE_DIR << "/deploy/prometheus/alerts.yml]\n"
         "scrape_configs:\n"
         "  - job_name: forge-workers\n"
         "    file_sd_configs: [{files: ['" << dir << "/targets.json']}]\n";

  // Prometheus on a port it picks and logs (--web.listen-address 127.0.0.1:0).
  test::Child prom, forge;
  test::Spawn(&prom, {"prometheus", "--config.file=" + dir + "/prometheus.yml",
                "--storage.tsdb.path=" + dir + "/tsdb", "--web.listen-address=127.0.0.1:0"},
        dir + "/prometheus.log");
  int prom_port = 0;
  const auto ready_deadline = Clock::now() + std::chrono::seconds(20);
  while (Clock::now() < ready_deadline) {
    ASSERT_TRUE(prom.Running()) << "prometheus ended:\n" << test::Tail(prom.log);
    if (prom_port == 0) prom_port = test::LoggedPrometheusPort(prom.log);
    if (prom_port > 0 && test::HttpGet(prom_port, "/-/ready").status == 200) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  ASSERT_GT(prom_port, 0) << "prometheus logged no port:\n" << test::Tail(prom.log);
  ASSERT_EQ(test::HttpGet(prom_port, "/-/ready").status, 200) << test::Tail(prom.log);
  test::Spawn(&forge, {test::Bin("forge"), "train", dir + "/run.yaml"},
        dir + "/forge.log", {"OPENBLAS_NUM_THREADS=1"});
  int metrics_port = 0;
  const auto port_deadline = Clock::now() + std::chrono::seconds(30);
  while ((metrics_port = test::LoggedMetricsPort(forge.log, 0)) == 0 &&
         Clock::now() < port_deadline) {
    ASSERT_TRUE(forge.Running()) << "forge train ended early:\n" << test::Tail(forge.log);
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ASSERT_GT(metrics_port, 0) << "forge logged no /metrics port:\n" << test::Tail(forge.log);
  std::ofstream(dir + "/targets.json.tmp") << "[{\"targets\": [\"127.0.0.1:" << metrics_port
                                           << "\"]}]\n";
  fs::rename(dir + "/targets.json.tmp", dir + "/targets.json");

  // Poll until Prometheus holds enough loss samples of the run (the first scrape of a new
  // target comes a few seconds after start-up). `forge train` runs it under its in-process
  // coordinator, so the series carry the coordinator's run id, "<name>-<6 hex>".
  std::string run_id, loss_sel;
  int samples = 0;
  const auto deadline = Clock::now() + std::chrono::seconds(45);
  while (Clock::now() < deadline) {
    if (run_id.empty()) {
      const json ids = Query(prom_port, "count by (run_id) (forge_loss)");
      if (ids.is_array() && ids.size() == 1) {
        run_id = ids[0]["metric"].value("run_id", "");
        loss_sel = "forge_loss{run_id=\"" + run_id + "\"}";
      }
    }
    ASSERT_TRUE(forge.Running()) << "forge train ended early:\n" << test::Tail(forge.log);
    ASSERT_TRUE(prom.Running()) << "prometheus ended:\n" << test::Tail(prom.log);
    const json r = run_id.empty() ? json()
                                  : Query(prom_port, "count_over_time(" + loss_sel + "[5m])");
    if (r.is_array() && !r.empty()) samples = std::stoi(r[0]["value"][1].get<std::string>());
    if (samples >= 10) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(250));
  }
  ASSERT_GE(samples, 10) << "prometheus log:\n" << test::Tail(prom.log) << "\nforge log:\n" << test::Tail(forge.log);
  EXPECT_EQ(run_id.rfind(name + "-", 0), 0u) << run_id;
  EXPECT_EQ(run_id.size(), name.size() + 7) << run_id;

  const json tps = Query(prom_port, "forge_tokens_per_second{run_id=\"" + run_id + "\"}");
  ASSERT_TRUE(tps.is_array() && tps.size() == 1) << tps.dump();
  const double tokens_per_s = std::stod(tps[0]["value"][1].get<std::string>());
  EXPECT_GT(tokens_per_s, 0.0);

  // The loss as Prometheus recorded it, scrape by scrape.
  const std::vector<double> loss = SeriesValues(prom_port, loss_sel + "[5m]");
  ASSERT_GE(loss.size(), 10u) << Query(prom_port, loss_sel + "[5m]").dump();
  std::printf("forge_loss over %zu scrapes: first %.4f, last %.4f; tokens/s %.0f\n", loss.size(),
              loss.front(), loss.back(), tokens_per_s);
  // The series is the run training: every scrape below the untrained model's loss (ln 256 =
  // 5.55 nats on 256 tokens) and their mean far below it. Where on the loss curve the scrapes
  // fall depends on the machine's speed (Prometheus's discovery hands a new target to the
  // scrapes about 5 s after the file names it, and this model reaches its plateau, ~0.5, in
  // a few hundred steps), so the test does not ask them to fall among themselves.
  const double untrained = std::log(256.0);
  double sum = 0;
  for (const double l : loss) {
    EXPECT_TRUE(std::isfinite(l) && l > 0.0 && l < untrained - 0.5) << l;
    sum += l;
  }
  EXPECT_LT(sum / double(loss.size()), untrained - 2.0);
  // And the scrapes are live: the step gauge rises across them.
  const std::string step_sel = "forge_step{run_id=\"" + run_id + "\"}[5m]";
  const std::vector<double> step = SeriesValues(prom_port, step_sel);
  ASSERT_GE(step.size(), 10u) << Query(prom_port, step_sel).dump();
  for (size_t i = 1; i < step.size(); ++i) EXPECT_GE(step[i], step[i - 1]) << "scrape " << i;
  EXPECT_GT(step.back(), step.front());

  // Prometheus loaded the shipped alert rules.
  const test::HttpResponse rules = test::HttpGet(prom_port, "/api/v1/rules");
  EXPECT_NE(rules.body.find("ForgeRunStalled"), std::string::npos) << rules.body.substr(0, 500);

  // Every dashboard query against this run.
  std::set<std::string> panels_with_data, panels_without;
  std::printf("%-30s %7s  %s\n", "panel", "series", "query");
  for (const auto& q : test::DashboardQueries(std::string(FORGE_SOURCE_DIR) +
                                              "/deploy/grafana/dashboards/forge-training.json")) {
    std::string expr = test::Instantiate(q.expr, run_id);
    // Grafana's label_values(metric, label) as the PromQL it stands for.
    if (expr.rfind("label_values(", 0) == 0) {
      const size_t comma = expr.find(',');
      std::string label = expr.substr(comma + 1, expr.size() - comma - 2);
      label.erase(0, label.find_first_not_of(' '));
      expr = "count by (" + label + ") (" + expr.substr(13, comma - 13) + ")";
    }
    const json r = Query(prom_port, expr);
    EXPECT_TRUE(r.is_array()) << q.where << ": query failed: " << expr;
    const size_t n = r.is_array() ? r.size() : 0;
    std::printf("%-30s %7zu  %s\n", q.where.c_str(), n, expr.c_str());
    (n > 0 ? panels_with_data : panels_without).insert(q.where);
  }
  for (const auto& p : panels_with_data) panels_without.erase(p);
  std::string with, without;
  for (const auto& p : panels_with_data) with += (with.empty() ? "" : ", ") + p;
  for (const auto& p : panels_without) without += (without.empty() ? "" : ", ") + p;
  std::printf("panels with data: %s\npanels without data: %s\n", with.c_str(), without.c_str());
  // What a CPU run must show (GPU health needs NVML; the coordinator series a coordinator).
  for (const char* p : {"Step", "Run state", "Workers up", "Steps since last checkpoint",
                        "Throughput", "MFU", "Loss", "Learning rate", "Gradient norm",
                        "Step time (heatmap)", "Per-rank step time", "Comm vs compute", "Memory",
                        "Checkpoints", "template run_id"})
    EXPECT_TRUE(panels_with_data.count(p)) << p << " had no data";

  // SIGTERM: forge saves a checkpoint at the next step boundary and exits 0.
  EXPECT_EQ(forge.Stop(30), 0) << test::Tail(forge.log);
  EXPECT_GE(prom.Stop(10), 0);
  const double seconds = std::chrono::duration<double>(Clock::now() - t_start).count();
  std::printf("scrape test took %.1f s\n", seconds);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace forge
