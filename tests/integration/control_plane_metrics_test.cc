// /metrics of a run under the coordinator: forge-coordinator --metrics-port serves the run-level
// aggregates it folds from the heartbeats, and each forge-worker serves its own series on the
// run config's metrics.port (here `any`: a port each rank picks and logs), both scraped over
// HTTP during a real CPU run (two ranks under mpirun) and after it ends.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>

#include "../common/http_get.h"
#include "../unit/metrics_test_util.h"
#include "common/config.h"
#include "control_plane_harness.h"
#include "worker/model/param_layout.h"

namespace forge::test {
namespace {

std::string Scrape(int port) {
  HttpResponse r = HttpGet(port, "/metrics");
  return r.status == 200 ? r.body : "";
}

TEST(ControlPlaneMetrics, CoordinatorAndWorkersServeRunSeriesDuringARun) {
  ControlPlane cp("metrics");
  cp.StartCoordinatorServingMetrics(2000);
  const int coord_port = cp.metrics_port();
  ASSERT_GT(coord_port, 0);
  // Each rank serves on a port it picks and logs (metrics.port any). A peak makes MFU known on
  // the CPU (no device table entry there).
  const std::string spec = cp.WriteSpec(
      "metrics", 40, 1000, "metrics: {port: any, bind_address: 127.0.0.1, peak_tflops: 0.001}\n");
  const std::string workers_log = cp.StartWorkers(2, 120).log;
  const ShellResult sub = cp.Ctl("submit " + spec);
  ASSERT_EQ(sub.exit_code, 0) << sub.output;
  const std::string run = ControlPlane::RunId(sub);
  ASSERT_FALSE(run.empty()) << sub.output;
  const std::map<std::string, std::string> of_run{{"run_id", run}};

  // Both ranks have reported a few steps: the aggregates cover the two of them.
  std::string coord;
  ASSERT_TRUE(WaitFor(25, [&] {
    coord = Scrape(coord_port);
    auto n = SeriesValue(coord, "forge_run_ranks_reporting", of_run);
    auto step = SeriesValue(coord, "forge_run_step", of_run);
    return n && *n == 2 && step && *step >= 3;
  })) << "coordinator /metrics:\n" << coord << "\n" << ReadFile(cp.dir() + "/workers.0.log");

  auto total = SeriesValue(coord, "forge_run_tokens_per_second", of_run);
  auto mfu = SeriesValue(coord, "forge_run_mfu_ratio", of_run);
  auto slowest = SeriesValue(coord, "forge_run_slowest_step_seconds", of_run);
  auto slowest_rank = SeriesValue(coord, "forge_run_slowest_rank", of_run);
  ASSERT_TRUE(total && mfu && slowest && slowest_rank) << coord;
  EXPECT_GT(*total, 0.0);
  EXPECT_TRUE(std::isfinite(*mfu) && *mfu > 0.0) << *mfu;
  // A step of this model takes milliseconds (--throttle-ms sleeps outside the step's time).
  EXPECT_GT(*slowest, 0.0);
  EXPECT_LT(*slowest, 5.0);
  EXPECT_TRUE(*slowest_rank == 0 || *slowest_rank == 1) << *slowest_rank;
  for (const char* rank : {"0", "1"})
    EXPECT_EQ(SeriesValue(coord, "forge_worker_up", {{"run_id", run}, {"rank", rank}}), 1.0)
        << "rank " << rank << "\n" << coord;
  EXPECT_EQ(SeriesValue(coord, "forge_run_state", {{"run_id", run}, {"state", "running"}}), 1.0);
  EXPECT_EQ(SeriesValue(coord, "forge_run_state", {{"run_id", run}, {"state", "pending"}}), 0.0);

  // Each rank's own endpoint, labelled with the coordinator's run id.
  int worker_port[2] = {0, 0};
  for (int rank = 0; rank < 2; ++rank)
    ASSERT_TRUE(WaitFor(10, [&] {
      return (worker_port[rank] = LoggedMetricsPort(workers_log, rank)) > 0;
    })) << "rank " << rank << " logged no /metrics port:\n" << ReadFile(workers_log);
  for (int rank = 0; rank < 2; ++rank) {
    const std::map<std::string, std::string> l{{"run_id", run}, {"rank", std::to_string(rank)}};
    std::string body;
    ASSERT_TRUE(WaitFor(10, [&] {
      body = Scrape(worker_port[rank]);
      return SeriesValue(body, "forge_tokens_per_second", l).has_value();
    })) << "rank " << rank << " /metrics on " << worker_port[rank] << ":\n" << body;
    EXPECT_GT(SeriesValue(body, "forge_tokens_per_second", l).value_or(0), 0.0) << body;
    EXPECT_GE(SeriesValue(body, "forge_step", l).value_or(0), 1.0) << body;
    EXPECT_GT(SeriesValue(body, "forge_mfu_ratio", l).value_or(0), 0.0) << body;
    EXPECT_EQ(SeriesValue(body, "forge_worker_up", l), 1.0) << body;
  }
  // The ranks' shares of the throughput add up to about the run total. Each gauge holds the
  // latest step it saw, so one scrape may pair records of different steps, whose times vary
  // several-fold on a loaded 2-core machine: compare fresh scrapes until one pairing agrees
  // (a total that sums the ranks wrongly never does).
  double worker_sum = 0.0, run_total = *total;
  EXPECT_TRUE(WaitFor(10, [&] {
    worker_sum = 0.0;
    for (int rank = 0; rank < 2; ++rank) {
      worker_sum += SeriesValue(Scrape(worker_port[rank]), "forge_tokens_per_second",
                                {{"run_id", run}, {"rank", std::to_string(rank)}})
                        .value_or(0.0);
    }
    run_total = SeriesValue(Scrape(coord_port), "forge_run_tokens_per_second", of_run)
                    .value_or(0.0);
    return worker_sum > run_total / 3 && worker_sum < run_total * 3;
  })) << "ranks' sum " << worker_sum << " vs run total " << run_total;

  // Ended: the state says so and the per-rank series are gone (a 0 would read as worker down).
  ASSERT_TRUE(WaitFor(40, [&] { return cp.StatusField(run, "state") == "COMPLETED"; }))
      << cp.Ctl("status " + run).output;
  coord = Scrape(coord_port);
  EXPECT_EQ(SeriesValue(coord, "forge_run_state", {{"run_id", run}, {"state", "completed"}}), 1.0)
      << coord;
  EXPECT_EQ(SeriesValue(coord, "forge_run_state", {{"run_id", run}, {"state", "running"}}), 0.0);
  EXPECT_FALSE(SeriesValue(coord, "forge_worker_up", of_run).has_value()) << coord;
}

// The run's MFU uses the peak of the GPU the worker reports, not a fixed H100's: a worker
// whose NVML (the stand-in library, naming an A100) reports an A100 gets MFU against 312
// TFLOP/s. The worker trains on the CPU here (no CUDA); only its reported device matters.
TEST(ControlPlaneMetrics, RunMfuUsesThePeakOfTheDeviceTheWorkerReports) {
  ControlPlane cp("mfu_device");
  cp.StartCoordinatorServingMetrics(3000);
  const int coord_port = cp.metrics_port();
  ASSERT_GT(coord_port, 0);
  std::string text = ReadFile(cp.WriteSpec("mfu", 400, 1000));
  text.replace(text.find("backend: cpu"), 12, "backend: auto");
  text.replace(text.find("workers: 2"), 10, "workers: 1");
  const std::string spec = cp.dir() + "/mfu_auto.yaml";
  std::ofstream(spec) << text;

  // NVML for the worker: the stand-in under the driver's file name.
  const std::string nvml_dir = cp.dir() + "/nvml";
  std::filesystem::create_directories(nvml_dir);
  std::filesystem::create_symlink(FORGE_FAKE_NVML, nvml_dir + "/libnvidia-ml.so.1");
  Process worker = Spawn("env -u CUDA_VISIBLE_DEVICES LD_LIBRARY_PATH=" + nvml_dir +
                             " FORGE_FAKE_NVML_NAME='NVIDIA A100-SXM4-80GB'"
                             " OPENBLAS_NUM_THREADS=1 timeout 120 " + Bin("forge-worker") +
                             " --coordinator " + cp.address() + " --join-secret-file " +
                             cp.dir() + "/secret --device cuda:0 --throttle-ms 20",
                         cp.dir() + "/worker.log");
  const ShellResult sub = cp.Ctl("submit " + spec);
  ASSERT_EQ(sub.exit_code, 0) << sub.output;
  const std::string run = ControlPlane::RunId(sub);
  const std::map<std::string, std::string> of_run{{"run_id", run}};

  auto cfg = ParseRunConfig(text, "mfu");
  ASSERT_TRUE(cfg.ok()) << cfg.status().ToString();
  const double flops_per_token = TrainFlopsPerToken(cfg->model);
  std::string coord;
  ASSERT_TRUE(WaitFor(40, [&] {
    coord = Scrape(coord_port);
    return SeriesValue(coord, "forge_run_mfu_ratio", of_run).has_value() &&
           SeriesValue(coord, "forge_run_step", of_run).value_or(0) >= 3;
  })) << coord << "\n" << ReadFile(cp.dir() + "/worker.log");
  const double mfu = *SeriesValue(coord, "forge_run_mfu_ratio", of_run);
  const double tokens = *SeriesValue(coord, "forge_run_tokens_per_second", of_run);
  ASSERT_GT(tokens, 0.0);
  // The peak the coordinator divided by, recovered from its own numbers: an A100's.
  EXPECT_NEAR(tokens * flops_per_token / mfu / 1e12, 312.0, 312.0 * 1e-6) << coord;
  // The stored step records (GetRun's last_metrics, both numbers from one answer) agree.
  const std::string status = cp.Ctl("--json status " + run).output;
  auto number = [&](const std::string& key) {
    const size_t at = status.find("\"" + key + "\":");
    return at == std::string::npos ? 0.0 : std::atof(status.c_str() + at + key.size() + 3);
  };
  const double stored_mfu = number("mfu"), stored_tokens = number("tokens_per_second");
  ASSERT_GT(stored_mfu, 0.0) << status;
  EXPECT_NEAR(stored_tokens * flops_per_token / stored_mfu / 1e12, 312.0, 312.0 * 1e-5)
      << status;
  cp.Ctl("stop --now " + run);
  worker.Kill();
}

}  // namespace
}  // namespace forge::test
