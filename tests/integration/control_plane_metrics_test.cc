// /metrics of a run under the coordinator: forge-coordinator --metrics-port serves the run-level
// aggregates it folds from the heartbeats, and each forge-worker serves its own series on the
// run config's metrics.port + local rank, both scraped over HTTP during a real CPU run (two
// ranks under mpirun) and after it ends.
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "../common/http_get.h"
#include "../unit/metrics_test_util.h"
#include "control_plane_harness.h"

namespace forge::test {
namespace {

std::string Scrape(int port) {
  HttpResponse r = HttpGet(port, "/metrics");
  return r.status == 200 ? r.body : "";
}

TEST(ControlPlaneMetrics, CoordinatorAndWorkersServeRunSeriesDuringARun) {
  ControlPlane cp("metrics");
  const int coord_port = FreeLoopbackPort();
  const int worker_port = FreeLoopbackPortPair(coord_port);  // ranks serve on it and it + 1
  ASSERT_GT(coord_port, 0);
  ASSERT_GT(worker_port, 0);
  cp.StartCoordinator(2000, "--metrics-bind 127.0.0.1 --metrics-port " +
                                std::to_string(coord_port));
  // A peak makes MFU known on the CPU (no device table entry there).
  const std::string spec =
      cp.WriteSpec("metrics", 40, 1000,
                   "metrics: {port: " + std::to_string(worker_port) +
                       ", bind_address: 127.0.0.1, peak_tflops: 0.001}\n");
  cp.StartWorkers(2, 120);
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
  for (int rank = 0; rank < 2; ++rank) {
    const std::map<std::string, std::string> l{{"run_id", run}, {"rank", std::to_string(rank)}};
    std::string body;
    ASSERT_TRUE(WaitFor(10, [&] {
      body = Scrape(worker_port + rank);
      return SeriesValue(body, "forge_tokens_per_second", l).has_value();
    })) << "rank " << rank << " /metrics on " << worker_port + rank << ":\n" << body;
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
      worker_sum += SeriesValue(Scrape(worker_port + rank), "forge_tokens_per_second",
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

}  // namespace
}  // namespace forge::test
