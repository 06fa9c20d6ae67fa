// Early warnings with real processes (forge-coordinator, forge-worker ranks under mpirun,
// forgectl, /metrics over HTTP):
//   - stragglers: one rank of a 2-worker CPU run is stopped and continued in short bursts
//     (SIGSTOP 200 ms / SIGCONT 50 ms): the coordinator names that rank in an event and in `forgectl
//     status`, and forge_straggler{run_id,rank} reads 1 for it and 0 for the other;
//   - loss spikes: the dataset holds a window of sequences counting down where the rest counts
//     up; the steps that read it are skipped, and the third in a row rolls the run back to its
//     last checkpoint, leaving that window out: events, status, metrics.jsonl and the final
//     checkpoint's data cursor say so.
#include <gtest/gtest.h>
#include <signal.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>
#include <thread>
#include <vector>

#include "../common/http_get.h"
#include "../unit/metrics_test_util.h"
#include "control_plane_harness.h"
#include "worker/checkpoint/checkpoint.h"
#include "worker/data/dataset.h"
#include "worker/data/shard.h"

namespace forge {
namespace {

using test::Contains;
using test::ControlPlane;
using test::Process;
using test::ReadFile;
using test::ShellResult;
using test::WaitFor;

// The forge-worker processes below `root` (through mpirun), with their MPI ranks.
std::map<int, pid_t> WorkerRanks(pid_t root) {
  std::map<int, pid_t> out;
  for (const pid_t k : test::ProcessesUnder(root, "forge-worker")) {
    std::string env = ReadFile("/proc/" + std::to_string(k) + "/environ");
    for (char& c : env)
      if (c == '\0') c = '\n';
    std::istringstream lines(env);
    for (std::string line; std::getline(lines, line);)
      if (line.rfind("OMPI_COMM_WORLD_RANK=", 0) == 0)
        out[std::atoi(line.c_str() + std::strlen("OMPI_COMM_WORLD_RANK="))] = k;
  }
  return out;
}

std::string Spec(const ControlPlane& cp, const std::string& name, const std::string& model,
                 const std::string& batch, const std::string& data_dir, int64_t steps,
                 const std::string& train_keys, const std::string& more) {
  const std::string path = cp.dir() + "/" + name + ".yaml";
  std::ofstream(path) << "name: " << name << "\n"
                      << "seed: 3\n"
                      << "model: {" << model << "}\n"
                      << "data: {dataset_dir: " << data_dir << ", epoch_shuffle: 0}\n"
                      << "optimizer: {lr: 0.01, grad_clip: 1.0}\n"
                      << "schedule: {total_steps: " << steps << ", warmup_steps: 2}\n"
                      << "batch: {" << batch << "}\n"
                      << "eval: {every_steps: 0, batches: 1}\n"
                      << "train: {backend: cpu, workers: 2, max_restarts: 0, " << train_keys
                      << "}\n"
                      << more;
  return path;
}

TEST(EarlyWarnings, StoppedAndContinuedRankIsReportedAsAStraggler) {
  REQUIRE_MPIRUN();
  ControlPlane cp("straggler");
  cp.StartCoordinatorServingMetrics(20000);
  const int port = cp.metrics_port();
  ASSERT_GT(port, 0);
  Process& group = cp.StartWorkers(2, /*throttle_ms=*/0);
  // Steps of several milliseconds, mostly compute (512 tokens a rank against 2 layers of width
  // 32), so a stop mostly lands outside the collectives; a record every 20 steps spans several
  // stop bursts.
  const std::string spec =
      Spec(cp, "sg", "n_layer: 2, d_model: 32, n_head: 4, ffn: 64, vocab: 256, seq_len: 64",
           "micro_batch: 8, global_batch: 16", cp.dir() + "/data", 1000000,
           "log_every: 20, straggler_threshold: 2, straggler_reports: 3",
           "checkpoint: {every_steps: 0}\n");
  ShellResult sub = cp.Ctl("submit " + spec);
  ASSERT_EQ(sub.exit_code, 0) << sub.output;
  const std::string run = ControlPlane::RunId(sub);
  ASSERT_TRUE(WaitFor(60, [&] { return cp.Step(run) >= 40; })) << cp.Ctl("status " + run).output;
  std::map<int, pid_t> ranks = WorkerRanks(group.pid);
  ASSERT_EQ(ranks.size(), 2u);
  ASSERT_EQ(ranks.count(1), 1u);
  const std::string body0 = test::HttpGet(port, "/metrics").body;
  EXPECT_EQ(test::SeriesValue(body0, "forge_straggler", {{"run_id", run}, {"rank", "1"}}), 0.0)
      << body0;

  // Rank 1 runs a fifth of the time: stopped 200 ms, continued 50 ms (the hang timeout, 300 s,
  // never sees it stuck; its busy time per step grows, rank 0's wait in collectives with it).
  std::atomic<bool> bursting{true};
  const pid_t victim = ranks[1];
  std::thread bursts([&] {
    while (bursting.load()) {
      ::kill(victim, SIGSTOP);
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      ::kill(victim, SIGCONT);
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  });
  std::string status;
  const bool named = WaitFor(40, [&] {
    status = cp.Ctl("status " + run).output;
    return Contains(status, "warning    rank 1 is straggling");
  });
  const std::string body = test::HttpGet(port, "/metrics").body;
  bursting.store(false);
  bursts.join();
  ::kill(victim, SIGCONT);
  ASSERT_TRUE(named) << status;
  EXPECT_TRUE(Contains(status, "x the median of the other 1 rank(s)")) << status;
  EXPECT_FALSE(Contains(status, "rank 0 is straggling")) << status;
  EXPECT_EQ(test::SeriesValue(body, "forge_straggler", {{"run_id", run}, {"rank", "1"}}), 1.0)
      << body;
  EXPECT_EQ(test::SeriesValue(body, "forge_straggler", {{"run_id", run}, {"rank", "0"}}), 0.0)
      << body;

  // Undisturbed again, the rank recovers; the history has both events, naming the worker.
  ASSERT_TRUE(WaitFor(40, [&] {
    return !Contains(cp.Ctl("status " + run).output, "is straggling");
  })) << cp.Ctl("status " + run).output;
  ShellResult stop = cp.Ctl("stop --now " + run);
  EXPECT_EQ(stop.exit_code, 0) << stop.output;
  ShellResult history = cp.Ctl("watch --history " + run);
  EXPECT_TRUE(Contains(history.output, "straggler: rank 1 is straggling: busy ")) << history.output;
  EXPECT_TRUE(Contains(history.output, "(worker ")) << history.output;
  EXPECT_TRUE(Contains(history.output, "straggler recovered: rank 1")) << history.output;
}

// Counting-up tokens (as the control plane's dataset) with tokens [from, to) counting down.
void WriteDatasetWithReversedWindow(const std::string& dir, int64_t from, int64_t to) {
  std::filesystem::create_directories(dir);
  DatasetManifest m;
  m.vocab_size = 256;
  m.eot_token = 255;
  for (int s = 0; s < 2; ++s) {
    std::vector<int32_t> tokens(s == 0 ? 40000 : 4000);
    uint32_t x = 91u + s;
    for (size_t i = 0; i < tokens.size(); ++i) {
      x = x * 1664525u + 1013904223u;
      const bool down = s == 0 && int64_t(i) >= from && int64_t(i) < to;
      const bool jump = i == 0 || (!down && (x >> 28) == 0);
      tokens[i] = jump ? int32_t((x >> 8) % 256) : (tokens[i - 1] + (down ? 255 : 1)) % 256;
    }
    const std::string name = s == 0 ? "train_0.tok" : "val_0.tok";
    auto info = WriteShard(dir + "/" + name, tokens, TokenDtype::kUint16);
    ASSERT_TRUE(info.ok()) << info.status().ToString();
    m.splits[s].shards.push_back({name, int64_t(tokens.size()), info->crc32c});
    m.splits[s].tokens = int64_t(tokens.size());
  }
  ASSERT_TRUE(WriteDatasetManifest(dir, m).ok());
}

TEST(EarlyWarnings, LossSpikesAreSkippedAndThreeInARowRollBack) {
  REQUIRE_MPIRUN();
  ControlPlane cp("spikes");
  // Sequences of 17 tokens start every 16: step s (global batch 8) reads sequences
  // 8(s-1) .. 8s-1. Steps 36-38 read sequences 280-303: tokens 4480 .. 4864.
  WriteDatasetWithReversedWindow(cp.dir() + "/spiky", 280 * 16 + 1, 304 * 16 + 1);
  cp.StartCoordinator();
  cp.StartWorkers(2, /*throttle_ms=*/40);
  const std::string spec = Spec(
      cp, "sp", "n_layer: 2, d_model: 32, n_head: 4, ffn: 64, vocab: 256, seq_len: 16",
      "micro_batch: 4, global_batch: 8", cp.dir() + "/spiky", 60,
      "log_every: 1, spike_sigma: 6, spike_window: 8, spike_max_in_row: 3",
      "checkpoint: {every_steps: 5, keep_last: 50}\n");
  ShellResult sub = cp.Ctl("submit " + spec);
  ASSERT_EQ(sub.exit_code, 0) << sub.output;
  const std::string run = ControlPlane::RunId(sub);
  std::string status;
  EXPECT_TRUE(WaitFor(90, [&] {
    status = cp.Ctl("status " + run).output;
    return Contains(status, "warning    3 loss spikes in a row");
  })) << status;
  EXPECT_TRUE(Contains(status, "(steps 36-38): rolled back to checkpoint step_35, leaving out "
                               "data cursors [280, 304)"))
      << status;

  ShellResult watch = cp.Ctl("watch --history " + run);
  EXPECT_EQ(watch.exit_code, 0) << watch.output;
  EXPECT_TRUE(Contains(watch.output, "[COMPLETED]")) << watch.output;
  for (const char* e : {"loss spike at step 36 (data cursor 280)", "update skipped, 1 in a row",
                        "loss spike at step 37 (data cursor 288)",
                        "loss spike at step 38 (data cursor 296)", "3 in a row",
                        "3 loss spikes in a row (steps 36-38): rolled back to checkpoint step_35"})
    EXPECT_TRUE(Contains(watch.output, e)) << e << "\n" << watch.output;
  for (int step = 9; step <= 60; ++step) {  // no other step is a spike
    if (step >= 36 && step <= 38) continue;
    EXPECT_FALSE(Contains(watch.output, "loss spike at step " + std::to_string(step) + " "))
        << step << "\n" << watch.output;
  }

  // The run's own records and its last checkpoint: 24 sequences left out.
  const std::string run_dir = cp.StatusField(run, "run_dir");
  const std::string metrics = ReadFile(run_dir + "/metrics.jsonl");
  EXPECT_TRUE(Contains(metrics, "\"rollback_to_step\":35,\"skip_from\":280,\"skip_to\":304"))
      << metrics;
  auto last = LoadFullCheckpoint(run_dir + "/checkpoints/step_60");
  ASSERT_TRUE(last.ok()) << last.status().ToString();
  EXPECT_EQ(last->trainer.data_cursor, 60 * 8 + 24);
}

}  // namespace
}  // namespace forge
