// Hang detection (train.hang_timeout_s) and the launcher's report of ended worker processes,
// driven through the coordinator's API in-process: a rank whose step stops advancing is named
// in an event, counted in forge_hangs_total and its run restarts from the last checkpoint,
// whether it still heartbeats (blocked in a collective) or not (a stopped process); steps that
// advance keep the run going, 0 turns detection off; WorkersExited restarts at once and
// ignores a placement that is no longer current.
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <thread>

#include "coordinator/coordinator.h"
#include "coordinator_test_util.h"
#include "metrics/run_aggregates.h"
#include "metrics_test_util.h"

namespace forge::coord {
namespace {

using Clock = std::chrono::steady_clock;

std::string StateDir(const std::string& name) { return test::FreshStateDir("hang", name); }

std::string Spec(const std::string& hang_timeout_s) {
  return "name: hang\n"
         "model: {n_layer: 1, d_model: 32, n_head: 4, ffn: 64, vocab: 256, seq_len: 16}\n"
         "schedule: {total_steps: 100, warmup_steps: 1}\n"
         "batch: {micro_batch: 2, global_batch: 4}\n"
         "train: {workers: 2, max_restarts: 2, hang_timeout_s: " +
         hang_timeout_s + "}\n";
}

struct Fixture {
  prometheus::Registry registry;
  RunAggregates agg{registry};
  std::unique_ptr<Coordinator> c;
  v1::Run run;
  v1::Assignment a0, a1;

  // A coordinator (heartbeat timeout 2 s: longer than the hangs below) with the run placed on
  // workers a0 (rank 0) and a1 (rank 1).
  Fixture(const std::string& name, const std::string& hang_timeout_s) {
    CoordinatorOptions o;
    o.state_dir = StateDir(name);
    o.heartbeat_timeout_ms = 2000;
    o.aggregates = &agg;
    auto opened = Coordinator::Open(o);
    EXPECT_TRUE(opened.ok()) << opened.status().ToString();
    c = std::move(opened).value();
    v1::SubmitRunRequest s;
    s.set_spec_yaml(Spec(hang_timeout_s));
    EXPECT_TRUE(c->SubmitRun(s, &run).ok());
    Join("a0", 0);
    a1 = Join("a1", 1).assignment();
    a0 = Join("a0", 0).assignment();
    EXPECT_EQ(a0.attempt(), 1);
  }

  v1::JoinResponse Join(const std::string& id, int rank) {
    v1::JoinRequest j;
    j.set_worker_id(id);
    j.mutable_group()->set_id("grp");
    j.mutable_group()->set_rank(rank);
    j.mutable_group()->set_size(2);
    v1::JoinResponse r;
    EXPECT_TRUE(c->Join(j, &r).ok());
    return r;
  }

  // A TRAINING heartbeat reporting `step_done` (no step record, as between logged steps).
  v1::HeartbeatResponse Beat(const std::string& id, const v1::Assignment& a, int64_t step_done) {
    v1::HeartbeatRequest h;
    h.set_worker_id(id);
    h.set_run_id(a.run_id());
    h.set_attempt(a.attempt());
    h.set_rank(a.rank());
    h.set_phase(v1::TRAINING);
    h.set_step_done(step_done);
    v1::HeartbeatResponse r;
    EXPECT_TRUE(c->Heartbeat(h, &r).ok());
    return r;
  }

  v1::Run Get() { return test::GetRun(c.get(), run.id()); }
  std::vector<std::string> Events() { return test::RunEvents(c.get(), run.id()); }

  double Hangs() {
    return test::SeriesValue(test::Exposition(registry), "forge_hangs_total",
                             {{"run_id", run.id()}})
        .value_or(0.0);
  }
};

using test::AnyContains;

TEST(CoordinatorHang, AStoppedRankIsNamedCountedAndTheRunRestarts) {
  Fixture f("stopped", "0.5");
  // Both ranks advance to step 3; then rank 1 goes silent (a stopped process) and rank 0 keeps
  // heartbeating at step 3 (blocked in the step's collective, waiting for rank 1).
  for (int step = 1; step <= 3; ++step) {
    f.Beat("a0", f.a0, step);
    f.Beat("a1", f.a1, step);
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  const auto stalled_at = Clock::now();
  v1::HeartbeatResponse last;
  while (Clock::now() - stalled_at < std::chrono::seconds(3)) {
    last = f.Beat("a0", f.a0, 3);
    if (last.command() == v1::ABORT) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  const double waited = std::chrono::duration<double>(Clock::now() - stalled_at).count();
  ASSERT_EQ(last.command(), v1::ABORT) << "no hang detected in 3 s";
  EXPECT_GE(waited, 0.5);
  const v1::Run run = f.Get();
  EXPECT_EQ(run.state(), v1::RESTARTING);
  EXPECT_EQ(run.restarts(), 1);
  // Named: the run, the silent rank and its worker (not rank 0, which still heartbeats).
  const std::string& why = run.state_reason();
  EXPECT_NE(why.find("hang: run " + run.id() + " rank 1 (worker a1)"), std::string::npos) << why;
  EXPECT_NE(why.find("no step progress"), std::string::npos) << why;
  EXPECT_NE(why.find("after step 3"), std::string::npos) << why;
  EXPECT_NE(why.find("train.hang_timeout_s 0.5"), std::string::npos) << why;
  EXPECT_NE(why.find("1 other rank(s) stalled"), std::string::npos) << why;
  EXPECT_TRUE(AnyContains(f.Events(), "rank 1 (worker a1) made no step progress")) << why;
  EXPECT_EQ(f.Hangs(), 1.0);

  // Fresh workers take the restart, from the latest committed checkpoint (none here).
  f.Join("b0", 0);
  v1::JoinResponse again = f.Join("b1", 1);
  ASSERT_TRUE(again.assigned());
  EXPECT_EQ(again.assignment().attempt(), 2);
  EXPECT_EQ(f.Get().state(), v1::RUNNING);
}

TEST(CoordinatorHang, StepsThatAdvanceKeepTheRunGoing) {
  Fixture f("advancing", "0.5");
  // 1.5 s of heartbeats, the step advancing every 0.3 s (no step records: steps between the
  // logged ones count too).
  int64_t step = 0;
  const auto start = Clock::now();
  while (Clock::now() - start < std::chrono::milliseconds(1500)) {
    step += 1;
    for (int i = 0; i < 3; ++i) {
      EXPECT_EQ(f.Beat("a0", f.a0, step).command(), v1::CONTINUE);
      EXPECT_EQ(f.Beat("a1", f.a1, step).command(), v1::CONTINUE);
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  }
  EXPECT_EQ(f.Get().state(), v1::RUNNING);
  EXPECT_EQ(f.Hangs(), 0.0);
}

TEST(CoordinatorHang, ZeroTurnsDetectionOff) {
  Fixture f("off", "0");
  const auto start = Clock::now();
  while (Clock::now() - start < std::chrono::milliseconds(1200)) {
    EXPECT_EQ(f.Beat("a0", f.a0, 2).command(), v1::CONTINUE);
    EXPECT_EQ(f.Beat("a1", f.a1, 2).command(), v1::CONTINUE);
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_EQ(f.Get().state(), v1::RUNNING);
}

TEST(CoordinatorHang, WorkersExitedRestartsAtOnceAndIgnoresOldAttempts) {
  Fixture f("exited", "0");
  // A report for an attempt that is not the current one changes nothing.
  ASSERT_TRUE(f.c->WorkersExited(f.run.id(), 7, "stale").ok());
  EXPECT_EQ(f.Get().state(), v1::RUNNING);
  ASSERT_TRUE(f.c->WorkersExited(f.run.id(), 1, "rank 1 was killed by signal 9").ok());
  const v1::Run run = f.Get();
  EXPECT_EQ(run.state(), v1::RESTARTING);
  EXPECT_EQ(run.restarts(), 1);
  EXPECT_NE(run.state_reason().find("rank 1 was killed by signal 9"), std::string::npos);
  EXPECT_EQ(f.Beat("a0", f.a0, 1).command(), v1::ABORT);  // the survivor is told to go
  EXPECT_FALSE(f.c->WorkersExited("nope-000000", 1, "x").ok());
}

}  // namespace
}  // namespace forge::coord
