// The coordinator's run lifecycle driven through its API in-process (no training): placement,
// heartbeats and commands, loss of a worker -> RESTARTING -> FAILED after max_restarts, stop
// requests, a restart of the coordinator itself, and the NCCL-id relay over a real gRPC server
// on loopback (worker/agent/coordinator_rendezvous.h).
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <thread>

#include "worker/agent/coordinator_rendezvous.h"
#include "coordinator/coordinator.h"
#include "coordinator/server.h"
#include "coordinator_test_util.h"

namespace forge::coord {
namespace {

std::string StateDir(const std::string& name) { return test::FreshStateDir("coord", name); }

constexpr const char* kSpec =
    "name: life\n"
    "model: {n_layer: 1, d_model: 32, n_head: 4, ffn: 64, vocab: 256, seq_len: 16}\n"
    "schedule: {total_steps: 10, warmup_steps: 1}\n"
    "batch: {micro_batch: 2, global_batch: 4}\n"
    "train: {workers: 2, max_restarts: 1}\n";

std::unique_ptr<Coordinator> Open(const std::string& dir, int timeout_ms = 300) {
  CoordinatorOptions o;
  o.state_dir = dir;
  o.heartbeat_timeout_ms = timeout_ms;
  auto c = Coordinator::Open(o);
  EXPECT_TRUE(c.ok()) << c.status().ToString();
  return c.ok() ? std::move(c).value() : nullptr;
}

v1::JoinResponse Join(Coordinator* c, const std::string& id, int rank) {
  v1::JoinRequest j;
  j.set_worker_id(id);
  j.mutable_group()->set_id("grp-" + id.substr(0, 1));
  j.mutable_group()->set_rank(rank);
  j.mutable_group()->set_size(2);
  v1::JoinResponse r;
  EXPECT_TRUE(c->Join(j, &r).ok());
  return r;
}

v1::HeartbeatResponse Beat(Coordinator* c, const std::string& id, const v1::Assignment& a,
                           v1::WorkerPhase phase = v1::TRAINING, int64_t step = 0) {
  v1::HeartbeatRequest h;
  h.set_worker_id(id);
  h.set_run_id(a.run_id());
  h.set_attempt(a.attempt());
  h.set_rank(a.rank());
  h.set_phase(phase);
  if (step > 0) h.mutable_metrics()->set_step(step);
  v1::HeartbeatResponse r;
  EXPECT_TRUE(c->Heartbeat(h, &r).ok());
  return r;
}

using test::GetRun;

TEST(CoordinatorLifecycle, PlaceRunCompleteAndQueue) {
  auto c = Open(StateDir("complete"));
  v1::SubmitRunRequest s;
  s.set_spec_yaml(kSpec);
  v1::Run run;
  ASSERT_TRUE(c->SubmitRun(s, &run).ok());
  EXPECT_EQ(run.state(), v1::PENDING);
  EXPECT_FALSE(Join(c.get(), "a0", 0).assigned());  // half a group
  v1::JoinResponse j1 = Join(c.get(), "a1", 1);
  ASSERT_TRUE(j1.assigned());
  v1::JoinResponse j0 = Join(c.get(), "a0", 0);  // asks again: now placed
  ASSERT_TRUE(j0.assigned());
  EXPECT_EQ(j0.assignment().rank(), 0);
  EXPECT_EQ(j1.assignment().rank(), 1);
  EXPECT_EQ(j0.assignment().attempt(), 1);
  EXPECT_TRUE(j0.assignment().resume_checkpoint().empty());
  EXPECT_NE(j0.assignment().spec_yaml().find(run.run_dir()), std::string::npos);
  EXPECT_EQ(GetRun(c.get(), run.id()).state(), v1::RUNNING);

  EXPECT_EQ(Beat(c.get(), "a0", j0.assignment(), v1::TRAINING, 4).command(), v1::CONTINUE);
  EXPECT_EQ(GetRun(c.get(), run.id()).step(), 4);
  Beat(c.get(), "a0", j0.assignment(), v1::DONE_COMPLETED, 10);
  EXPECT_EQ(GetRun(c.get(), run.id()).state(), v1::RUNNING);  // rank 1 still going
  EXPECT_FALSE(Join(c.get(), "a0", 0).assigned());         // done: not handed the run again
  Beat(c.get(), "a1", j1.assignment(), v1::DONE_COMPLETED);
  EXPECT_EQ(GetRun(c.get(), run.id()).state(), v1::COMPLETED);
  EXPECT_EQ(GetRun(c.get(), run.id()).step(), 10);
}

TEST(CoordinatorLifecycle, QueuedRunWaitsForTheGroupAndDoneSurvivesARestart) {
  const std::string dir = StateDir("queue");
  v1::Run first, second;
  v1::Assignment a0, a1;
  {
    auto c = Open(dir, 5000);
    v1::SubmitRunRequest s;
    s.set_spec_yaml(kSpec);
    ASSERT_TRUE(c->SubmitRun(s, &first).ok());
    ASSERT_TRUE(c->SubmitRun(s, &second).ok());
    Join(c.get(), "a0", 0);
    a1 = Join(c.get(), "a1", 1).assignment();
    a0 = Join(c.get(), "a0", 0).assignment();
    EXPECT_EQ(a0.run_id(), first.id());  // submission order
    EXPECT_EQ(GetRun(c.get(), second.id()).state(), v1::PENDING);
    Beat(c.get(), "a0", a0, v1::DONE_COMPLETED, 10);
  }
  // Restarted between the two ranks' reports: rank 0's is remembered.
  auto c = Open(dir, 5000);
  EXPECT_FALSE(Join(c.get(), "a0", 0).assigned());  // not handed its finished placement again
  Beat(c.get(), "a1", a1, v1::DONE_COMPLETED);
  EXPECT_EQ(GetRun(c.get(), first.id()).state(), v1::COMPLETED);
  // The group is free: the queued run goes on it.
  v1::JoinResponse next = Join(c.get(), "a0", 0);
  ASSERT_TRUE(next.assigned());
  EXPECT_EQ(next.assignment().run_id(), second.id());
  EXPECT_EQ(GetRun(c.get(), second.id()).state(), v1::RUNNING);
}

TEST(CoordinatorLifecycle, LostWorkerRestartsThenFails) {
  auto c = Open(StateDir("lost"), /*timeout_ms=*/300);
  v1::SubmitRunRequest s;
  s.set_spec_yaml(kSpec);
  v1::Run run;
  ASSERT_TRUE(c->SubmitRun(s, &run).ok());
  Join(c.get(), "a0", 0);
  v1::JoinResponse j1 = Join(c.get(), "a1", 1);
  v1::JoinResponse j0 = Join(c.get(), "a0", 0);
  ASSERT_TRUE(j0.assigned() && j1.assigned());
  // a0 keeps beating, a1 goes silent.
  for (int i = 0; i < 12 && GetRun(c.get(), run.id()).state() == v1::RUNNING; ++i) {
    Beat(c.get(), "a0", j0.assignment());
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  v1::Run r = GetRun(c.get(), run.id());
  EXPECT_EQ(r.state(), v1::RESTARTING);
  EXPECT_EQ(r.restarts(), 1);
  EXPECT_NE(r.state_reason().find("a1"), std::string::npos) << r.state_reason();
  // The survivor's placement is gone: it is told to abort.
  EXPECT_EQ(Beat(c.get(), "a0", j0.assignment()).command(), v1::ABORT);

  // A fresh group takes attempt 2; it fails too -> beyond max_restarts (1): FAILED.
  Join(c.get(), "b0", 0);
  v1::JoinResponse k1 = Join(c.get(), "b1", 1);
  ASSERT_TRUE(k1.assigned());
  EXPECT_EQ(k1.assignment().attempt(), 2);
  v1::HeartbeatRequest h;
  h.set_worker_id("b1");
  h.set_run_id(run.id());
  h.set_attempt(2);
  h.set_rank(1);
  h.set_phase(v1::DONE_FAILED);
  h.set_message("out of memory");
  v1::HeartbeatResponse hr;
  ASSERT_TRUE(c->Heartbeat(h, &hr).ok());
  r = GetRun(c.get(), run.id());
  EXPECT_EQ(r.state(), v1::FAILED);
  EXPECT_NE(r.state_reason().find("out of memory"), std::string::npos) << r.state_reason();
  EXPECT_NE(r.state_reason().find("max_restarts"), std::string::npos) << r.state_reason();
}

// kill -9 and a restart of the coordinator: the workers it knows from its state get two
// heartbeat timeouts from Serving() to reach it (they first have to find it again), and until
// one is heard from it is not placed on a run; once heard from, one timeout of silence loses it.
TEST(CoordinatorLifecycle, RestartedCoordinatorWaitsTwoTimeoutsForKnownWorkers) {
  const std::string dir = StateDir("reopened");
  v1::Run first;
  v1::Assignment a0, a1;
  {
    auto c = Open(dir, 1000);
    v1::SubmitRunRequest s;
    s.set_spec_yaml(kSpec);
    ASSERT_TRUE(c->SubmitRun(s, &first).ok());
    Join(c.get(), "a0", 0);
    a1 = Join(c.get(), "a1", 1).assignment();
    a0 = Join(c.get(), "a0", 0).assignment();
    ASSERT_EQ(a0.run_id(), first.id());
    Join(c.get(), "x0", 0);  // an idle group
    Join(c.get(), "x1", 1);
  }
  auto c = Open(dir, 1000);
  c->Serving();
  v1::SubmitRunRequest s;
  s.set_spec_yaml(kSpec);
  v1::Run second;
  ASSERT_TRUE(c->SubmitRun(s, &second).ok());
  EXPECT_EQ(GetRun(c.get(), second.id()).state(), v1::PENDING) << "placed on unheard workers";
  // Silent past one timeout: still placed.
  std::this_thread::sleep_for(std::chrono::milliseconds(1400));
  EXPECT_EQ(GetRun(c.get(), first.id()).state(), v1::RUNNING);
  EXPECT_EQ(Beat(c.get(), "a0", a0).command(), v1::CONTINUE);
  EXPECT_EQ(Beat(c.get(), "a1", a1).command(), v1::CONTINUE);
  // Heard from: a1's next silence counts one timeout. x1 is never heard from again: gone after
  // two, so x0's group never takes the second run.
  Join(c.get(), "x0", 0);
  for (int i = 0; i < 25 && GetRun(c.get(), first.id()).state() == v1::RUNNING; ++i) {
    Beat(c.get(), "a0", a0);
    Join(c.get(), "x0", 0);
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  const v1::Run r = GetRun(c.get(), first.id());
  EXPECT_EQ(r.state(), v1::RESTARTING);
  EXPECT_NE(r.state_reason().find("a1"), std::string::npos) << r.state_reason();
  EXPECT_EQ(GetRun(c.get(), second.id()).state(), v1::PENDING);
}

// Both workers of a placement go silent together while another group waits: the first
// timeout restarts the run on the waiting group, and the second worker's silence (seen in the
// same monitor tick) does not count against the new attempt: one restart, not a second one
// that would exceed max_restarts (1).
TEST(CoordinatorLifecycle, SilentPlacementCostsOneRestart) {
  auto c = Open(StateDir("silent_pair"), /*timeout_ms=*/300);
  v1::SubmitRunRequest s;
  s.set_spec_yaml(kSpec);
  v1::Run run;
  ASSERT_TRUE(c->SubmitRun(s, &run).ok());
  Join(c.get(), "a0", 0);
  ASSERT_TRUE(Join(c.get(), "a1", 1).assigned());
  Join(c.get(), "b0", 0);
  Join(c.get(), "b1", 1);
  auto ping = [&](const std::string& id) {
    v1::HeartbeatRequest h;
    h.set_worker_id(id);
    v1::HeartbeatResponse r;
    EXPECT_TRUE(c->Heartbeat(h, &r).ok());
  };
  for (int i = 0; i < 12 && GetRun(c.get(), run.id()).attempt() < 2; ++i) {
    ping("b0");
    ping("b1");
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  const v1::Run r = GetRun(c.get(), run.id());
  EXPECT_EQ(r.state(), v1::RUNNING) << r.state_reason();
  EXPECT_EQ(r.attempt(), 2);
  EXPECT_EQ(r.restarts(), 1);
  ASSERT_EQ(r.worker_ids_size(), 2);
  EXPECT_EQ(r.worker_ids(0), "b0");
}

TEST(CoordinatorLifecycle, StopCheckpointsThenStopsAndSurvivesARestart) {
  const std::string dir = StateDir("stop");
  std::string run_id;
  v1::Assignment a0, a1;
  {
    auto c = Open(dir, 5000);
    v1::SubmitRunRequest s;
    s.set_spec_yaml(kSpec);
    v1::Run run;
    ASSERT_TRUE(c->SubmitRun(s, &run).ok());
    run_id = run.id();
    Join(c.get(), "a0", 0);
    a1 = Join(c.get(), "a1", 1).assignment();
    a0 = Join(c.get(), "a0", 0).assignment();
    v1::StopRunRequest st;
    st.set_run_id(run_id);
    ASSERT_TRUE(c->StopRun(st, &run).ok());
    EXPECT_EQ(run.state(), v1::CHECKPOINTING);
  }
  // A new coordinator on the same state dir: the placement and the stop request are there.
  auto c = Open(dir, 5000);
  EXPECT_EQ(GetRun(c.get(), run_id).state(), v1::CHECKPOINTING);
  EXPECT_EQ(Beat(c.get(), "a0", a0).command(), v1::STOP);
  Beat(c.get(), "a0", a0, v1::DONE_STOPPED, 3);
  Beat(c.get(), "a1", a1, v1::DONE_STOPPED);
  EXPECT_EQ(GetRun(c.get(), run_id).state(), v1::STOPPED);
  v1::ResumeRunRequest rr;
  rr.set_run_id(run_id);
  rr.set_workers(3);  // 4 sequences do not split over 3 ranks
  v1::Run out;
  EXPECT_EQ(c->ResumeRun(rr, &out).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  rr.set_workers(0);
  ASSERT_TRUE(c->ResumeRun(rr, &out).ok());
  // The stopped group went back to the pool, so the resumed run is placed on it at once.
  EXPECT_EQ(out.state(), v1::RUNNING);
  EXPECT_EQ(out.attempt(), 2);
}

TEST(CoordinatorLifecycle, CommIdRelayOverGrpc) {
  auto c = Open(StateDir("commid"), 5000);
  ServerOptions so;
  so.listen = "127.0.0.1:0";
  so.user_token = "u";
  so.join_secret = "j";
  auto server = CoordinatorServer::Start(so, c.get());
  ASSERT_TRUE(server.ok()) << server.status().ToString();
  v1::SubmitRunRequest s;
  s.set_spec_yaml(kSpec);
  v1::Run run;
  ASSERT_TRUE(c->SubmitRun(s, &run).ok());
  // Two standalone GPU workers: the coordinator relays the id.
  v1::JoinRequest j;
  j.set_device("cuda:0");
  j.set_worker_id("g0");
  v1::JoinResponse r0, r1;
  ASSERT_TRUE(c->Join(j, &r0).ok());
  j.set_worker_id("g1");
  j.set_device("cuda:1");  // never two ranks on one GPU
  ASSERT_TRUE(c->Join(j, &r1).ok());
  ASSERT_TRUE(c->Join(j, &r1).ok() && r1.assigned());
  j.set_worker_id("g0");
  ASSERT_TRUE(c->Join(j, &r0).ok() && r0.assigned());
  EXPECT_TRUE(r0.assignment().comm_id_from_coordinator());

  agent::LinkOptions lo;
  lo.channel.address = "127.0.0.1:" + std::to_string((*server)->port());
  lo.join_secret = "j";
  auto link = agent::CoordinatorLink::Connect(lo);
  ASSERT_TRUE(link.ok());
  UniqueIdBytes sent{}, got{};
  for (size_t i = 0; i < sent.size(); ++i) sent[i] = char(i * 7 + 1);
  std::thread fetch([&] {
    auto rv = agent::MakeCoordinatorRendezvous(
        link->get(), {"g1", run.id(), r1.assignment().attempt()}, 10.0);
    EXPECT_TRUE(rv->Exchange(1, 2, &got).ok());
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(200));  // the fetcher waits first
  auto rv0 = agent::MakeCoordinatorRendezvous(
      link->get(), {"g0", run.id(), r0.assignment().attempt()}, 10.0);
  ASSERT_TRUE(rv0->Exchange(0, 2, &sent).ok());
  fetch.join();
  EXPECT_EQ(got, sent);

  // The wrong secret is refused.
  lo.join_secret = "u";
  auto bad = agent::CoordinatorLink::Connect(lo);
  v1::JoinResponse jr;
  Status st = (*bad)->Join(j, &jr);
  EXPECT_FALSE(st.ok());
  EXPECT_NE(st.ToString().find("UNAUTHENTICATED"), std::string::npos) << st.ToString();
  (*server)->Shutdown();
}

}  // namespace
}  // namespace forge::coord
