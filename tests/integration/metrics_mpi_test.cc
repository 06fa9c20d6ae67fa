// /metrics of a data-parallel CPU run under mpirun: each rank serves on a port of its own
// (metrics.port any: picked and logged by the rank) with its own rank label, its share of the
// throughput, and the time it waited on the MPI all-reduces (forge_comm_seconds_total, counted
// by the timed Comm wrapper).
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

#include "../common/http_get.h"
#include "../common/reported_port.h"
#include "../unit/metrics_test_util.h"
#include "child_process.h"
#include "counting_dataset.h"
#include "mpi_launch.h"

namespace forge {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

TEST(MetricsMpi, EachRankServesItsOwnSeries) {
  REQUIRE_MPIRUN();
  const std::string dir = ::testing::TempDir() + "/metrics_mpi_" + std::to_string(::getpid());
  fs::remove_all(dir);
  fs::create_directories(dir);
  test::WriteCountingDataset(dir + "/data", 99u, 40000, 4000);
  std::ofstream(dir + "/run.yaml") << "name: mpi-metrics\n"
      "model: {n_layer: 2, d_model: 32, n_head: 4, ffn: 64, vocab: 256, seq_len: 16}\n"
      "data: {dataset_dir: " << dir << "/data}\n"
      "schedule: {total_steps: 1000000, warmup_steps: 2}\n"
      "batch: {micro_batch: 2, global_batch: 8}\n"
      "eval: {every_steps: 0, batches: 2}\n"
      "train: {backend: cpu, log_every: 1, run_dir: " << dir << "/run}\n"
      "metrics: {port: any, bind_address: 127.0.0.1}\n";

  test::Child run;
  test::Spawn(&run, {std::string(FORGE_MPIEXEC), "--allow-run-as-root", "--oversubscribe", "-np",
                     "2", "-x", "OPENBLAS_NUM_THREADS=1", test::Bin("forge"), "train",
                     dir + "/run.yaml"},
              dir + "/mpirun.log");

  // Each rank serves on a port it picked and logged (metrics.port any).
  int port[2] = {0, 0};
  for (int r = 0; r < 2; ++r) {
    const auto until = Clock::now() + std::chrono::seconds(40);
    while ((port[r] = test::LoggedMetricsPort(run.log, r)) == 0 && Clock::now() < until) {
      ASSERT_TRUE(run.Running()) << "mpirun ended early:\n" << test::Tail(run.log);
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    ASSERT_GT(port[r], 0) << "rank " << r << " logged no /metrics port:\n" << test::Tail(run.log);
  }
  // Poll both endpoints until each rank has logged steps and waited on all-reduces.
  std::string text[2];
  bool ready = false;
  const auto deadline = Clock::now() + std::chrono::seconds(40);
  while (!ready && Clock::now() < deadline) {
    ASSERT_TRUE(run.Running()) << "mpirun ended early:\n" << test::Tail(run.log);
    ready = true;
    for (int r = 0; r < 2; ++r) {
      text[r] = test::HttpGet(port[r], "/metrics").body;
      const auto step = test::SeriesValue(text[r], "forge_step");
      const auto comm = test::SeriesValue(text[r], "forge_comm_seconds_total", {{"op", "all_reduce"}});
      ready = ready && step && *step >= 5 && comm && *comm > 0.0;
    }
    if (!ready) std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  ASSERT_TRUE(ready) << "rank 0:\n" << text[0].substr(0, 2000) << "\nrank 1:\n"
                     << text[1].substr(0, 2000) << "\nlog:\n" << test::Tail(run.log);
  for (int r = 0; r < 2; ++r) {
    const std::map<std::string, std::string> me{{"run_id", "mpi-metrics"}, {"rank", std::to_string(r)}};
    EXPECT_TRUE(test::SeriesValue(text[r], "forge_loss", me)) << "rank " << r;
    EXPECT_GT(test::SeriesValue(text[r], "forge_tokens_per_second", me).value_or(0), 0.0);
    EXPECT_EQ(test::SeriesValue(text[r], "forge_worker_up", me), 1.0);
    EXPECT_GT(*test::SeriesValue(text[r], "forge_comm_seconds_total", {{"op", "all_reduce"}}), 0.0);
    std::printf("rank %d: step %.0f, tokens/s %.0f, all_reduce wait %.4f s, data wait %.4f s\n", r,
                *test::SeriesValue(text[r], "forge_step"),
                *test::SeriesValue(text[r], "forge_tokens_per_second"),
                *test::SeriesValue(text[r], "forge_comm_seconds_total", {{"op", "all_reduce"}}),
                *test::SeriesValue(text[r], "forge_data_wait_seconds_total"));
  }
  // mpirun forwards SIGUSR1; every rank checkpoints at the next step boundary and exits 0.
  EXPECT_EQ(run.Stop(60, SIGUSR1), 0) << test::Tail(run.log);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace forge
