// /metrics of `forge train` launched alone (the in-process coordinator path, cli/local_launch.h):
// every rank (the in-process worker of a one-worker run, the forge-workers of a multi-GPU one)
// labels its series with the coordinator's run id, never with the config's name, and computes
// its per-rank share with the run's world size. The CPU test runs on any machine (one worker); the two-GPU test runs
// where two GPUs are visible and checks the ranks agree on run_id, split the throughput and
// report distinct GPUs.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>

#include "../common/http_get.h"
#include "../common/reported_port.h"
#include "../unit/metrics_test_util.h"
#include "child_process.h"
#include "control_plane_harness.h"  // WaitFor
#include "counting_dataset.h"
#include "mpi_launch.h"
#include "../common/run_command.h"

namespace forge::test {
namespace {

namespace fs = std::filesystem;

std::string Run(const std::string& cmd) {
  return test::RunCommand(cmd, "", test::Stderr::kInherited).out;
}

std::string FirstLine(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

// The one run of the local coordinator and its worker count, from `forgectl list`.
std::pair<std::string, int> LocalRun(const std::string& run_dir) {
  const std::string out =
      Run(test::Bin("forgectl") + " --coordinator " +
          FirstLine(run_dir + "/coordinator/address") + " --token-file " + run_dir +
          "/coordinator/token list 2>&1");
  std::istringstream in(out);
  std::string id;
  in >> id;
  const size_t w = out.find("workers ");
  return {id, w == std::string::npos ? 0 : std::atoi(out.c_str() + w + 8)};
}

// Every distinct value of `label` over the forge_ series of a /metrics body.
std::set<std::string> LabelValues(const std::string& body, const std::string& label) {
  std::set<std::string> out;
  std::istringstream in(body);
  std::string line;
  const std::string key = label + "=\"";
  while (std::getline(in, line)) {
    if (line.rfind("forge_", 0) != 0) continue;
    const size_t at = line.find(key);
    if (at == std::string::npos) continue;
    const size_t b = at + key.size();
    out.insert(line.substr(b, line.find('"', b) - b));
  }
  return out;
}

std::string Scrape(int port) {
  const HttpResponse r = HttpGet(port, "/metrics");
  return r.status == 200 ? r.body : "";
}

// A run config that trains until stopped, every rank's /metrics on a port it picks and logs
// (metrics.port any); `extra` is appended.
std::string WriteConfig(const std::string& dir, const std::string& name,
                        const std::string& backend, const std::string& extra = "") {
  WriteCountingDataset(dir + "/data", 313u, 40000, 4000);
  const std::string path = dir + "/run.yaml";
  std::ofstream(path) << "name: " << name << "\n"
      << "seed: 5\n"
         "model: {n_layer: 2, d_model: 64, n_head: 4, ffn: 128, vocab: 256, seq_len: 64}\n"
         "data: {dataset_dir: " << dir << "/data}\n"
         "schedule: {total_steps: 1000000, warmup_steps: 2, decay: constant}\n"
         "batch: {micro_batch: 4, global_batch: 8}\n"
         "eval: {every_steps: 0, batches: 2}\n"
         "train: {backend: " << backend << ", log_every: 1, run_dir: " << dir << "/run}\n"
         "metrics: {port: any, bind_address: 127.0.0.1, peak_tflops: 0.01}\n"
      << extra;
  return path;
}

TEST(LocalLaunchMetrics, RankZeroUsesTheCoordinatorsRunId) {
  const std::string dir = ::testing::TempDir() + "/local_metrics_" + std::to_string(::getpid());
  fs::remove_all(dir);
  fs::create_directories(dir);
  const std::string config = WriteConfig(dir, "localm", "cpu");
  Child forge;
  Spawn(&forge, {test::Bin("forge"), "train", config},
        dir + "/forge.log", {"OPENBLAS_NUM_THREADS=1"});

  std::string body;
  int port = 0;
  ASSERT_TRUE(WaitFor(40, [&] {
    if (port == 0) port = LoggedMetricsPort(forge.log, 0);
    body = port == 0 ? "" : Scrape(port);
    return SeriesValue(body, "forge_tokens_per_second").has_value() || !forge.Running();
  }) && forge.Running()) << body << "\n" << Tail(forge.log);

  const auto [run_id, workers] = LocalRun(dir + "/run");
  ASSERT_EQ(run_id.rfind("localm-", 0), 0u) << "coordinator run id " << run_id;
  EXPECT_EQ(workers, 1);  // the CPU: one worker
  // Every series of the process carries the coordinator's id (Grafana's run_id template and
  // the coordinator's run aggregates key on it), none the config's bare name.
  EXPECT_EQ(LabelValues(body, "run_id"), std::set<std::string>{run_id}) << body;
  EXPECT_EQ(LabelValues(body, "rank"), std::set<std::string>{"0"});
  const std::map<std::string, std::string> l{{"run_id", run_id}, {"rank", "0"}};
  EXPECT_EQ(SeriesValue(body, "forge_worker_up", l), 1.0) << body;
  EXPECT_GT(SeriesValue(body, "forge_tokens_per_second", l).value_or(0), 0.0) << body;
  EXPECT_GT(SeriesValue(body, "forge_mfu_ratio", l).value_or(0), 0.0) << body;

  EXPECT_EQ(forge.Stop(30), 0) << Tail(forge.log);
  fs::remove_all(dir);
}

int VisibleGpus() {
  if (Run(test::Bin("forge") + " has-gpu 2>/dev/null") != "yes\n") return 0;
  const std::string list = Run("nvidia-smi -L 2>/dev/null");
  int n = 0;
  for (size_t at = list.find("GPU "); at != std::string::npos; at = list.find("GPU ", at + 1)) ++n;
  return n;
}

// Two GPUs: a forge-worker on each, under `forge`, each rank on the port it logged.
TEST(LocalLaunchMetrics, TwoGpuRanksAgreeOnRunIdAndSplitThroughput) {
  if (VisibleGpus() < 2) GTEST_SKIP() << "needs two visible GPUs";
  const std::string dir = ::testing::TempDir() + "/local_metrics2_" + std::to_string(::getpid());
  fs::remove_all(dir);
  fs::create_directories(dir);
  const std::string config = WriteConfig(dir, "localg", "cuda");
  Child forge;
  Spawn(&forge, {test::Bin("forge"), "train", config},
        dir + "/forge.log", {"CUDA_VISIBLE_DEVICES=0,1"});

  std::string body[2];
  int port[2] = {0, 0};
  ASSERT_TRUE(WaitFor(90, [&] {
    for (int r = 0; r < 2; ++r) {
      if (port[r] == 0) port[r] = LoggedMetricsPort(forge.log, r);
      body[r] = port[r] == 0 ? "" : Scrape(port[r]);
    }
    return (SeriesValue(body[0], "forge_tokens_per_second").has_value() &&
            SeriesValue(body[1], "forge_tokens_per_second").has_value()) ||
           !forge.Running();
  }) && forge.Running()) << body[0] << "\n" << body[1] << "\n" << Tail(forge.log);

  const auto [run_id, workers] = LocalRun(dir + "/run");
  ASSERT_EQ(workers, 2) << Tail(forge.log);
  double tps[2], mfu[2];
  std::set<std::string> gpus;
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(LabelValues(body[r], "run_id"), std::set<std::string>{run_id}) << "rank " << r;
    const std::map<std::string, std::string> l{{"run_id", run_id}, {"rank", std::to_string(r)}};
    tps[r] = SeriesValue(body[r], "forge_tokens_per_second", l).value_or(0);
    mfu[r] = SeriesValue(body[r], "forge_mfu_ratio", l).value_or(0);
    ASSERT_GT(tps[r], 0.0) << body[r];
    // GPU health: one GPU per rank (its own), none claimed twice.
    const auto g = LabelValues(body[r], "gpu");
    EXPECT_EQ(g.size(), 1u) << "rank " << r << "\n" << body[r];
    gpus.insert(g.begin(), g.end());
  }
  EXPECT_EQ(gpus.size(), 2u);
  // Both are shares of the same global rate (records of neighbouring steps may differ), and
  // MFU is each rank's share over one GPU's peak: the same ratio to tokens/s on both.
  EXPECT_LT(tps[0], 2.0 * tps[1]);
  EXPECT_LT(tps[1], 2.0 * tps[0]);
  EXPECT_NEAR(mfu[0] / tps[0], mfu[1] / tps[1], 1e-9 * mfu[0] / tps[0]);
  // The global rate rank 0 logs is about the sum of the two shares.
  std::ifstream jsonl(dir + "/run/metrics.jsonl");
  std::string line, last;
  while (std::getline(jsonl, line))
    if (line.find("\"tokens_per_s\"") != std::string::npos) last = line;
  const size_t at = last.find("\"tokens_per_s\":");
  ASSERT_NE(at, std::string::npos);
  const double global = std::atof(last.c_str() + at + 15);
  EXPECT_GT(tps[0] + tps[1], 0.5 * global) << global;
  EXPECT_LT(tps[0] + tps[1], 1.5 * global) << global;

  EXPECT_EQ(forge.Stop(60), 0) << Tail(forge.log);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace forge::test
