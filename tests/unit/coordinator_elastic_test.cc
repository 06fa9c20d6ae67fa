// Elastic continue (train.min_workers, train.elastic_grace_s) through the coordinator's API
// in-process: a run asking for 3 workers that loses one waits the grace period for 3, then is
// placed on a launch group of 2 (the event names world 3 -> 2, the checkpoint and the batch
// split); when a group of 3 is idle again the placement of 2 is told to stop, and once it
// stopped the run is placed on the 3 (world 2 -> 3), not counted as a restart. Without
// min_workers the group of 2 is never used; a min_workers whose world cannot keep the global
// batch is refused at submission, naming the key. hsdp shrinks only to whole shard groups.
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <thread>

#include "coordinator/coordinator.h"
#include "coordinator_test_util.h"

namespace forge::coord {
namespace {

std::string StateDir(const std::string& name) { return test::FreshStateDir("elastic", name); }

std::string Spec(const std::string& train, const std::string& batch = "{micro_batch: 2, "
                                                                      "global_batch: 12}") {
  return "name: elastic\n"
         "model: {n_layer: 1, d_model: 32, n_head: 4, ffn: 64, vocab: 256, seq_len: 16}\n"
         "schedule: {total_steps: 100, warmup_steps: 1}\n"
         "batch: " + batch + "\n"
         "train: {workers: 3, max_restarts: 5, " + train + "}\n";
}

using test::AnyContains;

struct Fixture {
  std::unique_ptr<Coordinator> c;
  v1::Run run;

  // `spec`: the whole run spec (default: Spec(train)).
  Fixture(const std::string& name, const std::string& train, const std::string& spec = "") {
    CoordinatorOptions o;
    o.state_dir = StateDir(name);
    o.heartbeat_timeout_ms = 5000;
    auto opened = Coordinator::Open(o);
    EXPECT_TRUE(opened.ok()) << opened.status().ToString();
    c = std::move(opened).value();
    v1::SubmitRunRequest s;
    s.set_spec_yaml(spec.empty() ? Spec(train) : spec);
    grpc::Status st = c->SubmitRun(s, &run);
    EXPECT_TRUE(st.ok()) << st.error_message();
  }

  // Member `rank` of launch group `group` (of `size`) joins (or asks again).
  v1::JoinResponse Join(const std::string& group, int rank, int size) {
    v1::JoinRequest j;
    j.set_worker_id(group + "/" + std::to_string(rank));
    j.mutable_group()->set_id(group);
    j.mutable_group()->set_rank(rank);
    j.mutable_group()->set_size(size);
    v1::JoinResponse r;
    EXPECT_TRUE(c->Join(j, &r).ok());
    return r;
  }
  // Every member joins; the assignments when the group was placed (empty otherwise).
  std::vector<v1::Assignment> JoinGroup(const std::string& group, int size) {
    std::vector<v1::Assignment> out;
    for (int r = 0; r < size; ++r) Join(group, r, size);
    for (int r = 0; r < size; ++r) {
      v1::JoinResponse resp = Join(group, r, size);
      if (resp.assigned()) out.push_back(resp.assignment());
    }
    return out;
  }

  v1::HeartbeatResponse Beat(const std::string& group, const v1::Assignment& a,
                             v1::WorkerPhase phase = v1::TRAINING) {
    v1::HeartbeatRequest h;
    h.set_worker_id(group + "/" + std::to_string(a.rank()));
    h.set_run_id(a.run_id());
    h.set_attempt(a.attempt());
    h.set_rank(a.rank());
    h.set_phase(phase);
    h.set_step_done(1);
    v1::HeartbeatResponse r;
    EXPECT_TRUE(c->Heartbeat(h, &r).ok());
    return r;
  }

  v1::Run Get() { return test::GetRun(c.get(), run.id()); }
  std::vector<std::string> Events() { return test::RunEvents(c.get(), run.id()); }
};

TEST(CoordinatorElastic, ShrinksAfterTheGracePeriodAndGrowsBack) {
  Fixture f("shrink_grow", "min_workers: 2, elastic_grace_s: 0.4");
  std::vector<v1::Assignment> three = f.JoinGroup("g3", 3);
  ASSERT_EQ(three.size(), 3u);
  EXPECT_EQ(three[0].world(), 3);
  ASSERT_TRUE(f.c->WorkersExited(f.run.id(), 1, "rank 2 was killed").ok());
  EXPECT_EQ(f.Get().state(), v1::RESTARTING);

  // A group of 2 is idle at once, but the full world has the grace period to come back.
  EXPECT_TRUE(f.JoinGroup("g2", 2).empty());
  std::this_thread::sleep_for(std::chrono::milliseconds(700));
  std::vector<v1::Assignment> two = f.JoinGroup("g2", 2);
  ASSERT_EQ(two.size(), 2u) << f.Get().state_reason();
  EXPECT_EQ(two[0].world(), 2);
  EXPECT_EQ(two[0].attempt(), 2);
  EXPECT_EQ(f.Get().workers(), 2);
  EXPECT_EQ(f.Get().state(), v1::RUNNING);
  const auto events = f.Events();
  EXPECT_TRUE(AnyContains(events, "from a fresh start (world 3 -> 2; elastic: 3 requested, 2 "
                                  "available past train.elastic_grace_s (0.4 s), "
                                  "train.min_workers 2; global batch 12 kept as 3 accumulation "
                                  "step(s) of 2 per rank)"))
      << testing::PrintToString(events);

  // 3 are idle again: the placement of 2 is told to stop (with a checkpoint).
  EXPECT_TRUE(f.JoinGroup("g3b", 3).empty());
  v1::HeartbeatResponse stop;
  for (int i = 0; i < 40 && stop.command() != v1::STOP; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    stop = f.Beat("g2", two[0]);
  }
  ASSERT_EQ(stop.command(), v1::STOP) << testing::PrintToString(f.Events());
  EXPECT_EQ(stop.reason(), "growing back to 3 workers from a checkpoint");
  EXPECT_EQ(f.Beat("g2", two[1]).command(), v1::STOP);
  EXPECT_TRUE(AnyContains(f.Events(), "3 workers available again: world 2 (at step 0) saves a "
                                      "checkpoint and stops to grow back to 3"));
  f.Beat("g2", two[0], v1::DONE_STOPPED);
  f.Beat("g2", two[1], v1::DONE_STOPPED);
  std::vector<v1::Assignment> back = f.JoinGroup("g3b", 3);
  ASSERT_EQ(back.size(), 3u) << testing::PrintToString(f.Events());
  EXPECT_EQ(back[0].world(), 3);
  EXPECT_EQ(back[0].attempt(), 3);
  const v1::Run r = f.Get();
  EXPECT_EQ(r.state(), v1::RUNNING);
  EXPECT_EQ(r.workers(), 3);
  EXPECT_EQ(r.restarts(), 1);  // the loss; growing back is not a restart
  EXPECT_TRUE(AnyContains(f.Events(), "world 2 stopped at step 0 with a checkpoint to grow back "
                                      "to 3 workers"));
  EXPECT_TRUE(AnyContains(f.Events(), "(world 2 -> 3)")) << testing::PrintToString(f.Events());
  // The group of 2 is idle: its members ask and get nothing.
  EXPECT_FALSE(f.Join("g2", 0, 2).assigned());
}

TEST(CoordinatorElastic, WithoutMinWorkersAFullWorldIsAwaited) {
  Fixture f("not_elastic", "elastic_grace_s: 0");
  ASSERT_EQ(f.JoinGroup("g3", 3).size(), 3u);
  ASSERT_TRUE(f.c->WorkersExited(f.run.id(), 1, "rank 0 was killed").ok());
  EXPECT_TRUE(f.JoinGroup("g2", 2).empty());
  std::this_thread::sleep_for(std::chrono::milliseconds(600));
  EXPECT_TRUE(f.JoinGroup("g2", 2).empty());
  EXPECT_EQ(f.Get().state(), v1::RESTARTING);
  EXPECT_EQ(f.JoinGroup("g3b", 3).size(), 3u);
  EXPECT_EQ(f.Get().workers(), 3);
}

// hsdp (parallel.shard_group_size 2) asks for 4 workers and loses one: 3 would keep the global
// batch of 12, but not whole shard groups, so the run goes on with the group of 2 that is idle
// beside the group of 3. A worker count the group size does not divide is refused at
// submission and by ResumeRun (of the stopped run), naming the key.
std::string HsdpSpec(int workers) {
  return "name: elastic-hsdp\n"
         "model: {n_layer: 1, d_model: 32, n_head: 4, ffn: 64, vocab: 256, seq_len: 16}\n"
         "schedule: {total_steps: 100, warmup_steps: 1}\n"
         "batch: {micro_batch: 1, global_batch: 12}\n"
         "parallel: {mode: hsdp, shard_group_size: 2}\n"
         "train: {workers: " + std::to_string(workers) +
         ", max_restarts: 5, min_workers: 1, elastic_grace_s: 0.3}\n";
}

TEST(CoordinatorElastic, HsdpShrinksToWholeShardGroupsOnly) {
  Fixture f("hsdp", "", HsdpSpec(4));
  ASSERT_EQ(f.JoinGroup("g4", 4).size(), 4u);
  ASSERT_TRUE(f.c->WorkersExited(f.run.id(), 1, "rank 3 was killed").ok());
  EXPECT_TRUE(f.JoinGroup("g3", 3).empty());
  EXPECT_TRUE(f.JoinGroup("g2", 2).empty());
  std::this_thread::sleep_for(std::chrono::milliseconds(600));
  EXPECT_TRUE(f.JoinGroup("g3", 3).empty()) << "a world of 3 splits no shard groups of 2";
  std::vector<v1::Assignment> two = f.JoinGroup("g2", 2);
  ASSERT_EQ(two.size(), 2u) << testing::PrintToString(f.Events());
  EXPECT_EQ(two[0].world(), 2);
  EXPECT_EQ(f.Get().workers(), 2);
  EXPECT_TRUE(AnyContains(f.Events(), "(world 4 -> 2; elastic: 4 requested, 2 available"))
      << testing::PrintToString(f.Events());

  // Stopped, it may not be resumed on 3 workers.
  v1::StopRunRequest stop;
  stop.set_run_id(f.run.id());
  v1::Run stopping;
  ASSERT_TRUE(f.c->StopRun(stop, &stopping).ok());
  f.Beat("g2", two[0], v1::DONE_STOPPED);
  f.Beat("g2", two[1], v1::DONE_STOPPED);
  ASSERT_EQ(f.Get().state(), v1::STOPPED) << testing::PrintToString(f.Events());
  v1::ResumeRunRequest bad;
  bad.set_run_id(f.run.id());
  bad.set_workers(3);
  v1::Run out;
  const grpc::Status st = f.c->ResumeRun(bad, &out);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(st.error_message().find("parallel.shard_group_size (2) must divide workers (3)"),
            std::string::npos)
      << st.error_message();
}

TEST(CoordinatorElastic, HsdpWorkersTheGroupSizeDoesNotDivideAreRefused) {
  CoordinatorOptions o;
  o.state_dir = StateDir("hsdp_refused");
  auto c = Coordinator::Open(o);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  v1::SubmitRunRequest s;
  s.set_spec_yaml(HsdpSpec(3));
  v1::Run run;
  grpc::Status st = (*c)->SubmitRun(s, &run);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(st.error_message().find("parallel.shard_group_size (2) must divide train.workers (3)"),
            std::string::npos)
      << st.error_message();
}

TEST(CoordinatorElastic, MinWorkersThatCannotKeepTheGlobalBatchIsRefused) {
  CoordinatorOptions o;
  o.state_dir = StateDir("refused");
  auto c = Coordinator::Open(o);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  v1::SubmitRunRequest s;
  s.set_spec_yaml(Spec("min_workers: 2", "{micro_batch: 4, global_batch: 12}"));
  v1::Run run;
  grpc::Status st = (*c)->SubmitRun(s, &run);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(st.error_message().find("train.min_workers: 2 workers cannot keep the global batch: "
                                    "batch.global_batch (12) must be a multiple of "
                                    "batch.micro_batch * train.min_workers (8)"),
            std::string::npos)
      << st.error_message();
}

}  // namespace
}  // namespace forge::coord
