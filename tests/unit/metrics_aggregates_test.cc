// The coordinator's run-level aggregates (run_aggregates.h): sum of throughput, mean MFU,
// slowest rank, worker up/down, run state, and series removed when a run is forgotten.
#include <gtest/gtest.h>

#include "metrics/rank_sample.h"
#include "metrics/run_aggregates.h"
#include "metrics_test_util.h"
#include "worker/train/trainer.h"

namespace forge {
namespace {

using test::Exposition;
using test::SeriesValue;

RankStepSample Sample(int64_t step, double tps, double mfu, double secs) {
  RankStepSample s;
  s.step = step;
  s.tokens_per_s = tps;
  s.mfu = mfu;
  s.step_seconds = secs;
  return s;
}

TEST(RunAggregates, FoldsTheRanksLatestSamples) {
  prometheus::Registry reg;
  RunAggregates agg(reg);
  agg.ReportRank("a", 0, Sample(100, 1000, 0.40, 0.50));
  agg.ReportRank("a", 1, Sample(99, 900, 0.36, 0.56));
  agg.ReportRank("a", 2, Sample(100, 1100, -1.0, 0.45));  // no MFU known on this rank
  agg.ReportRank("a", 0, Sample(101, 1200, 0.48, 0.42));  // replaces rank 0's first sample
  agg.ReportRank("b", 0, Sample(5, 10, 0.1, 2.0));

  auto s = agg.Summary("a");
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->ranks, 3);
  EXPECT_EQ(s->step, 99);
  EXPECT_DOUBLE_EQ(s->tokens_per_s, 3200.0);
  EXPECT_DOUBLE_EQ(s->mfu, (0.48 + 0.36) / 2);
  EXPECT_DOUBLE_EQ(s->slowest_step_seconds, 0.56);
  EXPECT_EQ(s->slowest_rank, 1);

  const std::string t = Exposition(reg);
  EXPECT_EQ(SeriesValue(t, "forge_run_tokens_per_second", {{"run_id", "a"}}), 3200.0);
  EXPECT_EQ(SeriesValue(t, "forge_run_tokens_per_second", {{"run_id", "b"}}), 10.0);
  EXPECT_DOUBLE_EQ(*SeriesValue(t, "forge_run_mfu_ratio", {{"run_id", "a"}}), 0.42);
  EXPECT_EQ(SeriesValue(t, "forge_run_slowest_step_seconds", {{"run_id", "a"}}), 0.56);
  EXPECT_EQ(SeriesValue(t, "forge_run_slowest_rank", {{"run_id", "a"}}), 1.0);
  EXPECT_EQ(SeriesValue(t, "forge_run_step", {{"run_id", "a"}}), 99.0);
  EXPECT_EQ(SeriesValue(t, "forge_run_ranks_reporting", {{"run_id", "a"}}), 3.0);
}

TEST(RunAggregates, WorkerUpStateAndForgetting) {
  prometheus::Registry reg;
  RunAggregates agg(reg);
  agg.ReportRank("a", 0, Sample(1, 100, 0.5, 1.0));
  agg.ReportRank("a", 1, Sample(1, 50, 0.25, 2.0));
  agg.SetWorkerUp("a", 0, true);
  agg.SetWorkerUp("a", 1, false);
  ASSERT_TRUE(agg.SetRunState("a", "restarting").ok());
  EXPECT_FALSE(agg.SetRunState("a", "RESTARTING").ok());  // names are lower case
  std::string t = Exposition(reg);
  EXPECT_EQ(SeriesValue(t, "forge_worker_up", {{"run_id", "a"}, {"rank", "1"}}), 0.0);
  EXPECT_EQ(SeriesValue(t, "forge_run_state", {{"run_id", "a"}, {"state", "restarting"}}), 1.0);
  EXPECT_EQ(SeriesValue(t, "forge_run_state", {{"run_id", "a"}, {"state", "running"}}), 0.0);

  agg.ForgetRank("a", 1);
  t = Exposition(reg);
  EXPECT_EQ(SeriesValue(t, "forge_run_tokens_per_second", {{"run_id", "a"}}), 100.0);
  EXPECT_FALSE(SeriesValue(t, "forge_worker_up", {{"run_id", "a"}, {"rank", "1"}}));

  agg.ForgetRun("a");
  t = Exposition(reg);
  EXPECT_FALSE(SeriesValue(t, "forge_run_tokens_per_second", {{"run_id", "a"}}));
  EXPECT_FALSE(SeriesValue(t, "forge_worker_up", {{"run_id", "a"}}));
  EXPECT_FALSE(SeriesValue(t, "forge_run_state", {{"run_id", "a"}}));
  EXPECT_EQ(agg.Summary("a").status().code(), Code::kNotFound);
}

// forge_straggler{run_id,rank}: 0 for every reporting rank, 1 while one straggles, gone with
// the rank or the run.
TEST(RunAggregates, StragglerGaugePerRank) {
  prometheus::Registry reg;
  RunAggregates agg(reg);
  agg.ReportRank("a", 0, Sample(10, 100, -1, 0.5));
  agg.ReportRank("a", 1, Sample(10, 100, -1, 0.5));
  EXPECT_EQ(SeriesValue(Exposition(reg), "forge_straggler", {{"run_id", "a"}, {"rank", "1"}}),
            0.0);
  agg.SetStraggler("a", 1, true);
  agg.ReportRank("a", 1, Sample(11, 100, -1, 0.5));  // a new sample keeps the value
  EXPECT_EQ(SeriesValue(Exposition(reg), "forge_straggler", {{"run_id", "a"}, {"rank", "1"}}),
            1.0);
  EXPECT_EQ(SeriesValue(Exposition(reg), "forge_straggler", {{"run_id", "a"}, {"rank", "0"}}),
            0.0);
  agg.ForgetRank("a", 1);
  EXPECT_FALSE(SeriesValue(Exposition(reg), "forge_straggler", {{"run_id", "a"}, {"rank", "1"}}));
  agg.ForgetRun("a");
  EXPECT_FALSE(SeriesValue(Exposition(reg), "forge_straggler", {{"run_id", "a"}, {"rank", "0"}}));
}

TEST(RankSample, IsTheRanksShareOfTheGlobalRecord) {
  StepRecord r;
  r.step = 42;
  r.tokens_per_s = 8e5;
  r.step_seconds = 0.25;
  const RankStepSample s = RankSampleFromRecord(r, 8, 2e9, 989.4);
  EXPECT_EQ(s.step, 42);
  EXPECT_DOUBLE_EQ(s.tokens_per_s, 1e5);
  EXPECT_DOUBLE_EQ(s.mfu, 1e5 * 2e9 / 989.4e12);
  EXPECT_LT(RankSampleFromRecord(r, 8, 2e9, 0.0).mfu, 0.0);
}

}  // namespace
}  // namespace forge
