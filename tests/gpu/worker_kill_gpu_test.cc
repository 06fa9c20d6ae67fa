// kill -9 of a forge-worker training on the CUDA backend, with real processes on loopback: a
// forge-coordinator, and one forge-worker kept running by a relaunch loop (what a Kubernetes
// pod restart or the Slurm job's step relaunch does for it). Mid-run the worker is killed; the
// coordinator notices the lost heartbeats and puts the run in RESTARTING, the relaunched
// worker joins, and the run resumes from its last committed checkpoint and finishes. Its final
// weights must equal, bit for bit, those of the same spec run through without a failure (the
// CUDA step is deterministic, and a resume is exact: trainer_resume_gpu_test). One GPU.
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "../integration/checkpoint_weights.h"
#include "../integration/control_plane_harness.h"
#include "gpu_test_util.h"
#include "worker/checkpoint/checkpoint.h"

namespace forge {
namespace {

using test::Contains;
using test::ControlPlane;
using test::ReadFile;
using test::ShellResult;
using test::WaitFor;

// The tiny CUDA model on the control plane's counting dataset (vocabulary 256).
std::string WriteCudaSpec(const ControlPlane& cp, const std::string& name, int64_t steps) {
  const std::string path = cp.dir() + "/" + name + ".yaml";
  std::ofstream(path) << "name: " << name << "\n"
                      << "seed: 11\n"
                      << "model: {n_layer: 2, d_model: 128, n_head: 4, ffn: 256, vocab: 256,"
                         " seq_len: 64}\n"
                      << "data: {dataset_dir: " << cp.dir() << "/data}\n"
                      << "schedule: {total_steps: " << steps << ", warmup_steps: 2}\n"
                      << "batch: {micro_batch: 4, global_batch: 8}\n"
                      << "checkpoint: {every_steps: 4, keep_last: 50}\n"
                      << "eval: {every_steps: 0, batches: 2}\n"
                      << "train: {backend: cuda, log_every: 1, workers: 1, max_restarts: 2}\n";
  return path;
}

// The relaunch loop's current forge-worker (a child of the loop's shell), or -1.
pid_t WorkerOf(pid_t loop) {
  const ShellResult kids = test::Shell("pgrep -P " + std::to_string(loop));
  std::istringstream in(kids.output);
  for (long k; in >> k;)
    if (ReadFile("/proc/" + std::to_string(k) + "/comm") == "forge-worker\n") return pid_t(k);
  return -1;
}

struct KillOnExit {
  test::Process* p;
  ~KillOnExit() { p->Kill(); }
};

TEST(GpuWorkerKill, KilledCudaWorkerIsRelaunchedAndTheRunEndsBitwiseAsUnfailed) {
  FORGE_SKIP_WITHOUT_GPU();
  ControlPlane cp("gpu_worker_kill");
  cp.StartCoordinator(/*heartbeat_timeout_ms=*/1500);
  const std::string worker = test::Bin("forge-worker") + " --coordinator " + cp.address() +
                             " --join-secret-file " + cp.dir() + "/secret --throttle-ms 100";
  test::Process loop = test::Spawn(
      "sh -c 'while true; do " + worker + "; echo forge-worker exited $?; sleep 1; done'",
      cp.dir() + "/workers.log");
  KillOnExit cleanup{&loop};

  constexpr int64_t kSteps = 40;
  const std::string spec = WriteCudaSpec(cp, "gk", kSteps);
  ShellResult sub = cp.Ctl("submit " + spec);
  ASSERT_EQ(sub.exit_code, 0) << sub.output;
  const std::string run = ControlPlane::RunId(sub);
  ASSERT_TRUE(WaitFor(120, [&] {
    return std::atoll(cp.StatusField(run, "latest_checkpoint_step").c_str()) >= 8;
  })) << cp.Ctl("status " + run).output << ReadFile(loop.log);
  ASSERT_LT(cp.Step(run), kSteps) << "the run ended before the worker could be killed";
  const pid_t victim = WorkerOf(loop.pid);
  ASSERT_GT(victim, 0) << ReadFile(loop.log);
  const int64_t killed_at = cp.Step(run);
  const auto t_kill = std::chrono::steady_clock::now();
  ASSERT_EQ(::kill(victim, SIGKILL), 0);

  // The run's restart is counted (RESTARTING may be too brief to poll: the relaunched worker
  // can be waiting already when the coordinator declares the old one lost).
  ASSERT_TRUE(WaitFor(30, [&] { return cp.StatusField(run, "restarts") == "1"; }))
      << cp.Ctl("status " + run).output;
  // Recovered: the relaunched worker trains past the step the first one was killed at.
  ASSERT_TRUE(WaitFor(120, [&] { return cp.Step(run) > killed_at; }))
      << cp.Ctl("status " + run).output << ReadFile(loop.log);
  const double recover_s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t_kill).count();
  ShellResult watch = cp.Ctl("watch --history " + run);
  EXPECT_EQ(watch.exit_code, 0) << watch.output;
  EXPECT_TRUE(Contains(watch.output, "[RESTARTING]")) << watch.output;
  EXPECT_TRUE(Contains(watch.output, "[COMPLETED]")) << watch.output;
  EXPECT_EQ(cp.StatusField(run, "restarts"), "1");
  EXPECT_NE(WorkerOf(loop.pid), victim);
  EXPECT_TRUE(Contains(ReadFile(loop.log), "forge-worker exited 137")) << ReadFile(loop.log);
  std::smatch m;
  ASSERT_TRUE(
      std::regex_search(watch.output, m, std::regex("attempt 2 placed .* from step_([0-9]+)")))
      << watch.output;
  std::printf("[ killed at step %ld, attempt 2 resumed from step_%s, training again %.1f s after "
              "the kill ]\n[ event log ]\n%s",
              long(killed_at), m[1].str().c_str(), recover_s, watch.output.c_str());

  // The unfailed reference: the same spec (another name) through the same coordinator, on the
  // relaunched worker, with no failure.
  const std::string ref_spec = WriteCudaSpec(cp, "gk-ref", kSteps);
  ShellResult ref_sub = cp.Ctl("submit " + ref_spec);
  ASSERT_EQ(ref_sub.exit_code, 0) << ref_sub.output;
  const std::string ref = ControlPlane::RunId(ref_sub);
  ShellResult ref_watch = cp.Ctl("watch " + ref);
  ASSERT_EQ(ref_watch.exit_code, 0) << ref_watch.output << ReadFile(loop.log);
  EXPECT_EQ(cp.StatusField(ref, "restarts"), "0");

  const std::string last = "/checkpoints/step_" + std::to_string(kSteps);
  const std::vector<float> got = test::CheckpointWeights(cp.StatusField(run, "run_dir") + last);
  const std::vector<float> want = test::CheckpointWeights(cp.StatusField(ref, "run_dir") + last);
  ASSERT_FALSE(got.empty());
  ASSERT_EQ(got.size(), want.size());
  EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0)
      << "the recovered run's final weights differ from the unfailed run's";
}

}  // namespace
}  // namespace forge
