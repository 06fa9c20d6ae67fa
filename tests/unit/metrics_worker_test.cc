// WorkerMetrics: what a worker's /metrics says after the trainer's records, and the same
// served over HTTP by a real MetricsServer on loopback.
#include <gtest/gtest.h>

#include <cmath>
#include <utility>

#include "../common/http_get.h"
#include "metrics/metric_catalog.h"
#include "metrics/metrics_server.h"
#include "metrics/timed_comm.h"
#include "metrics/worker_metrics.h"
#include "metrics_test_util.h"
#include "worker/train/trainer.h"

namespace forge {
namespace {

using test::Exposition;
using test::SeriesValue;

WorkerMetricsOptions Options() {
  WorkerMetricsOptions o;
  o.run_id = "r1";
  o.rank = 1;
  o.world = 4;
  o.flops_per_token = 6e9;
  o.peak_tflops = 989.4;
  o.checkpoint_every_steps = 100;
  return o;
}

StepRecord Record(int64_t step, int64_t window, float loss) {
  StepRecord r;
  r.step = step;
  r.window_steps = window;
  r.loss = loss;
  r.grad_norm = 0.5f;
  r.lr = 1e-3f;
  r.tokens_per_s = 4e5;  // global
  r.step_seconds = 0.3;
  r.data_wait_seconds = 0.02;
  return r;
}

TEST(WorkerMetrics, NoRecordNoValueSeries) {
  prometheus::Registry reg;
  WorkerMetrics m(reg, Options());
  const std::string text = Exposition(reg);
  // A loss of 0 before the first step would look like a real value on a chart.
  EXPECT_FALSE(SeriesValue(text, "forge_loss"));
  EXPECT_FALSE(SeriesValue(text, "forge_tokens_per_second"));
  EXPECT_EQ(SeriesValue(text, "forge_worker_up", {{"run_id", "r1"}, {"rank", "1"}}), 1.0);
  EXPECT_EQ(SeriesValue(text, "forge_run_state", {{"state", "running"}}), 1.0);
  EXPECT_EQ(SeriesValue(text, "forge_run_state", {{"state", "completed"}}), 0.0);
  EXPECT_EQ(SeriesValue(text, "forge_checkpoint_every_steps"), 100.0);
  EXPECT_EQ(SeriesValue(text, "forge_comm_seconds_total", {{"op", "reduce_scatter"}}), 0.0);
}

TEST(WorkerMetrics, RecordsBecomeSeries) {
  prometheus::Registry reg;
  WorkerMetrics m(reg, Options());
  m.ObserveStep(Record(10, 10, 5.0f));
  StepRecord r = Record(20, 10, 4.0f);
  r.val_loss = 4.5f;
  r.step_seconds = 0.7;
  r.checkpoint_step = 20;
  r.checkpoints_committed = 1;
  r.checkpoint_blocked_s = 0.25;
  r.checkpoint_write_s = 1.5;
  r.checkpoint_bytes = 12345;
  m.ObserveStep(r);

  const std::string t = Exposition(reg);
  EXPECT_EQ(SeriesValue(t, "forge_step"), 20.0);
  EXPECT_EQ(SeriesValue(t, "forge_loss"), 4.0);
  EXPECT_EQ(SeriesValue(t, "forge_val_loss"), 4.5);
  EXPECT_DOUBLE_EQ(*SeriesValue(t, "forge_learning_rate"), double(1e-3f));
  EXPECT_EQ(SeriesValue(t, "forge_grad_norm"), 0.5);
  EXPECT_EQ(SeriesValue(t, "forge_tokens_per_second"), 1e5);  // a quarter of the global rate
  EXPECT_NEAR(*SeriesValue(t, "forge_mfu_ratio"), 1e5 * 6e9 / 989.4e12, 1e-12);
  // 10 steps at 0.3 s and 10 at 0.7 s.
  EXPECT_EQ(SeriesValue(t, "forge_step_seconds_count"), 20.0);
  EXPECT_NEAR(*SeriesValue(t, "forge_step_seconds_sum"), 10.0, 1e-9);
  EXPECT_EQ(SeriesValue(t, "forge_step_seconds_bucket", {{"le", "0.250000"}}).value_or(
                SeriesValue(t, "forge_step_seconds_bucket", {{"le", "0.25"}}).value_or(-1)),
            0.0);
  EXPECT_EQ(SeriesValue(t, "forge_step_seconds_bucket", {{"le", "0.5"}}).value_or(-1), 10.0);
  EXPECT_EQ(SeriesValue(t, "forge_step_seconds_bucket", {{"le", "1"}}).value_or(-1), 20.0);
  EXPECT_NEAR(*SeriesValue(t, "forge_data_wait_seconds_total"), 0.04, 1e-12);
  EXPECT_EQ(SeriesValue(t, "forge_checkpoint_seconds", {{"phase", "blocked"}}), 0.25);
  EXPECT_EQ(SeriesValue(t, "forge_checkpoint_seconds", {{"phase", "write"}}), 1.5);
  EXPECT_EQ(SeriesValue(t, "forge_checkpoint_bytes"), 12345.0);
  EXPECT_EQ(SeriesValue(t, "forge_checkpoint_last_step"), 20.0);
  EXPECT_EQ(SeriesValue(t, "forge_checkpoints_total"), 1.0);
  EXPECT_EQ(SeriesValue(t, "forge_gpu_memory_bytes", {{"kind", "peak"}}), 0.0);  // CPU record
  EXPECT_EQ(m.last_sample().step, 20);
}

TEST(WorkerMetrics, ResumedRunCountsCheckpointAgeFromItsStart) {
  prometheus::Registry reg;
  WorkerMetrics m(reg, Options());
  m.ObserveStep(Record(510, 10, 3.0f));  // resumed at 500
  EXPECT_EQ(SeriesValue(Exposition(reg), "forge_checkpoint_last_step"), 500.0);
}

// Records carry the running total of skipped steps; the counter follows it without counting a
// step twice (records between skips repeat the total).
TEST(WorkerMetrics, SkippedStepsCountOnce) {
  prometheus::Registry reg;
  WorkerMetrics m(reg, Options());
  for (int64_t total : {0, 2, 2, 5}) {
    StepRecord r = Record(10 * (total + 1), 10, 3.0f);
    r.skipped_steps = total;
    m.ObserveStep(r);
  }
  EXPECT_EQ(SeriesValue(Exposition(reg), "forge_skipped_steps_total"), 5.0);
}

// Loss spikes and spike rollbacks: running totals in the records, counted once each.
TEST(WorkerMetrics, LossSpikesAndRollbacksCountOnce) {
  prometheus::Registry reg;
  WorkerMetrics m(reg, Options());
  EXPECT_EQ(SeriesValue(Exposition(reg), "forge_loss_spikes_total"), 0.0);
  EXPECT_EQ(SeriesValue(Exposition(reg), "forge_spike_rollbacks_total"), 0.0);
  for (auto [spikes, rollbacks] : {std::pair{1, 0}, std::pair{1, 0}, std::pair{3, 1},
                                   std::pair{3, 1}, std::pair{4, 1}}) {
    StepRecord r = Record(10 + spikes, 10, 3.0f);
    r.loss_spikes = spikes;
    r.spike_rollbacks = rollbacks;
    r.skipped_steps = spikes;
    m.ObserveStep(r);
  }
  EXPECT_EQ(SeriesValue(Exposition(reg), "forge_loss_spikes_total"), 4.0);
  EXPECT_EQ(SeriesValue(Exposition(reg), "forge_spike_rollbacks_total"), 1.0);
  EXPECT_EQ(SeriesValue(Exposition(reg), "forge_skipped_steps_total"), 4.0);
}

TEST(WorkerMetrics, NoPeakNoMfuAndStatesAreChecked) {
  prometheus::Registry reg;
  WorkerMetricsOptions o = Options();
  o.peak_tflops = 0.0;
  WorkerMetrics m(reg, o);
  m.ObserveStep(Record(1, 1, 5.0f));
  EXPECT_FALSE(SeriesValue(Exposition(reg), "forge_mfu_ratio"));
  EXPECT_FALSE(m.SetRunState("sleeping").ok());
  ASSERT_TRUE(m.SetRunState("completed").ok());
  const std::string t = Exposition(reg);
  EXPECT_EQ(SeriesValue(t, "forge_run_state", {{"state", "completed"}}), 1.0);
  EXPECT_EQ(SeriesValue(t, "forge_run_state", {{"state", "running"}}), 0.0);
}

TEST(WorkerMetrics, EveryRegisteredFamilyIsInTheCatalog) {
  prometheus::Registry reg;
  WorkerMetrics m(reg, Options());
  m.ObserveStep(Record(1, 1, 5.0f));
  for (const auto& f : reg.Collect()) {
    const MetricInfo* info = FindMetric(f.name);
    ASSERT_NE(info, nullptr) << f.name;
    EXPECT_EQ(info->source, MetricSource::kWorker) << f.name;
    for (const auto& metric : f.metric)
      for (const auto& l : metric.label) {
        bool known = false;
        for (auto name : info->labels) known = known || name == l.name;
        if (l.name != "le") EXPECT_TRUE(known) << f.name << " label " << l.name;
      }
  }
}

TEST(WorkerMetrics, TimedCommCountsWaitsPerCollective) {
  prometheus::Registry reg;
  WorkerMetrics m(reg, Options());
  std::unique_ptr<Comm> comm = MakeTimedComm(MakeLocalComm(), &m);
  ASSERT_EQ(comm->world(), 1);
  float buf[4] = {1, 2, 3, 4};
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(AllReduceSumBlocking(comm.get(), buf, 4, DType::kF32).ok());
  ASSERT_TRUE(BarrierBlocking(comm.get()).ok());
  EXPECT_EQ(buf[3], 4.0f);  // world 1: the sum is the value
  const std::string t = Exposition(reg);
  EXPECT_GT(*SeriesValue(t, "forge_comm_seconds_total", {{"op", "all_reduce"}}), 0.0);
  EXPECT_GT(*SeriesValue(t, "forge_comm_seconds_total", {{"op", "barrier"}}), 0.0);
  EXPECT_EQ(*SeriesValue(t, "forge_comm_seconds_total", {{"op", "all_gather"}}), 0.0);
  // A host wait is the whole collective as the caller sees it: both counters agree.
  for (const char* op : {"all_reduce", "barrier"})
    EXPECT_EQ(*SeriesValue(t, "forge_collective_seconds_total", {{"op", op}}),
              *SeriesValue(t, "forge_comm_seconds_total", {{"op", op}}))
        << op;
}

// The sink NCCL reports into: running time and exposed wait go to their own counters, and
// only the exposed wait reaches the per-step clock the straggler watch reads.
TEST(WorkerMetrics, CommTimeCounterKeepsRunningTimeAndExposedWaitApart) {
  prometheus::Registry reg;
  WorkerMetrics m(reg, Options());
  CommWaitClock clock;
  CommTimeCounter counter(&m, &clock);
  CommTimeSink* sink = &counter;
  sink->AddCollectiveSeconds(CollectiveOp::kAllReduce, 0.25);
  sink->AddCollectiveSeconds(CollectiveOp::kAllReduce, 0.5);
  sink->AddCollectiveSeconds(CollectiveOp::kAllGather, 0.125);
  sink->AddExposedWaitSeconds(CollectiveOp::kAllReduce, 0.0625);
  sink->AddExposedWaitSeconds(CollectiveOp::kReduceScatter, 0.03125);
  const std::string t = Exposition(reg);
  EXPECT_EQ(*SeriesValue(t, "forge_collective_seconds_total", {{"op", "all_reduce"}}), 0.75);
  EXPECT_EQ(*SeriesValue(t, "forge_collective_seconds_total", {{"op", "all_gather"}}), 0.125);
  EXPECT_EQ(*SeriesValue(t, "forge_collective_seconds_total", {{"op", "reduce_scatter"}}), 0.0);
  EXPECT_EQ(*SeriesValue(t, "forge_comm_seconds_total", {{"op", "all_reduce"}}), 0.0625);
  EXPECT_EQ(*SeriesValue(t, "forge_comm_seconds_total", {{"op", "reduce_scatter"}}), 0.03125);
  EXPECT_EQ(*SeriesValue(t, "forge_comm_seconds_total", {{"op", "all_gather"}}), 0.0);
  EXPECT_NEAR(clock.seconds(), 0.09375, 1e-9);

  // Without metrics the clock still counts (a worker with metrics.port 0).
  CommWaitClock alone;
  CommTimeCounter bare(nullptr, &alone);
  bare.AddCollectiveSeconds(CollectiveOp::kAllReduce, 1.0);
  bare.AddExposedWaitSeconds(CollectiveOp::kAllReduce, 0.5);
  EXPECT_NEAR(alone.seconds(), 0.5, 1e-9);
}

TEST(MetricsServer, ServesTheRegistryOverHttp) {
  auto server = MetricsServer::Start("127.0.0.1", 0);
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  ASSERT_GT((*server)->port(), 0);
  auto reg = std::make_shared<prometheus::Registry>();
  (*server)->Register(reg);
  WorkerMetrics m(*reg, Options());
  m.ObserveStep(Record(7, 7, 2.5f));
  const test::HttpResponse r = test::HttpGet((*server)->port(), "/metrics");
  ASSERT_EQ(r.status, 200);
  EXPECT_EQ(SeriesValue(r.body, "forge_loss", {{"run_id", "r1"}, {"rank", "1"}}), 2.5);
  EXPECT_EQ(SeriesValue(r.body, "forge_step"), 7.0);

  // A second server cannot take the same port: an error naming the address, not an exception.
  auto clash = MetricsServer::Start("127.0.0.1", (*server)->port());
  ASSERT_FALSE(clash.ok());
  EXPECT_NE(clash.status().message().find("127.0.0.1:" + std::to_string((*server)->port())),
            std::string::npos)
      << clash.status().message();
}

}  // namespace
}  // namespace forge
