// What the coordinator derives from heartbeats beyond the run's lifecycle: the run-level
// metrics it exports (RunAggregates, for --metrics-port) and the stored history that
// GetRunHistory returns (`forgectl report`), GPU memory included. In-process, no training.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>

#include "common/config.h"
#include "coordinator/coordinator.h"
#include "coordinator_test_util.h"
#include "metrics/run_aggregates.h"
#include "metrics_test_util.h"
#include "worker/model/param_layout.h"

namespace forge::coord {
namespace {

using test::Exposition;
using test::SeriesValue;

std::string StateDir(const std::string& name) { return test::FreshStateDir("coord_hist", name); }

constexpr const char* kSpec =
    "name: hist\n"
    "model: {n_layer: 1, d_model: 32, n_head: 4, ffn: 64, vocab: 256, seq_len: 16}\n"
    "schedule: {total_steps: 10, warmup_steps: 1}\n"
    "batch: {micro_batch: 2, global_batch: 4}\n"
    "train: {workers: 2, max_restarts: 1}\n";

// device / device_name: what the worker reports (JoinRequest), e.g. "cuda:0" and its GPU's name.
v1::Assignment Join(Coordinator* c, const std::string& id, int rank,
                    const std::string& device = "", const std::string& device_name = "",
                    const std::string& group = "grp") {
  v1::JoinRequest j;
  j.set_worker_id(id);
  j.set_device(device);
  j.set_device_name(device_name);
  j.mutable_group()->set_id(group);
  j.mutable_group()->set_rank(rank);
  j.mutable_group()->set_size(2);
  v1::JoinResponse r;
  EXPECT_TRUE(c->Join(j, &r).ok());
  return r.assignment();
}

void Beat(Coordinator* c, const std::string& id, const v1::Assignment& a, v1::WorkerPhase phase,
          int64_t step, double tokens_per_s, double step_seconds, double mfu,
          int64_t gpu_bytes = 0) {
  v1::HeartbeatRequest h;
  h.set_worker_id(id);
  h.set_run_id(a.run_id());
  h.set_attempt(a.attempt());
  h.set_rank(a.rank());
  h.set_phase(phase);
  v1::StepMetrics* m = h.mutable_metrics();
  m->set_step(step);
  m->set_loss(5.0f - 0.1f * float(step));
  m->set_val_loss(step % 2 == 0 ? 4.0f : -1.0f);
  m->set_tokens_per_second(tokens_per_s);
  m->set_step_seconds(step_seconds);
  m->set_mfu(mfu);
  m->set_gpu_allocated_bytes(gpu_bytes);
  m->set_gpu_reserved_bytes(gpu_bytes);
  m->set_gpu_peak_bytes(2 * gpu_bytes);
  v1::HeartbeatResponse r;
  EXPECT_TRUE(c->Heartbeat(h, &r).ok());
}

TEST(CoordinatorHistory, HeartbeatsFeedRunAggregatesUntilTheRunEnds) {
  prometheus::Registry registry;
  RunAggregates agg(registry);
  CoordinatorOptions o;
  o.state_dir = StateDir("aggregates");
  o.aggregates = &agg;
  auto c = Coordinator::Open(o);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  v1::SubmitRunRequest s;
  s.set_spec_yaml(kSpec);
  v1::Run run;
  ASSERT_TRUE((*c)->SubmitRun(s, &run).ok());
  const std::map<std::string, std::string> of_run{{"run_id", run.id()}};
  EXPECT_EQ(SeriesValue(Exposition(registry), "forge_run_state",
                        {{"run_id", run.id()}, {"state", "pending"}}),
            1.0);

  // Two GPUs of different kinds: each rank's MFU is against its own device's peak.
  Join(c->get(), "w0", 0, "cuda:0", "NVIDIA H100 80GB HBM3");
  const v1::Assignment a1 = Join(c->get(), "w1", 1, "cuda:0", "NVIDIA A100-SXM4-80GB");
  const v1::Assignment a0 = Join(c->get(), "w0", 0);
  ASSERT_EQ(a0.rank(), 0);
  ASSERT_EQ(a1.rank(), 1);
  // Every rank reports the run's global throughput; rank 1 is the slower one. The MFU a
  // worker sends is not used (the coordinator computes it).
  Beat(c->get(), "w0", a0, v1::TRAINING, 3, 1000.0, 0.2, 0.30);
  Beat(c->get(), "w1", a1, v1::TRAINING, 3, 1000.0, 0.5, 0.40);
  std::string text = Exposition(registry);
  EXPECT_EQ(SeriesValue(text, "forge_run_state", {{"run_id", run.id()}, {"state", "running"}}), 1.0);
  EXPECT_DOUBLE_EQ(SeriesValue(text, "forge_run_tokens_per_second", of_run).value_or(-1), 1000.0);
  auto cfg = ParseRunConfig(kSpec, "spec");
  ASSERT_TRUE(cfg.ok());
  const double flops = TrainFlopsPerToken(cfg->model);
  const double h100 = 500.0 * flops / 989.4e12, a100 = 500.0 * flops / 312.0e12;
  EXPECT_NEAR(SeriesValue(text, "forge_run_mfu_ratio", of_run).value_or(-1), (h100 + a100) / 2,
              1e-9 * a100);
  EXPECT_DOUBLE_EQ(SeriesValue(text, "forge_run_slowest_step_seconds", of_run).value_or(-1), 0.5);
  EXPECT_EQ(SeriesValue(text, "forge_run_slowest_rank", of_run), 1.0);
  EXPECT_EQ(SeriesValue(text, "forge_run_ranks_reporting", of_run), 2.0);
  EXPECT_EQ(SeriesValue(text, "forge_worker_up", {{"run_id", run.id()}, {"rank", "1"}}), 1.0);

  Beat(c->get(), "w0", a0, v1::DONE_COMPLETED, 10, 1000.0, 0.2, 0.0);
  Beat(c->get(), "w1", a1, v1::DONE_COMPLETED, 10, 1000.0, 0.2, 0.0);
  text = Exposition(registry);
  EXPECT_EQ(SeriesValue(text, "forge_run_state", {{"run_id", run.id()}, {"state", "completed"}}),
            1.0);
  EXPECT_FALSE(SeriesValue(text, "forge_worker_up", of_run).has_value()) << text;
  EXPECT_FALSE(SeriesValue(text, "forge_run_tokens_per_second", of_run).has_value()) << text;
  (*c)->Shutdown();
}

// No peak is known for a CPU worker or a GPU missing from the table: no MFU series rather than
// a 0, whatever the worker sent; metrics.peak_tflops in the spec gives one to any device.
TEST(CoordinatorHistory, MfuOnlyWhereAPeakIsKnown) {
  for (const bool peak_in_spec : {false, true}) {
    prometheus::Registry registry;
    RunAggregates agg(registry);
    CoordinatorOptions o;
    o.state_dir = StateDir(peak_in_spec ? "mfu_spec_peak" : "mfu_unknown");
    o.aggregates = &agg;
    auto c = Coordinator::Open(o);
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    v1::SubmitRunRequest s;
    s.set_spec_yaml(std::string(kSpec) + (peak_in_spec ? "metrics: {peak_tflops: 100}\n" : ""));
    v1::Run run;
    ASSERT_TRUE((*c)->SubmitRun(s, &run).ok());
    const std::string w0 = peak_in_spec ? "p0" : "u0", w1 = peak_in_spec ? "p1" : "u1";
    Join(c->get(), w0, 0, "cpu", "", w0);
    const v1::Assignment a1 = Join(c->get(), w1, 1, "cuda:0", "NVIDIA Unknown 9000", w0);
    const v1::Assignment a0 = Join(c->get(), w0, 0, "", "", w0);
    ASSERT_EQ(a0.run_id(), run.id());
    Beat(c->get(), w0, a0, v1::TRAINING, 3, 1000.0, 0.2, 0.30);
    Beat(c->get(), w1, a1, v1::TRAINING, 3, 1000.0, 0.2, 0.30);
    const auto mfu = SeriesValue(Exposition(registry), "forge_run_mfu_ratio",
                                 {{"run_id", run.id()}});
    if (!peak_in_spec) {
      EXPECT_FALSE(mfu.has_value());
    } else {
      auto cfg = ParseRunConfig(kSpec, "spec");
      ASSERT_TRUE(cfg.ok());
      EXPECT_NEAR(mfu.value_or(-1), 500.0 * TrainFlopsPerToken(cfg->model) / 100e12, 1e-12);
    }
    (*c)->Shutdown();
  }
}

TEST(CoordinatorHistory, GetRunHistoryReturnsStepsEventsAndMemory) {
  const std::string dir = StateDir("history");
  std::string id;
  {
    CoordinatorOptions o;
    o.state_dir = dir;
    auto c = Coordinator::Open(o);
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    v1::GetRunHistoryRequest unknown;
    unknown.set_run_id("nope-123");
    v1::RunHistory h;
    EXPECT_EQ((*c)->GetRunHistory(unknown, &h).error_code(), grpc::StatusCode::NOT_FOUND);

    v1::SubmitRunRequest s;
    s.set_spec_yaml(kSpec);
    v1::Run run;
    ASSERT_TRUE((*c)->SubmitRun(s, &run).ok());
    id = run.id();
    Join(c->get(), "w0", 0);
    const v1::Assignment a1 = Join(c->get(), "w1", 1);
    const v1::Assignment a0 = Join(c->get(), "w0", 0);
    for (int64_t step = 1; step <= 4; ++step) {
      Beat(c->get(), "w0", a0, v1::TRAINING, step, 100.0 * double(step), 0.1, 0.0,
           int64_t(step) << 20);
      Beat(c->get(), "w1", a1, v1::TRAINING, step, 1.0, 9.0, 0.0, 7);  // rank 1: not stored
    }
    // Steps logged faster than the heartbeat: rank 0 sends the ones in between with the newest.
    v1::HeartbeatRequest hb;
    hb.set_worker_id("w0");
    hb.set_run_id(a0.run_id());
    hb.set_attempt(a0.attempt());
    hb.set_rank(0);
    hb.set_phase(v1::TRAINING);
    for (int64_t step = 5; step <= 7; ++step) {
      v1::StepMetrics* m = step < 7 ? hb.add_earlier_metrics() : hb.mutable_metrics();
      m->set_step(step);
      m->set_val_loss(step % 2 == 0 ? 4.0f : -1.0f);
      m->set_tokens_per_second(100.0 * double(step));
      m->set_gpu_allocated_bytes(step << 20);
      m->set_gpu_reserved_bytes(step << 20);
      m->set_gpu_peak_bytes(step << 21);
    }
    v1::HeartbeatResponse r;
    ASSERT_TRUE((*c)->Heartbeat(hb, &r).ok());
    hb.set_worker_id("w1");  // rank 1's backlog is not the run's history
    hb.set_rank(1);
    hb.mutable_earlier_metrics(0)->set_step(99);
    ASSERT_TRUE((*c)->Heartbeat(hb, &r).ok());
    (*c)->Shutdown();
  }
  // From the store of a restarted coordinator: nothing lives only in memory.
  CoordinatorOptions o;
  o.state_dir = dir;
  auto c = Coordinator::Open(o);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  v1::GetRunHistoryRequest req;
  req.set_run_id(id);
  v1::RunHistory h;
  ASSERT_TRUE((*c)->GetRunHistory(req, &h).ok());
  EXPECT_EQ(h.run().id(), id);
  ASSERT_EQ(h.steps_size(), 7);
  EXPECT_EQ(h.run().step(), 7);
  for (int i = 0; i < 7; ++i) {
    const v1::StepMetrics& m = h.steps(i);
    EXPECT_EQ(m.step(), i + 1);
    EXPECT_DOUBLE_EQ(m.tokens_per_second(), 100.0 * (i + 1));
    EXPECT_EQ(m.gpu_allocated_bytes(), int64_t(i + 1) << 20);
    EXPECT_EQ(m.gpu_reserved_bytes(), int64_t(i + 1) << 20);
    EXPECT_EQ(m.gpu_peak_bytes(), int64_t(i + 1) << 21);
    EXPECT_FLOAT_EQ(m.val_loss(), (i + 1) % 2 == 0 ? 4.0f : -1.0f);
  }
  ASSERT_GE(h.events_size(), 2);  // submitted (PENDING), placed (RUNNING)
  EXPECT_EQ(h.events(0).state(), v1::PENDING);
  EXPECT_EQ(h.events(h.events_size() - 1).state(), v1::RUNNING);
  EXPECT_EQ(h.checkpoints_size(), 0);
  (*c)->Shutdown();
}

}  // namespace
}  // namespace forge::coord
