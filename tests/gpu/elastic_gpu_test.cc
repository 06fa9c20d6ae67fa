// Losing a GPU worker of a two-GPU run, with real processes on loopback and NCCL between the
// GPUs (skipped where fewer than two are visible):
//   - forge-coordinator and one forge-worker per GPU, each kept running by a relaunch loop (a
//     pod restart, the Slurm step relaunch): the run asks for 2 workers with train.min_workers
//     1; GPU 1's worker is killed (kill -9) and held back, so past train.elastic_grace_s the
//     coordinator resumes the last committed checkpoint on GPU 0 alone (the same global batch:
//     2 accumulation steps instead of 1); when GPU 1's worker joins again, the run saves a
//     checkpoint, grows back to 2 from it and finishes.
//   - `forge train` alone on two GPUs, which supervises its own forge-workers: one is killed
//     mid-run; the launcher starts the pair again and the run resumes from its last checkpoint.
//
// What equality holds: each segment equals, bit for bit, an unfailed `forge train` resumed
// from the same checkpoint on the same number of GPUs (the CUDA step is deterministic, NCCL's
// sums are fixed for a given world, and a checkpoint carries the data cursor). World 1 and
// world 2 are not bitwise one another (two accumulation steps against a two-rank sum).
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "../integration/checkpoint_weights.h"
#include "../integration/control_plane_harness.h"
#include "gpu_test_util.h"
#include "nccl_test_util.h"
#include "worker/checkpoint/checkpoint.h"

namespace forge {
namespace {

using test::Contains;
using test::ControlPlane;
using test::ReadFile;
using test::SameBits;
using test::ShellResult;
using test::WaitFor;

constexpr int64_t kSteps = 60;

// The tiny CUDA model on the control plane's counting dataset, fsdp over `workers` GPUs.
std::string WriteSpec(const std::string& dir, const std::string& name, const std::string& train) {
  const std::string path = dir + "/" + name + ".yaml";
  std::ofstream(path) << "name: " << name << "\n"
                      << "seed: 11\n"
                      << "model: {n_layer: 2, d_model: 128, n_head: 4, ffn: 256, vocab: 256,"
                         " seq_len: 64}\n"
                      << "data: {dataset_dir: " << dir << "/data}\n"
                      << "schedule: {total_steps: " << kSteps << ", warmup_steps: 2}\n"
                      << "batch: {micro_batch: 4, global_batch: 8}\n"
                      << "parallel: {mode: fsdp}\n"
                      << "checkpoint: {every_steps: 4, keep_last: 100}\n"
                      << "eval: {every_steps: 0, batches: 2}\n"
                      << "train: {backend: cuda, log_every: 1, " << train << "}\n";
  return path;
}

// `forge train SPEC` resumed from `ckpts`/step_`from` up to step `to` on the GPUs listed in
// `gpus`, in `ref_dir`: whether its step_`to` holds the weights of `ckpts`/step_`to`.
::testing::AssertionResult SegmentMatchesResume(const std::string& spec, const std::string& ckpts,
                                                int64_t from, int64_t to,
                                                const std::string& gpus,
                                                const std::string& ref_dir) {
  ShellResult r = test::Shell("CUDA_VISIBLE_DEVICES=" + gpus + " timeout 170 " +
                              test::Bin("forge") + " train " + spec + " --run-dir " + ref_dir +
                              " --resume " + ckpts + "/step_" + std::to_string(from) +
                              " --steps " + std::to_string(to));
  if (r.exit_code != 0)
    return ::testing::AssertionFailure() << "the reference run failed: " << r.output;
  const std::string end = "/step_" + std::to_string(to);
  if (!SameBits(test::CheckpointWeights(ckpts + end),
                test::CheckpointWeights(ref_dir + "/checkpoints" + end)))
    return ::testing::AssertionFailure() << ckpts << end << " differs from a run on GPUs " << gpus
                                         << " resumed at step_" << from;
  return ::testing::AssertionSuccess();
}

// The forge-worker that relaunch loop `loop` runs now (a child of its shell), or -1.
pid_t WorkerOf(pid_t loop) {
  const std::vector<pid_t> w = test::ProcessesUnder(loop, "forge-worker");
  return w.empty() ? -1 : w.front();
}

struct KillOnExit {
  std::vector<test::Process*> p;
  ~KillOnExit() {
    for (test::Process* q : p) q->Kill();
  }
};

double SecondsSince(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

TEST(GpuElastic, TwoGpuRunGoesOnWithOneAndGrowsBack) {
  FORGE_SKIP_WITHOUT_GPU();
  if (NcclVisibleDevices() < 2) GTEST_SKIP() << "needs 2 GPUs";
  ControlPlane cp("gpu_elastic");
  cp.StartCoordinator(/*heartbeat_timeout_ms=*/1500);
  // One relaunch loop per GPU; while gpuN.hold exists, GPU N's loop starts no worker.
  test::Process loops[2];
  for (int g = 0; g < 2; ++g) {
    const std::string hold = cp.dir() + "/gpu" + std::to_string(g) + ".hold";
    const std::string worker = test::Bin("forge-worker") + " --coordinator " + cp.address() +
                               " --join-secret-file " + cp.dir() + "/secret --device cuda:" +
                               std::to_string(g) + " --throttle-ms 100";
    loops[g] = test::Spawn("sh -c 'while true; do while [ -e " + hold + " ]; do sleep 0.2; "
                           "done; " + worker + "; echo forge-worker exited $?; sleep 1; done'",
                           cp.dir() + "/gpu" + std::to_string(g) + ".log");
  }
  KillOnExit cleanup{{&loops[0], &loops[1]}};

  const std::string spec = WriteSpec(cp.dir(), "ge", "workers: 2, min_workers: 1, "
                                     "elastic_grace_s: 2, max_restarts: 3");
  ShellResult sub = cp.Ctl("submit " + spec);
  ASSERT_EQ(sub.exit_code, 0) << sub.output;
  const std::string run = ControlPlane::RunId(sub);
  auto latest = [&] { return std::atoll(cp.StatusField(run, "latest_checkpoint_step").c_str()); };
  ASSERT_TRUE(WaitFor(120, [&] { return latest() >= 8; }))
      << cp.Ctl("status " + run).output << ReadFile(loops[0].log) << ReadFile(loops[1].log);
  ASSERT_LT(cp.Step(run), kSteps - 24) << "the run got too far before the worker could be killed";

  // GPU 1's worker is lost and does not come back for a while.
  std::ofstream(cp.dir() + "/gpu1.hold") << "held\n";
  const pid_t victim = WorkerOf(loops[1].pid);
  ASSERT_GT(victim, 0) << ReadFile(loops[1].log);
  const int64_t killed_at = cp.Step(run);
  const auto t_kill = std::chrono::steady_clock::now();
  ASSERT_EQ(::kill(victim, SIGKILL), 0);
  ASSERT_TRUE(WaitFor(60, [&] {
    return cp.StatusField(run, "workers") == "1" && cp.Step(run) > killed_at;
  })) << cp.Ctl("watch --history " + run).output << ReadFile(loops[0].log);
  const double recover_s = SecondsSince(t_kill);
  const int64_t shrunk_from = latest();
  ASSERT_TRUE(WaitFor(60, [&] { return latest() >= shrunk_from + 8; }))
      << cp.Ctl("watch --history " + run).output;
  ASSERT_LT(cp.Step(run), kSteps - 8) << "the run got too far before GPU 1 came back";

  // GPU 1 is back: the run grows back at a checkpoint and finishes on both.
  std::filesystem::remove(cp.dir() + "/gpu1.hold");
  ShellResult watch = cp.Ctl("watch --history " + run);
  EXPECT_EQ(watch.exit_code, 0) << watch.output;
  ASSERT_TRUE(Contains(watch.output, "[COMPLETED]")) << watch.output;
  EXPECT_EQ(cp.StatusField(run, "restarts"), "1") << watch.output;  // the grow is not one
  EXPECT_EQ(cp.StatusField(run, "workers"), "2");
  const test::ShrinkAndGrow e = test::ExpectShrinkAndGrow(watch.output, 2, 1, 8, 4);
  const int64_t k = e.shrunk_from, m = e.grew_from;
  ASSERT_GE(k, 0);
  ASSERT_GT(m, k);
  std::printf("[ GPU 1 killed at step %ld; world 2 -> 1 from step_%ld, training again %.1f s "
              "after the kill; grew back 1 -> 2 from step_%ld ]\n[ event log ]\n%s",
              long(killed_at), long(k), recover_s, long(m), watch.output.c_str());

  const std::string ckpts = cp.StatusField(run, "run_dir") + "/checkpoints";
  auto manifest = ReadManifest(ckpts + "/step_" + std::to_string(m));
  ASSERT_TRUE(manifest.ok()) << manifest.status().ToString();
  EXPECT_EQ(manifest->world_size, 1);
  // The workers are idle now (the run completed); the references train on the same GPUs.
  EXPECT_TRUE(SegmentMatchesResume(spec, ckpts, k, m, "0", cp.dir() + "/reference1"));
  EXPECT_TRUE(SegmentMatchesResume(spec, ckpts, m, kSteps, "0,1", cp.dir() + "/reference2"));
}

TEST(GpuElastic, LocalLauncherRelaunchesAKilledGpuWorker) {
  FORGE_SKIP_WITHOUT_GPU();
  if (NcclVisibleDevices() < 2) GTEST_SKIP() << "needs 2 GPUs";
  ControlPlane cp("gpu_local_relaunch");  // for its directory and dataset only
  const std::string spec = WriteSpec(cp.dir(), "gl", "workers: 2, max_restarts: 2");
  const std::string run_dir = cp.dir() + "/run";
  test::Process forge = test::Spawn(
      "env CUDA_VISIBLE_DEVICES=0,1 FORGE_WORKER_ARGS='--throttle-ms 100' timeout --foreground "
      "170 " + test::Bin("forge") + " train " + spec + " --run-dir " + run_dir,
      cp.dir() + "/forge.log");
  KillOnExit cleanup{{&forge}};
  ASSERT_TRUE(WaitFor(120, [&] { return test::LatestCommitted(run_dir) >= 8; }))
      << ReadFile(forge.log);
  ASSERT_LT(test::LatestCommitted(run_dir), kSteps - 24)
      << "the run got too far before the worker could be killed";
  const std::vector<pid_t> ranks = test::ProcessesUnder(forge.pid, "forge-worker");
  ASSERT_EQ(ranks.size(), 2u) << test::Shell("ps -ef").output;
  const auto t_kill = std::chrono::steady_clock::now();
  ASSERT_EQ(::kill(ranks.back(), SIGKILL), 0);
  std::smatch resumed;
  const std::regex again("attempt 2: rank 0 of 2, resuming \\S*/step_([0-9]+)");
  std::string so_far;
  ASSERT_TRUE(WaitFor(60, [&] {
    so_far = ReadFile(forge.log);
    return std::regex_search(so_far, resumed, again);
  })) << so_far;
  const double recover_s = SecondsSince(t_kill);
  const int rc = forge.Wait(150);
  const std::string log = ReadFile(forge.log);
  ASSERT_EQ(rc, 0) << log;
  EXPECT_TRUE(Contains(log, "launched 2 worker(s) again")) << log;
  EXPECT_TRUE(Contains(log, "forge: done: 60 steps")) << log;
  const int64_t k = std::atoll(resumed[1].str().c_str());
  std::printf("[ local launcher: a GPU worker killed, the pair relaunched and resumed from "
              "step_%ld %.1f s after the kill ]\n", long(k), recover_s);
  EXPECT_TRUE(SegmentMatchesResume(spec, run_dir + "/checkpoints", k, kSteps, "0,1",
                                   cp.dir() + "/reference"));
}

}  // namespace
}  // namespace forge
